"""What the koordlet publishes to the API server (NodeMetric status)."""

"""koord-manager: NodeSLO and node resources from the slo-controller-config and NodeMetrics."""

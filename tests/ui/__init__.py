"""Tests of what operators look at: the ``/debug/ui`` page in a real headless Chromium, the
``koordlet status`` command against a real daemon, and the Grafana dashboard's queries against
the metric names a live koordlet exports."""

"""Tests of the shared contract (``apis/``) against the documented behaviour of Kubernetes,
Koordinator and the kernel."""

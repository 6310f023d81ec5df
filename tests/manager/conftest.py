"""The fake API server's fixtures for the controller tests, and its polling helper."""

from __future__ import annotations

from tests.kubefake.fixtures import eventually, kube_api, kube_client, kubeconfig

__all__ = ["eventually", "kube_api", "kube_client", "kubeconfig"]

"""The fake API server's fixtures for the scheduler's informer tests."""

from __future__ import annotations

from tests.kubefake.fixtures import kube_api, kube_client, kubeconfig

__all__ = ["kube_api", "kube_client", "kubeconfig"]

"""The fake API server's fixtures for the scheduler's informer tests, and ``api``: a
:class:`~tests.scheduler.bindingfake.BindingFakeApiServer` (pods' ``binding`` subresource too)
with a client, for the standalone scheduler's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubeclient.client import KubeClient
from tests.kubefake.fixtures import kube_api, kube_client, kubeconfig, write_kubeconfig
from tests.scheduler.bindingfake import BindingFakeApiServer

__all__ = ["api", "kube_api", "kube_client", "kubeconfig"]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[BindingFakeApiServer, KubeClient]]:
    server = BindingFakeApiServer()
    await server.start()
    client = await KubeClient.connect(
        str(write_kubeconfig(tmp_path / "kc", server.url)), request_timeout=5.0
    )
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()

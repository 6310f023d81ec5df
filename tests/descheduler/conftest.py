"""``api``: a :class:`~tests.descheduler.fake.DeschedulerFakeApiServer` with a client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubeclient.client import KubeClient
from tests.descheduler.fake import DeschedulerFakeApiServer
from tests.kubefake.fixtures import write_kubeconfig


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[DeschedulerFakeApiServer, KubeClient]]:
    server = DeschedulerFakeApiServer()
    await server.start()
    client = await KubeClient.connect(
        str(write_kubeconfig(tmp_path / "kc", server.url)), request_timeout=5.0
    )
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()

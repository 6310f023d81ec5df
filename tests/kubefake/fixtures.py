"""pytest fixtures for the fake API server (load with ``pytest_plugins``).

- ``kube_api``: a started :class:`~tests.kubefake.server.FakeApiServer` (stopped afterwards);
- ``kubeconfig``: a kubeconfig file pointing at it (token auth, plain HTTP);
- ``kube_client``: a :class:`~kubeclient.client.KubeClient` loaded from that kubeconfig;
- :func:`eventually`: wait for state of the fake server (or of what talks to it);
- :class:`Clock`: a monotonic clock that moves only when a test moves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from kubeclient.client import KubeClient
from tests.kubefake.server import FakeApiServer


async def eventually(check: Callable[[], bool], *, within: float = 10.0) -> None:
    """Wait until ``check()`` holds, failing after ``within`` seconds. It polls: the conditions
    are state of the fake server and of informers and schedulers, which have no event to wait
    on."""
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - see the docstring
            await asyncio.sleep(0.01)


class Clock:
    """A monotonic clock for leader election tests: ``clock.now += 11`` passes a deadline."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_kubeconfig(path: Path, url: str, token: str = "fake-token") -> Path:
    """A kubeconfig with one cluster, user and context for ``url``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "koordlet", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "koordlet"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture
async def kube_api() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def kubeconfig(kube_api: FakeApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", kube_api.url)


@pytest.fixture
async def kube_client(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(str(kubeconfig), request_timeout=5.0)
    try:
        yield client
    finally:
        await client.close()

"""The fake API server's fixtures for every test under tests/kube/, and an informer runner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from koordlet.statesinformer.kube import KubeStatesSource
from kubeclient.informer import Informer
from tests.kubefake.fixtures import eventually, kube_api, kube_client, kubeconfig

__all__ = ["eventually", "kube_api", "kube_client", "kubeconfig", "running", "running_source"]


@asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    """Run an informer's loop for the body of a ``with``; cancelled and awaited afterwards."""
    task: asyncio.Task[None] = asyncio.create_task(informer.run(), name=f"informer-{informer.name}")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def running_source(source: KubeStatesSource) -> AsyncIterator[None]:
    task = asyncio.create_task(source.run(), name="kube-states")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

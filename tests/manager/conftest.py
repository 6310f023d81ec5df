"""The fake API server's fixtures for the controller tests, and a polling helper."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.kubefake.fixtures import kube_api, kube_client, kubeconfig

__all__ = ["eventually", "kube_api", "kube_client", "kubeconfig"]


async def eventually(check: Callable[[], bool], *, within: float = 10.0) -> None:
    """Wait until ``check()`` holds, failing after ``within`` seconds. It polls: the conditions
    are state of the fake server, which has no event to wait on."""
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - see the docstring
            await asyncio.sleep(0.01)

"""Fixtures shared by every test.

- ``host_root``: an empty folder for a fake host, on tmpfs when it can be.
- ``fake_host``: a :class:`~tests.fakehost.FakeHost` for each cgroup layout, v1 and v2 by the
  systemd and cgroupfs drivers (test ids ``v1-systemd`` …).
- An async test that leaves asyncio tasks running fails; the tasks are cancelled first.
- ``project_image``: the project's container image, built once per session
  (tests/projectimage.py); the tests that use it are ``slow``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests import projectimage
from tests.fakehost import FakeHost

LAYOUTS = [(v, d) for v in CgroupVersion for d in CgroupDriver]
"""Every (version, driver) pair a node can have."""
_SHM = Path("/dev/shm")


@pytest.fixture
def host_root(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder for a fake host tree. It lives on /dev/shm (tmpfs) when writable, where a
    tree of thousands of cgroup files builds some 30 times faster than on a disk; else under
    ``tmp_path``. Removed afterwards."""
    if not (_SHM.is_dir() and os.access(_SHM, os.W_OK)):
        yield tmp_path / "host"
        return
    root = Path(tempfile.mkdtemp(prefix="kpytest-", dir=_SHM))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=LAYOUTS, ids=[f"{v}-{d}" for v, d in LAYOUTS])
def fake_host(request: pytest.FixtureRequest, host_root: Path) -> FakeHost:
    """A fake node (4 CPUs, 1 NUMA node) for each cgroup version and driver."""
    version, driver = request.param
    return FakeHost(host_root, version, driver)


@pytest.fixture(autouse=True)
def _fail_on_leftover_tasks(request: pytest.FixtureRequest) -> None:
    """Arm the leftover-task check for async tests; sync tests get no event loop."""
    if inspect.iscoroutinefunction(getattr(request.node, "obj", None)):
        request.getfixturevalue("_leftover_task_check")


@pytest.fixture
async def _leftover_task_check() -> AsyncIterator[None]:
    # Set up before, so torn down after, the test's own fixtures: what is still running then
    # was left behind by the test or by a fixture that does not clean up.
    yield
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if not leftover:
        return
    for task in leftover:
        task.cancel()
    await asyncio.gather(*leftover, return_exceptions=True)
    names = ", ".join(sorted(t.get_name() for t in leftover))
    pytest.fail(f"the test left {len(leftover)} asyncio task(s) running: {names}")


@pytest.fixture(scope="session")
def project_image(tmp_path_factory: pytest.TempPathFactory) -> projectimage.Built:
    """packaging/image.py's archive (or ``KOORDPY_IMAGE``'s); skips where it cannot be built."""
    given = projectimage.given()
    if given is not None:
        return given
    why = projectimage.why_not()
    if why is not None:
        pytest.skip(f"no project image: {why}")
    return projectimage.build(tmp_path_factory.mktemp("image"))

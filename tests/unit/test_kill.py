"""Emptying a cgroup (koordlet.executor.kill): on the fake tree with an injected signaller, and
for real on this machine's cgroup v1 hierarchy with processes this test starts."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet.errors import InvalidValueError
from koordlet.executor.kill import Signaller, kill_cgroup, subtree_pids
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.paths import HostPaths
from tests.fakehost import FakeHost

UID = "0f6d3c1e-1111-4222-8333-444455556666"


class FakeSignaller(Signaller):
    """Pins pids as numbers and "kills" a pid by removing it from every fake cgroup.procs."""

    def __init__(self, top: str, *, on_pin: dict[int, str] | None = None) -> None:
        self.top = top
        self.killed: list[int] = []
        self.pinned: list[int] = []
        self.released = 0
        self.on_pin = on_pin or {}

    def pin(self, pid: int) -> int | None:
        self.pinned.append(pid)
        action = self.on_pin.pop(pid, None)
        if action == "exited":
            self._remove(pid)
            return None
        if action == "left":  # the process moved out of the cgroup after our first read
            self._remove(pid)
        return pid

    def kill(self, pidfd: int) -> bool:
        self.killed.append(pidfd)
        self._remove(pidfd)
        return True

    def release(self, pidfd: int) -> None:
        self.released += 1

    def _remove(self, pid: int) -> None:
        for folder, _dirs, files in os.walk(self.top):
            if "cgroup.procs" in files:
                path = Path(folder, "cgroup.procs")
                pids = [p for p in path.read_text().split() if p != str(pid)]
                path.write_text("".join(f"{p}\n" for p in pids))


def _pod(fake: FakeHost) -> tuple[str, list[str]]:
    return fake.add_pod(
        UID, KubeQOS.BESTEFFORT, [("containerd", "a" * 64), ("containerd", "b" * 64)]
    )


def _no_sleep(_: float) -> None:
    return None


@pytest.mark.parametrize("driver", list(CgroupDriver))
def test_v2_writes_cgroup_kill_and_waits_until_the_subtree_is_unpopulated(
    host_root: Path, driver: CgroupDriver
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, driver)
    pod, _ = _pod(fake)
    fake.write("cpu", pod, "cgroup.kill", "0")
    fake.write("cpu", pod, "cgroup.events", "populated 0\nfrozen 0")
    result = kill_cgroup(fake.layout, pod, signaller=FakeSignaller("/nonexistent"))
    assert fake.read("cpu", pod, "cgroup.kill").strip() == "1"
    assert (result.method, result.emptied, result.signalled) == ("cgroup.kill", True, 0)


def test_v2_reports_a_subtree_still_populated_at_the_deadline(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    pod, [c1, _] = _pod(fake)
    fake.write("cpu", pod, "cgroup.kill", "0")
    fake.write("cpu", pod, "cgroup.events", "populated 1\nfrozen 0")
    fake.write("cpu", c1, "cgroup.procs", "4242")
    ticks = iter(range(100))
    result = kill_cgroup(
        fake.layout, pod, deadline=3, clock=lambda: float(next(ticks)), sleep=_no_sleep
    )
    assert not result.emptied
    assert result.remaining == (4242,)


def test_v2_without_cgroup_kill_signals_every_process_of_the_subtree(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.CGROUPFS)
    pod, [c1, c2] = _pod(fake)
    fake.write("cpu", c1, "cgroup.procs", "101\n102")
    fake.write("cpu", c2, "cgroup.procs", "103")
    sig = FakeSignaller(fake.layout.abs_dir("cpu", pod))
    result = kill_cgroup(fake.layout, pod, signaller=sig, sleep=_no_sleep)
    assert sorted(sig.killed) == [101, 102, 103]
    assert (result.method, result.emptied, result.signalled) == ("sigkill", True, 3)
    assert sig.released == 3


def test_v1_freezes_the_subtree_before_killing_and_thaws_it_after(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    pod, [c1, _] = _pod(fake)
    os.makedirs(fake.layout.abs_dir("freezer", pod))
    fake.write("freezer", pod, "freezer.state", "THAWED")
    fake.write("freezer", pod, "cgroup.procs", "")
    os.makedirs(fake.layout.abs_dir("freezer", c1))
    fake.write("freezer", c1, "cgroup.procs", "201\n202")
    states: list[str] = []

    class Recording(FakeSignaller):
        def kill(self, pidfd: int) -> bool:
            states.append(fake.read("freezer", pod, "freezer.state").strip())
            return super().kill(pidfd)

    sig = Recording(fake.layout.abs_dir("freezer", pod))
    result = kill_cgroup(fake.layout, pod, signaller=sig, sleep=_no_sleep)
    assert result.method == "sigkill+freezer"
    assert result.emptied
    assert states == ["FROZEN", "FROZEN"]
    assert fake.read("freezer", pod, "freezer.state").strip() == "THAWED"


def test_a_pid_that_left_the_cgroup_between_the_two_reads_is_never_signalled(
    host_root: Path,
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.SYSTEMD)
    pod, [c1, _] = _pod(fake)
    fake.write("memory", c1, "cgroup.procs", "301\n302\n303")
    sig = FakeSignaller(fake.layout.abs_dir("memory", pod), on_pin={302: "left", 303: "exited"})
    result = kill_cgroup(fake.layout, pod, signaller=sig, use_freezer=False, sleep=_no_sleep)
    assert sig.killed == [301]
    assert result.emptied


def test_the_koordlet_itself_is_never_signalled_even_inside_the_cgroup(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    pod, [c1, _] = _pod(fake)
    fake.write("memory", c1, "cgroup.procs", f"{os.getpid()}\n1\n401")
    sig = FakeSignaller(fake.layout.abs_dir("memory", pod))
    result = kill_cgroup(fake.layout, pod, signaller=sig, sleep=_no_sleep)
    assert sig.killed == [401]
    assert result.emptied


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_a_cgroup_that_no_longer_exists_is_reported_gone(
    host_root: Path, version: CgroupVersion
) -> None:
    fake = FakeHost(host_root, version, CgroupDriver.CGROUPFS)
    result = kill_cgroup(fake.layout, fake.layout.pod_dir(KubeQOS.BESTEFFORT, UID))
    assert result.gone
    assert result.emptied


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_the_root_the_kubepods_root_and_the_qos_folders_are_refused(
    host_root: Path, version: CgroupVersion
) -> None:
    fake = FakeHost(host_root, version, CgroupDriver.SYSTEMD)
    protected = ["", "/", ".", "../x", fake.layout.kube_root, fake.layout.kube_root + "/"]
    protected += [fake.layout.qos_dir(q) for q in KubeQOS]
    for rel in protected:
        with pytest.raises(InvalidValueError):
            kill_cgroup(fake.layout, rel, signaller=FakeSignaller("/nonexistent"))


# Real cgroup v1 -------------------------------------------------------------------------------

REAL = HostPaths()
_REAL_CONTROLLERS = ("memory", "freezer")


@pytest.fixture
def real_cgroup() -> Iterator[tuple[CgroupLayout, str]]:
    if os.geteuid() != 0 or not all(
        os.path.isfile(REAL.cgroup(c, "tasks")) for c in _REAL_CONTROLLERS
    ):
        pytest.skip("needs root and the cgroup v1 memory and freezer hierarchies")
    top = f"kpytest-{secrets.token_hex(4)}"
    layout = CgroupLayout(REAL, CgroupVersion.V1, CgroupDriver.CGROUPFS, f"{top}/kubepods")
    rel = f"{top}/victim"
    for c in _REAL_CONTROLLERS:
        os.makedirs(REAL.cgroup(c, rel, "child"))
    try:
        yield layout, rel
    finally:
        remove_test_cgroups(top, _REAL_CONTROLLERS)


def remove_test_cgroups(top: str, controllers: tuple[str, ...]) -> None:
    """Thaw, SIGKILL what is left in our own test cgroups (only processes this test started can
    be there), then remove the folders, deepest first."""
    state = REAL.cgroup("freezer", top, "victim", "freezer.state")
    if os.path.exists(state):
        with open(state, "w") as f:
            f.write("THAWED")
    for c in controllers:
        for pid in subtree_pids(REAL.cgroup(c, top)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for c in controllers:
        base = REAL.cgroup(c, top)
        folders = sorted((f for f, _, _ in os.walk(base)), key=len, reverse=True)
        for folder in folders:
            for _ in range(100):
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


_FORKER = """
import os, sys, time
for path in sys.argv[1:]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
for _ in range(3):
    if os.fork() == 0:
        while True:
            time.sleep(0.01)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.realcgroup
def test_every_process_of_a_real_v1_cgroup_dies_and_an_outsider_survives(
    real_cgroup: tuple[CgroupLayout, str],
) -> None:
    layout, rel = real_cgroup
    procs = [REAL.cgroup(c, rel, "child", "cgroup.procs") for c in _REAL_CONTROLLERS]

    inside = subprocess.Popen([sys.executable, "-c", _FORKER, *procs], stdout=subprocess.PIPE)
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert inside.stdout is not None
        assert inside.stdout.readline().strip() == b"ready"
        members = subtree_pids(REAL.cgroup("memory", rel))
        assert len(members) == 4
        assert inside.pid in members
        result = kill_cgroup(layout, rel)
        assert result.emptied
        assert result.method == "sigkill+freezer"
        assert result.signalled >= 4
        assert inside.wait(timeout=10) == -signal.SIGKILL
        assert subtree_pids(REAL.cgroup("memory", rel)) == set()
        assert outside.poll() is None
    finally:
        for p in (inside, outside):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()

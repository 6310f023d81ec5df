"""perf_event_open for real on this machine: cgroup mode with software events, and the hardware
events that this machine (no PMU) refuses.

The perf_event v1 hierarchy is not mounted here; :func:`bench.cpi.perf_event_root` mounts it in
a private temporary folder for the test and unmounts it afterwards (an existing mount would be
used as it is). Container cgroups live below a unique ``kpytest-bench-<hex>`` prefix and are
always killed and removed, children first (:func:`bench.cpi.container_cgroups`). Software
events (task-clock, cpu-clock) stand in for cycles and instructions: the same system calls, cgroup
mode, groups and read layout, with counts that can be checked (task-clock is nanoseconds run).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Iterator

import pytest

from bench.cpi import Containers, container_cgroups, perf_event_root
from koordlet.collectors import cpi
from koordlet.collectors.runner import TickState
from koordlet.metriccache import series as s
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system import oserrors, perf

SOFTWARE = (perf.TASK_CLOCK, perf.CPU_CLOCK)
BUSY = "while :; do :; done"


def _perf_event_controller_exists() -> bool:
    with open("/proc/cgroups") as f:
        return any(line.split()[0] == "perf_event" for line in f if not line.startswith("#"))


pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for cgroups and CPU-wide events"),
    pytest.mark.skipif(
        not _perf_event_controller_exists(), reason="kernel without the perf_event controller"
    ),
]


@pytest.fixture
def root() -> Iterator[str]:
    """A cgroup root whose ``perf_event`` folder is the perf_event v1 hierarchy."""
    try:
        context = perf_event_root()
        mounted = context.__enter__()
    except OSError as err:
        pytest.skip(f"cannot mount the perf_event hierarchy here: {err}")
    try:
        yield mounted
    finally:
        context.__exit__(None, None, None)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


DEADLINE = 60.0
"""Seconds a wait for the kernel may take before the test fails; only a hung machine gets near."""


def until(what: str, done: Callable[[], bool]) -> None:
    """Poll ``done()`` until true; fail naming ``what`` after :data:`DEADLINE` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, f"not within {DEADLINE:g}s: {what}"
        time.sleep(0.01)


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rmdir_unless_busy(path: str) -> bool:
    """Remove the cgroup folder; False while the kernel still counts a task in it (EBUSY)."""
    try:
        os.rmdir(path)
    except OSError as err:
        if err.errno != errno.EBUSY:
            raise
        return False
    return True


def entity(made: Containers, index: int) -> str:
    pod = sorted(made.snapshot.pods.values(), key=lambda p: p.name)[index]
    return s.container_entity(pod.uid, pod.containers[0].id)


def test_task_clock_of_one_busy_loop_advances_about_a_second_per_second_over_all_cpus(
    root: str,
) -> None:
    with container_cgroups(root, 1, BUSY) as made:
        cgroup = made.dirs[-1]  # the container's folder
        cpus = cpi.online_cpus_reader(made.host)()
        counters = perf.CgroupCounters.open(perf.SyscallOpener(), cgroup, cpus, SOFTWARE)
        try:
            counters.start()
            t0 = time.monotonic_ns()
            time.sleep(1.0)
            totals = counters.read()
            elapsed = time.monotonic_ns() - t0
        finally:
            counters.close()

    assert counters.fd_count == 0
    assert totals is not None
    ratio = totals.values["task-clock"] / elapsed
    assert 0.5 < ratio < 1.05, f"one busy loop ran {ratio:.2f} s a second"
    assert totals.time_running == totals.time_enabled  # software events never multiplex


def test_the_collector_samples_a_busy_container_and_not_an_idle_one(root: str) -> None:
    with container_cgroups(root, 1, BUSY) as busy, container_cgroups(root, 1, None) as idle:
        snap = WorkloadSnapshot(pods={**busy.snapshot.pods, **idle.snapshot.pods}, generation=1)
        collector = cpi.CPICollector(busy.host, period=10.0, window=1.0, events=SOFTWARE)
        t0 = time.monotonic()
        opening = collector.collect(TickState(100.0, snap))
        time.sleep(1.0)
        done = collector.collect(TickState(101.0, snap))
        elapsed = time.monotonic() - t0

    got = {(smp.key.metric, smp.key.entity): smp.value for smp in done.samples}
    assert opening.unsupported == {}
    assert set(got) == {
        (s.CONTAINER_CPI_CYCLES, entity(busy, 0)),
        (s.CONTAINER_CPI_INSTRUCTIONS, entity(busy, 0)),
    }
    assert 0.5 < got[(s.CONTAINER_CPI_CYCLES, entity(busy, 0))] / (elapsed * 1e9) < 1.05
    assert collector.fd_count == 0


def test_hundreds_of_windows_keep_the_descriptor_count_flat(root: str) -> None:
    with container_cgroups(root, 3) as made:
        collector = cpi.CPICollector(made.host, period=2.0, window=1.0, events=SOFTWARE)
        before = fd_count()
        held = []
        for window in range(300):
            collector.collect(TickState(2.0 * window, made.snapshot))
            held.append(collector.fd_count)
            collector.collect(TickState(2.0 * window + 1, made.snapshot))
            assert collector.fd_count == 0
        after = fd_count()

    cpus = len(cpi.online_cpus_reader(made.host)())
    assert set(held) == {3 * cpus * 2}
    assert after == before


def test_a_container_removed_mid_window_is_read_and_closed_without_a_failure(
    root: str, caplog: pytest.LogCaptureFixture
) -> None:
    with container_cgroups(root, 2, BUSY) as made:
        collector = cpi.CPICollector(made.host, period=10.0, window=1.0, events=SOFTWARE)
        before = fd_count()
        collector.collect(TickState(0.0, made.snapshot))
        # The survivor must have run while its counters were open, or the window has no data for
        # it (``totals is None``, no sample): on a busy machine a few milliseconds are not
        # enough, so wait until the scheduler gave it CPU time, whatever that takes.
        survivor = made.procs[0]
        started = cpu_ticks(survivor.pid)
        victim = made.procs.pop()  # the second container's process, and below its folder
        victim.kill()
        victim.wait(timeout=10)
        leaf = made.dirs.pop()
        until("the killed task left its cgroup", lambda: rmdir_unless_busy(leaf))
        until("the survivor ran", lambda: cpu_ticks(survivor.pid) > started)
        assert not os.path.exists(leaf)
        with caplog.at_level(logging.WARNING):
            done = collector.collect(TickState(1.0, made.snapshot))
        after = fd_count()

    assert caplog.records == []
    assert entity(made, 0) in {smp.key.entity for smp in done.samples}
    assert after == before


def test_hardware_counters_absent_here_are_unsupported_with_the_errno(root: str) -> None:
    support = perf.probe_events((perf.CYCLES, perf.INSTRUCTIONS))
    if support.supported:
        pytest.skip("this host has hardware counters")

    with container_cgroups(root, 1) as made:
        collector = cpi.CPICollector(made.host)
        result = collector.collect(TickState(0.0, made.snapshot))

    assert support.errno in {errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV}
    assert oserrors.errno_name(support.errno) in support.reason
    assert result.unsupported == {cpi.SOURCE: support.reason}
    assert collector.fd_count == 0

"""The pressure event source on this machine's kernel: real memcg v1 thresholds (charged by a
shell writing to tmpfs from inside a test cgroup), real PSI trigger files, and the refusals this
host really gives. Every cgroup is ``kpytest-<hex>``, removed in a ``finally``."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop

from koordlet.errors import InvalidValueError, KoordletError
from koordlet.events.source import EventKind, PressureEvent, PressureEventSource
from koordlet.system.paths import HostPaths
from koordlet.system.psi import has_cap_sys_resource

PATHS = HostPaths()
MEMORY_ROOT = PATHS.cgroup("memory")
UNIFIED_ROOT = PATHS.cgroup("unified")
HAS_PSI = os.path.exists(PATHS.proc("pressure", "cpu"))
MiB = 1 << 20
WAIT = 20.0
"""Generous bound (s) for a notification the kernel owes us; no test asserts on latency."""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups")
needs_memcg_v1 = pytest.mark.skipif(
    not os.path.isfile(os.path.join(MEMORY_ROOT, "cgroup.event_control")),
    reason="needs the cgroup v1 memory hierarchy",
)
needs_cgroup2 = pytest.mark.skipif(
    not os.path.isfile(os.path.join(UNIFIED_ROOT, "cgroup.procs")),
    reason="needs a cgroup2 mount at /sys/fs/cgroup/unified",
)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@dataclass
class Made:
    """A cgroup the test made and the tmpfs files charged to it."""

    path: str
    charged: list[str] = field(default_factory=list)

    async def charge(self, nbytes: int) -> None:
        """Charge ``nbytes`` of tmpfs pages to this cgroup: a shell moves itself in and writes
        them to /dev/shm; they stay charged until the file is removed."""
        shm = f"/dev/shm/kpytest-{secrets.token_hex(6)}"
        self.charged.append(shm)
        script = f"echo $$ > {self.path}/cgroup.procs && exec head -c {nbytes} /dev/zero > {shm}"
        proc = await asyncio.create_subprocess_exec("sh", "-c", script)
        assert await proc.wait() == 0

    def remove(self) -> None:
        for shm in self.charged:
            if os.path.exists(shm):
                os.unlink(shm)
        for _ in range(50):  # the shell leaves its cgroup asynchronously
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
            else:
                return
        raise AssertionError(f"could not remove {self.path}")


def _cgroup(root: str) -> Iterator[Made]:
    made = Made(os.path.join(root, f"kpytest-{secrets.token_hex(6)}"))
    os.mkdir(made.path)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def memcg() -> Iterator[Made]:
    yield from _cgroup(MEMORY_ROOT)


@pytest.fixture
def v2cgroup() -> Iterator[Made]:
    yield from _cgroup(UNIFIED_ROOT)


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# Memcg thresholds -------------------------------------------------------------------------------


@needs_root
@needs_memcg_v1
async def test_a_memcg_threshold_crossing_reaches_a_queue_subscriber(memcg: Made) -> None:
    source = PressureEventSource()
    queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
    source.subscribe(queue)
    try:
        assert await source.watch_memcg_threshold(memcg.path, 4 * MiB, "be-mem")
        before = time.monotonic()
        await memcg.charge(8 * MiB)
        event = await asyncio.wait_for(queue.get(), WAIT)
    finally:
        source.close()

    assert (event.name, event.kind) == ("be-mem", EventKind.MEMCG_THRESHOLD)
    assert event.count >= 1
    assert before <= event.time <= time.monotonic()


@needs_root
@needs_memcg_v1
async def test_callbacks_run_on_the_loop_and_a_failing_one_does_not_starve_the_others(
    memcg: Made, caplog: pytest.LogCaptureFixture
) -> None:
    source = PressureEventSource()
    seen: list[tuple[str, int]] = []
    got = asyncio.Event()

    def broken(event: PressureEvent) -> None:
        raise RuntimeError("subscriber bug")

    def recorder(event: PressureEvent) -> None:
        seen.append((event.name, threading.get_ident()))
        got.set()

    source.subscribe(broken)
    source.subscribe(recorder)
    try:
        await source.watch_memcg_threshold(memcg.path, 4 * MiB, "m")
        await memcg.charge(8 * MiB)
        await asyncio.wait_for(got.wait(), WAIT)
    finally:
        source.close()

    assert seen[0] == ("m", threading.get_ident())
    assert "subscriber bug" in caplog.text


@needs_root
@needs_memcg_v1
async def test_a_full_queue_drops_the_event_and_counts_it_while_others_still_get_it(
    memcg: Made,
) -> None:
    source = PressureEventSource()
    full: asyncio.Queue[PressureEvent] = asyncio.Queue(maxsize=1)
    full.put_nowait(PressureEvent("old", EventKind.PSI, 0.0))
    roomy: asyncio.Queue[PressureEvent] = asyncio.Queue()
    source.subscribe(full)
    source.subscribe(roomy)
    try:
        await source.watch_memcg_threshold(memcg.path, 4 * MiB, "m")
        await memcg.charge(8 * MiB)
        await asyncio.wait_for(roomy.get(), WAIT)
    finally:
        source.close()

    assert source.dropped >= 1
    assert full.get_nowait().name == "old"


@needs_root
@needs_memcg_v1
async def test_an_unsubscribed_queue_receives_nothing(memcg: Made) -> None:
    source = PressureEventSource()
    gone: asyncio.Queue[PressureEvent] = asyncio.Queue()
    kept: asyncio.Queue[PressureEvent] = asyncio.Queue()
    unsubscribe = source.subscribe(gone)
    source.subscribe(kept)
    unsubscribe()
    try:
        await source.watch_memcg_threshold(memcg.path, 4 * MiB, "m")
        await memcg.charge(8 * MiB)
        await asyncio.wait_for(kept.get(), WAIT)
    finally:
        source.close()

    assert gone.empty()


@needs_root
@needs_memcg_v1
async def test_removing_the_cgroup_drops_the_watch_without_an_event(memcg: Made) -> None:
    source = PressureEventSource()
    queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
    source.subscribe(queue)
    fds = open_fds()
    try:
        await source.watch_memcg_threshold(memcg.path, 64 * MiB, "m")
        os.rmdir(memcg.path)  # the kernel signals the eventfd once more on removal
        await until(lambda: "m" not in source.watches, "the watch to be dropped")
    finally:
        source.close()

    assert queue.empty()
    assert open_fds() <= fds


@needs_root
@needs_memcg_v1
async def test_unwatch_closes_the_eventfd(memcg: Made) -> None:
    source = PressureEventSource()
    fds = open_fds()
    try:
        await source.watch_memcg_threshold(memcg.path, 64 * MiB, "m")
        assert len(open_fds() - fds) == 1
        assert source.unwatch("m")
        assert not source.unwatch("m")
    finally:
        source.close()

    assert open_fds() <= fds
    assert source.watches == ()


async def test_a_watch_on_a_cgroup_that_is_gone_is_not_armed_and_not_unsupported() -> None:
    source = PressureEventSource()
    try:
        armed = await source.watch_memcg_threshold(
            os.path.join(MEMORY_ROOT, f"kpytest-{secrets.token_hex(6)}"), MiB, "m"
        )
    finally:
        source.close()

    assert not armed
    assert source.unsupported == {}


# PSI triggers -----------------------------------------------------------------------------------


@needs_root
@needs_cgroup2
async def test_a_trigger_whose_cgroup_is_removed_is_dropped_instead_of_spinning(
    v2cgroup: Made,
) -> None:
    source = PressureEventSource()
    queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
    source.subscribe(queue)
    fds = open_fds()
    try:
        path = os.path.join(v2cgroup.path, "cpu.pressure")
        assert await source.watch_psi(path, "some", 150_000, 2_000_000, "pod-cpu")
        assert len(open_fds() - fds) == 2  # the trigger file and its epoll set
        os.rmdir(v2cgroup.path)  # the trigger now polls EPOLLERR | EPOLLPRI for ever
        await until(lambda: "pod-cpu" not in source.watches, "the trigger to be dropped")
    finally:
        source.close()

    assert queue.empty()
    assert open_fds() <= fds


async def test_an_unprivileged_sub_two_second_window_is_unsupported_with_the_reason_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    privileged = has_cap_sys_resource(PATHS)
    if privileged is not False or not HAS_PSI:
        pytest.skip("needs PSI and a process without CAP_SYS_RESOURCE, as on this host")
    source = PressureEventSource(privileged=privileged)
    caplog.set_level(logging.DEBUG, logger="koordlet.events.source")
    try:
        for _ in range(2):
            armed = await source.watch_psi(
                PATHS.proc("pressure", "cpu"), "some", 10_000, 1_000_000, "node-cpu"
            )
            assert not armed
    finally:
        source.close()

    reason = source.unsupported["node-cpu"]
    assert "EINVAL" in reason
    assert "CAP_SYS_RESOURCE" in reason
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


async def test_a_kernel_without_psi_makes_a_trigger_unsupported(tmp_path: Path) -> None:
    source = PressureEventSource()
    try:
        path = str(tmp_path / "pressure" / "memory")
        assert not await source.watch_psi(path, "some", 150_000, 2_000_000, "node-mem")
    finally:
        source.close()

    assert "CONFIG_PSI" in source.unsupported["node-mem"]


@pytest.mark.skipif(not HAS_PSI, reason="needs PSI")
async def test_names_are_unique_and_impossible_triggers_are_refused() -> None:
    source = PressureEventSource()
    cpu = PATHS.proc("pressure", "cpu")
    try:
        assert await source.watch_psi(cpu, "some", 150_000, 2_000_000, "a")
        with pytest.raises(InvalidValueError, match="already exists"):
            await source.watch_psi(cpu, "some", 150_000, 2_000_000, "a")
        with pytest.raises(InvalidValueError):
            await source.watch_psi(cpu, "some", 150_000, 20_000_000, "b")
        with pytest.raises(InvalidValueError):
            await source.watch_memcg_threshold(MEMORY_ROOT, 0, "c")
    finally:
        source.close()


# Lifecycle --------------------------------------------------------------------------------------


@needs_root
@needs_memcg_v1
async def test_close_disarms_every_watch_and_a_closed_source_refuses_new_ones(
    memcg: Made,
) -> None:
    source = PressureEventSource()
    fds = open_fds()
    await source.watch_memcg_threshold(memcg.path, 64 * MiB, "m")
    if HAS_PSI:
        await source.watch_psi(PATHS.proc("pressure", "cpu"), "some", 150_000, 2_000_000, "p")

    source.close()
    source.close()

    assert open_fds() <= fds
    assert source.watches == ()
    with pytest.raises(KoordletError, match="closed"):
        await source.watch_memcg_threshold(memcg.path, MiB, "again")
    with pytest.raises(KoordletError, match="closed"):
        source.subscribe(asyncio.Queue())


@needs_root
@needs_memcg_v1
async def test_a_watch_cancelled_while_arming_leaks_no_fd(memcg: Made) -> None:
    gate = threading.Event()
    executor = ThreadPoolExecutor(max_workers=1)
    source = PressureEventSource(executor=executor)
    fds = open_fds()
    try:
        executor.submit(gate.wait)  # the one worker is busy: arming waits in the queue
        task = asyncio.create_task(source.watch_memcg_threshold(memcg.path, MiB, "m"))
        await asyncio.sleep(0)
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.get_running_loop().run_in_executor(executor, lambda: None)
        await until(lambda: open_fds() <= fds, "the eventfd armed after the cancel to close")
    finally:
        gate.set()
        source.close()
        executor.shutdown(wait=True)

    assert source.watches == ()


@needs_root
@needs_memcg_v1
def test_the_source_runs_on_uvloop(memcg: Made) -> None:
    async def scenario() -> PressureEvent:
        source = PressureEventSource()
        queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
        source.subscribe(queue)
        try:
            assert await source.watch_memcg_threshold(memcg.path, 4 * MiB, "m")
            await memcg.charge(8 * MiB)
            return await asyncio.wait_for(queue.get(), WAIT)
        finally:
            source.close()

    loop = uvloop.new_event_loop()
    try:
        event = loop.run_until_complete(scenario())
    finally:
        loop.close()

    assert event.kind is EventKind.MEMCG_THRESHOLD

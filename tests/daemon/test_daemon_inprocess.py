"""``koordlet.daemon.run`` in the test's event loop, on a fake host tree with a short tick."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import yaml

from apis.extension import KubeQOS
from koordlet import daemon
from koordlet.collectors.framework import CollectorContext, CollectorSpec, CollectResult, Tick
from koordlet.collectors.table import COLLECTORS
from koordlet.config import (
    CgroupConfig,
    CgroupDriverSetting,
    CgroupVersionSetting,
    CollectConfig,
    KoordletConfig,
    QoSConfig,
    RuntimeHooksConfig,
    ServerConfig,
)
from koordlet.errors import ConfigError
from koordlet.executor.originals import OriginalsJournal
from koordlet.features import FeatureGates
from koordlet.qos.framework import (
    Strategy,
    StrategyContext,
    StrategyFactory,
    StrategyReport,
    StrategySpec,
)
from koordlet.qos.table import STRATEGIES
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.knobs import CPU_SHARES
from tests.daemon import Samples, free_port, one_value, parse_samples
from tests.fakehost import FakeHost, container_id

INTERVAL = 0.1
"""Seconds between collect ticks in these tests."""
UID = "7c1e2d3f-aaaa-4bbb-8ccc-000000000001"
GIB = 1024**3


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)


def make_config(
    fake: FakeHost,
    *,
    driver: CgroupDriverSetting | None = None,
    nodeslo: Path | None = None,
    port: int | None = None,
    qos: QoSConfig | None = None,
    runtime_hooks: RuntimeHooksConfig | None = None,
) -> KoordletConfig:
    return KoordletConfig(
        node_name="node-1",
        paths=fake.paths,
        cgroup=CgroupConfig(
            version=cast(CgroupVersionSetting, str(fake.version)),
            driver=driver or cast(CgroupDriverSetting, str(fake.layout.driver)),
        ),
        collect=CollectConfig(res_used_interval=INTERVAL),
        server=ServerConfig(addr=f"127.0.0.1:{port or free_port()}"),
        standalone=True,
        nodeslo_file=None if nodeslo is None else str(nodeslo),
        state_dir=str(fake.root / "state"),  # the audit log goes here, never to /var/lib
        qos=qos or QoSConfig(),
        # no hook server, no NRI plugin: nothing of the host's /var/run (tests/runtimehooks)
        runtime_hooks=runtime_hooks or RuntimeHooksConfig(addr="", nri=False),
    )


@dataclass
class Running:
    """A daemon running in this loop, and an HTTP client for it."""

    task: asyncio.Task[int]
    stop: asyncio.Event
    base: str
    session: aiohttp.ClientSession
    code: int | None = field(default=None)

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as resp:
            return resp.status, await resp.text()

    async def json(self, path: str) -> Any:
        status, text = await self.get(path)
        assert status == 200, text
        return json.loads(text)

    async def samples(self) -> Samples:
        status, text = await self.get("/metrics")
        assert status == 200
        return parse_samples(text)

    async def until(
        self, what: str, check: Callable[[], Awaitable[bool]], within: float = 10.0
    ) -> None:
        """Poll ``check`` until it holds; fail naming ``what`` after ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                while not await check():
                    assert not self.task.done(), f"the daemon ended (code {self.task.result()})"
                    await asyncio.sleep(INTERVAL / 2)
        except TimeoutError:
            pytest.fail(f"no {what} within {within:g}s")


@contextlib.asynccontextmanager
async def running(
    cfg: KoordletConfig,
    *,
    collectors: Sequence[CollectorSpec] = COLLECTORS,
    strategies: Sequence[StrategySpec] | None = None,
    own_process: bool = False,
) -> AsyncIterator[Running]:
    """Start ``daemon.run``, wait for ``/readyz``, and stop it (within 5 s) on the way out."""
    stop = asyncio.Event()
    tables: dict[str, Any] = {"collectors": collectors, "own_process": own_process}
    if strategies is not None:
        tables["strategies"] = strategies
    task = asyncio.create_task(daemon.run(cfg, stop=stop, **tables), name="test-daemon")
    async with aiohttp.ClientSession() as session:
        run = Running(task, stop, f"http://{cfg.server.addr}", session)
        try:

            async def ready() -> bool:
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    return (await run.get("/readyz"))[0] == 200
                return False

            await run.until("ready", ready)
            yield run
        finally:
            stop.set()
            async with asyncio.timeout(daemon.STOP_TIMEOUT):
                run.code = await task
    assert run.code == 0


def row(name: str, factory: StrategyFactory) -> StrategySpec:
    """A strategy table row for a test strategy: no gate, the reconcile interval."""
    return StrategySpec(name, factory, lambda q: q.reconcile_interval, "test")


def daemon_gate_on(strategy: str) -> bool:
    """Whether the strategy's gate is on by Koordinator's defaults (the test config's gates)."""
    gate = next(s.gate for s in STRATEGIES if s.name == strategy)
    return not gate or FeatureGates().enabled(gate)


def stage_events(records: list[logging.LogRecord]) -> list[tuple[str, str]]:
    """``(started|stopped, stage)`` from the daemon's stage log lines, in order."""
    out = []
    for r in records:
        if r.name != "koordlet.daemon":
            continue
        m = re.match(r"stage (?:\d+/\d+ )?(\w+) (started|stopped) in", r.getMessage())
        if m:
            out.append((m.group(2), m.group(1)))
    return out


async def test_stages_start_in_order_serve_ready_and_stop_in_reverse(
    fake: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(make_config(fake)) as run:
        assert await run.get("/readyz") == (200, "ok")
        tasks = (await run.json("/debug/tasks"))["tasks"]
        assert sorted(t["name"] for t in tasks) == sorted(
            [
                "collect",
                "statefiles",  # writes what the state dir refused (test_daemon_state_dir)
                "capabilities",  # re-probes what the host supports (CapabilityWatch)
                *(f"qos/{n}" for n in (s.name for s in STRATEGIES) if daemon_gate_on(n)),
                "runtimehooks-reconciler",  # the default gates enable hooks it applies
            ]
        )

    events = stage_events(caplog.records)
    started = [s for e, s in events if e == "started"]
    stopped = [s for e, s in events if e == "stopped"]
    assert started == list(daemon.STAGES)
    assert stopped == [s for s in reversed(daemon.STAGES) if s in stopped]
    assert {"server", "qos", "collectors", "executor"} <= set(stopped)


async def test_node_and_pod_usage_from_the_fake_tree_are_exported(
    fake_host: FakeHost,
) -> None:
    fake = fake_host
    pod_rel, (ctr_rel,) = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", container_id(1))])
    fake.set_memory(pod_rel, anon=300 << 20, file=100 << 20)
    fake.set_memory(ctr_rel, anon=300 << 20, file=100 << 20)
    mem = fake.meminfo
    expected_node_memory = (mem["MemTotal"] - mem["MemAvailable"]) * 1024

    async with running(make_config(fake)) as run:

        async def exported() -> bool:
            got = await run.samples()
            return one_value(got, "koordlet_pod_used_memory_bytes", pod_uid=UID) is not None

        await run.until("pod memory exported", exported)
        samples = await run.samples()

    assert one_value(samples, "koordlet_node_used_memory_bytes") == expected_node_memory
    assert one_value(samples, "koordlet_pod_used_memory_bytes", pod_uid=UID) == 300 << 20
    assert one_value(samples, "koordlet_pod_used_memory_bytes", pod_uid=UID, qos="BE") is not None


@dataclass
class Boom:
    """A collector whose every step raises."""

    name: str = "boom"
    interval: float = INTERVAL

    def collect(self, tick: Tick) -> CollectResult:
        raise RuntimeError("collector exploded")


async def test_a_collector_that_raises_is_counted_and_does_not_take_the_daemon_down(
    fake: FakeHost,
) -> None:
    def boom(ctx: CollectorContext, interval: float) -> Boom:
        return Boom(interval=interval)

    table = (CollectorSpec("boom", boom, lambda c: c.res_used_interval, "none"), *COLLECTORS)

    async with running(make_config(fake), collectors=table) as run:

        async def counted_twice() -> bool:
            got = await run.samples()
            errors = one_value(
                got, "koordlet_step_errors_total", component="collector", name="boom"
            )
            return errors is not None and errors >= 2

        await run.until("boom's errors counted", counted_twice)
        samples = await run.samples()
        assert await run.get("/healthz") == (200, "ok")
        tasks = (await run.json("/debug/tasks"))["tasks"]
        (collect,) = [t for t in tasks if t["name"] == "collect"]

    assert one_value(samples, "koordlet_node_used_memory_bytes") is not None
    assert one_value(samples, "koordlet_step_errors_total", name="noderesource") in (None, 0.0)
    assert collect["errors"] == 0


async def test_the_series_of_a_removed_pod_are_dropped_at_the_next_tick(fake: FakeHost) -> None:
    pod_rel, (ctr_rel,) = fake.add_pod(UID, KubeQOS.BURSTABLE, [("containerd", container_id(2))])
    fake.set_memory(pod_rel, anon=64 << 20)
    fake.set_memory(ctr_rel, anon=64 << 20)

    async with running(make_config(fake)) as run:

        async def entities() -> set[str]:
            return set((await run.json("/debug/metrics")).get("entities", {}))

        async def pod_series() -> bool:
            return any(e.startswith(("pod/", "container/")) for e in await entities())

        await run.until("pod series stored", pod_series)
        fake.remove_cgroup(pod_rel)

        async def gone() -> bool:
            workloads = await run.json("/debug/workloads")
            return not workloads["pods"] and not await pod_series()

        await run.until("pod and its series gone", gone)


def write_nodeslo(path: Path, apps: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump({"spec": {"hostApplications": apps}}))


async def test_a_nodeslo_file_is_reloaded_on_change_and_a_bad_edit_keeps_the_last_good_one(
    fake: FakeHost, tmp_path: Path
) -> None:
    slo = tmp_path / "nodeslo.yaml"
    write_nodeslo(slo, [{"name": "nginx", "qos": "LS"}])
    fake.add_host_app_cgroup("host-latency-sensitive/nginx")

    async with running(make_config(fake, nodeslo=slo)) as run:
        apps = (await run.json("/debug/workloads"))["host_apps"]
        assert apps == [
            {
                "name": "nginx",
                "qos": "LS",
                "priority_class": "",
                "cgroup_dir": "host-latency-sensitive/nginx",
                "present": True,
            }
        ]

        write_nodeslo(slo, [{"name": "nginx", "qos": "LS"}, {"name": "batch", "qos": "BE"}])

        async def two_apps() -> bool:
            return len((await run.json("/debug/workloads"))["host_apps"]) == 2

        await run.until("edited file reloaded", two_apps)

        write_nodeslo(slo, [{"name": "nginx", "qos": "PLATINUM"}])

        async def error_counted() -> bool:
            got = await run.samples()
            return one_value(got, "koordlet_nodeslo_reload_errors_total") == 1.0

        await run.until("bad reload counted", error_counted)
        names = [a["name"] for a in (await run.json("/debug/workloads"))["host_apps"]]
        assert names == ["nginx", "batch"]


async def test_a_kubepods_tree_created_after_start_is_found_with_its_driver(
    host_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.SYSTEMD)
    fake.remove_cgroup(fake.layout.kube_root)
    caplog.set_level(logging.INFO)

    async with running(make_config(fake, driver="auto")) as run:
        assert (await run.json("/debug/workloads"))["pods"] == []
        pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT)

        async def found() -> bool:
            return bool((await run.json("/debug/workloads"))["pods"])

        await run.until("late pod found", found)
        (pod,) = (await run.json("/debug/workloads"))["pods"]

    assert pod["cgroup_dir"] == pod_rel
    assert pod_rel.startswith("kubepods.slice/kubepods-besteffort.slice/")
    appeared = [r for r in caplog.records if "kubepods root appeared" in r.getMessage()]
    assert len(appeared) == 1


@dataclass
class Counting:
    """A strategy that counts its rounds (and fails when told to)."""

    name: str
    interval: float = INTERVAL
    rounds: int = 0
    fail: bool = False

    async def reconcile(self) -> None:
        self.rounds += 1
        if self.fail:
            raise RuntimeError("strategy failed")


async def test_the_qos_manager_runs_each_strategy_and_counts_its_failures(fake: FakeHost) -> None:
    good, bad = Counting("good"), Counting("bad", fail=True)
    seen: list[StrategyContext] = []

    def factory(strategy: Counting) -> StrategyFactory:
        def build(ctx: StrategyContext, interval: float) -> Strategy:
            seen.append(ctx)
            return strategy

        return build

    table = [row("good", factory(good)), row("bad", factory(bad))]
    async with running(make_config(fake), strategies=table) as run:

        async def both_ran() -> bool:
            return good.rounds >= 3 and bad.rounds >= 3

        await run.until("strategies ran", both_ran)
        samples = await run.samples()
        names = {t["name"] for t in (await run.json("/debug/tasks"))["tasks"]}

    assert names == {
        "collect",
        "statefiles",
        "capabilities",
        "qos/good",
        "qos/bad",
        "runtimehooks-reconciler",
    }
    errors = one_value(samples, "koordlet_step_errors_total", component="qos", name="qos/bad")
    assert errors is not None
    assert errors >= 1
    assert seen[0].host().layout == fake.layout


@dataclass
class SharesWriter:
    """A strategy that sets the BE pod's cpu.shares through the executor and reports it."""

    ctx: StrategyContext
    name: str
    shares: int
    interval: float = INTERVAL
    results: list[Any] = field(default_factory=list)

    async def reconcile(self) -> None:
        pod = next(iter(self.ctx.workloads().pods.values()))
        future = self.ctx.executor.submit(
            CPU_SHARES, pod.cgroup_dir, self.shares, strategy=self.name, reason="test"
        )
        result = await asyncio.wrap_future(future)
        self.results.append(result)
        self.ctx.report(
            self.name,
            StrategyReport({"pod": pod.uid}, f"shares {self.shares}", "dry run" * result.dry_run),
        )


async def test_dry_run_strategies_write_nothing_while_the_audit_log_records_both(
    fake: FakeHost,
) -> None:
    pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT)
    built: dict[str, SharesWriter] = {}

    def factory(name: str, shares: int) -> StrategyFactory:
        def build(ctx: StrategyContext, interval: float) -> Strategy:
            built[name] = SharesWriter(ctx, name, shares)
            return built[name]

        return build

    cfg = make_config(fake, qos=QoSConfig(dry_run_strategies=frozenset({"dry"})))
    table = [row("real", factory("real", 64)), row("dry", factory("dry", 8))]
    async with running(cfg, strategies=table) as run:

        async def both_audited() -> bool:
            entries = (await run.json("/debug/audit"))["entries"]
            return {e["strategy"] for e in entries} == {"real", "dry"}

        await run.until("audit entries of both strategies", both_audited)
        decisions = await run.json("/debug/audit?strategy=dry")
        qos = await run.json("/debug/qos")
        samples = await run.samples()

    shares_file = Path(fake.layout.file("cpu", pod_rel, "cpu.shares"))
    shares = await asyncio.to_thread(shares_file.read_text)
    assert shares.strip() == "64"  # the real one wrote; the dry one never did
    (decision,) = decisions["entries"]
    assert (decision["kind"], decision["dry_run"], decision["new"]) == ("decision", True, "8")
    assert qos["dry_run"] == {"all": False, "strategies": ["dry"]}
    assert qos["strategies"]["dry"]["dry_run"] is True
    assert qos["strategies"]["dry"]["last_round"]["result"] == "dry run"
    assert qos["strategies"]["real"]["last_round"]["decision"] == "shares 64"
    text = await asyncio.to_thread((Path(cfg.audit_dir) / "audit.jsonl").read_text)
    lines = [json.loads(line) for line in text.splitlines()]
    assert {(e["kind"], e["strategy"]) for e in lines} >= {("write", "real"), ("decision", "dry")}
    timed = one_value(
        samples,
        "koordlet_resource_update_duration_milliseconds_count",
        type="cpu.shares",
        status="success",
    )
    assert timed is not None
    assert timed >= 1


async def test_an_unknown_dry_run_strategy_name_is_a_config_error(fake: FakeHost) -> None:
    cfg = make_config(fake, qos=QoSConfig(dry_run_strategies=frozenset({"cpusupress"})))
    table = [row("cpusuppress", lambda ctx, interval: Counting("cpusuppress"))]
    with pytest.raises(ConfigError) as info:
        await asyncio.wait_for(daemon.run(cfg, strategies=table), daemon.STOP_TIMEOUT * 2)
    assert info.value.source == "--qos-dry-run-strategies"


async def test_a_busy_addr_stops_what_started_and_raises_one_line_naming_the_flag(
    fake: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = make_config(fake, port=port)
        async with asyncio.timeout(10):
            with pytest.raises(ConfigError) as info:
                await daemon.run(cfg, stop=asyncio.Event())

    assert str(info.value) == f"--addr: cannot listen on 127.0.0.1:{port}: address already in use"
    assert any("stage server failed to start" in r.getMessage() for r in caplog.records)
    stopped = [s for e, s in stage_events(caplog.records) if e == "stopped"]
    assert stopped[0] == daemon.STAGES[-2]  # the stage before the server
    assert stopped[-1] == "executor"


async def test_a_bad_nodeslo_file_at_start_raises_the_config_error(
    fake: FakeHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    slo = tmp_path / "nodeslo.yaml"
    write_nodeslo(slo, [{"name": "x", "qos": "NOPE"}])

    async with asyncio.timeout(10):
        with pytest.raises(ConfigError) as info:
            await daemon.run(make_config(fake, nodeslo=slo), stop=asyncio.Event())

    assert info.value.source == str(slo)
    assert "hostApplications[0].qos" in str(info.value)
    shown = [r for r in caplog.records if r.levelno > logging.DEBUG]
    assert [r.getMessage() for r in shown if "failed to start" in r.getMessage()] == [
        "stage states failed to start; stopping what started"
    ]
    assert all(r.exc_info is None for r in shown)  # the traceback is logged at debug only
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)


async def test_a_stop_requested_during_start_up_stops_what_started_and_returns_0(
    fake: FakeHost,
) -> None:
    stop = asyncio.Event()
    stop.set()

    async with asyncio.timeout(daemon.STOP_TIMEOUT):
        code = await daemon.run(make_config(fake), stop=stop)

    assert code == daemon.EXIT_OK


async def test_a_stop_while_the_journal_loads_closes_the_audit_log_already_started(
    fake: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The executor stage starts the audit log's thread, then awaits the originals journal: a stop
    # at that moment must not leave the thread behind (it did: its close was registered later).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    release = threading.Event()
    load = OriginalsJournal.load

    def slow_load(journal: OriginalsJournal) -> None:
        loop.call_soon_threadsafe(stop.set)
        release.wait(daemon.STOP_TIMEOUT)  # until run() returned: the stop came mid-load
        load(journal)

    monkeypatch.setattr(OriginalsJournal, "load", slow_load)
    before = set(threading.enumerate())
    try:
        async with asyncio.timeout(daemon.STOP_TIMEOUT):
            code = await daemon.run(make_config(fake), stop=stop)
    finally:
        release.set()
    assert code == daemon.EXIT_OK
    left = [t.name for t in set(threading.enumerate()) - before if t.name == "audit-log"]
    assert left == []


async def test_a_daemon_in_its_own_process_freezes_what_start_up_built_once_ready(
    fake: FakeHost,
) -> None:
    # The entry point says the process is the daemon's alone: once ready, what survived start-up
    # is frozen out of the collector's reach and young collections are rarer. An in-process
    # daemon (every other test here) leaves the test process's collector alone.
    threshold = gc.get_threshold()
    try:
        async with running(make_config(fake)):
            assert gc.get_freeze_count() == 0
            assert gc.get_threshold() == threshold
        async with running(make_config(fake), own_process=True):
            assert gc.get_freeze_count() > 0
            assert gc.get_threshold()[0] == max(threshold[0], daemon.GC_GEN0_THRESHOLD)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)

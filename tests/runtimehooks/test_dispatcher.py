"""The dispatcher's rules: table order, gates, disabled points, fail open, bad input, dry run,
pod-level writes through the executor (on a fake host tree) and their audit."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import KubeQOS
from apis.slo_inforce import NodeSLOInForce
from koordlet.executor.audit import AuditLog
from koordlet.executor.writer import CgroupWriter
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.framework import DispatcherOptions, HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import (
    Change,
    ContainerRequest,
    HookPoint,
    PodMeta,
    PodRequest,
    Resources,
)
from koordlet.runtimehooks.table import HOOKS, Hook, HookContext, HookSpec
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation

UID = "11111111-2222-3333-4444-555555555555"
POD = PodMeta("be-1", "default", UID)
CTX = HookContext(node_slo=NodeSLOInForce)


class Fixed:
    """A hook that returns what it was given, or raises it."""

    def __init__(self, result: Change | Exception | None) -> None:
        self.result = result
        self.calls = 0

    def pod(self, req: PodRequest) -> Change | None:
        return self.container(req)  # type: ignore[arg-type]

    def container(self, req: ContainerRequest) -> Change | None:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def table(**hooks: Hook) -> dict[str, HookSpec]:
    points = frozenset(HookPoint)
    return {
        name: HookSpec(name, f"Gate{name}", name, points, lambda _ctx, h=hook: h)
        for name, hook in hooks.items()
    }


def dispatcher(
    tbl: dict[str, HookSpec],
    *,
    enabled: set[str] | None = None,
    audit: AuditLog | None = None,
    writer: CgroupWriter | None = None,
    **options: object,
) -> tuple[HookDispatcher, CollectorRegistry]:
    registry = CollectorRegistry()
    d = HookDispatcher(
        tbl,
        CTX,
        enabled=(lambda g: True) if enabled is None else (lambda g: g in enabled),
        metrics=HookMetrics(registry, node="node-1"),
        options=DispatcherOptions(**options),  # type: ignore[arg-type]
        audit=audit,
        writer=writer,
    )
    return d, registry


def creq(point: HookPoint = HookPoint.PRE_CREATE_CONTAINER) -> ContainerRequest:
    return ContainerRequest(point, POD, "main", container_id="c1", pod_cgroup_parent="/kp/pod")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_later_hooks_win_on_a_field_both_set_and_every_call_is_timed() -> None:
    first = Fixed(Change(Resources(cpu_shares=10, memory_limit=5), env={"A": "1"}))
    second = Fixed(Change(Resources(cpu_shares=20)))
    d, reg = dispatcher(table(first=first, second=second))
    out = await d.container(creq(), mode="test")
    assert out.change.resources == Resources(cpu_shares=20, memory_limit=5)
    assert out.change.env == {"A": "1"}
    assert out.applied == ("first", "second")
    count = "koordlet_runtime_hook_invoked_duration_milliseconds_count"
    labels = {"node": "node-1", "stage": "PreCreateContainer", "status": "succeeded"}
    assert value(reg, count, hook="first", **labels) == 1
    assert value(reg, count, hook="second", **labels) == 1


async def test_a_disabled_gate_or_point_runs_nothing() -> None:
    hook = Fixed(Change(Resources(cpu_shares=10)))
    d, _ = dispatcher(table(h=hook), enabled=set())
    assert not (await d.container(creq(), mode="test")).change
    d, _ = dispatcher(table(h=hook), disabled_points=frozenset({HookPoint.PRE_CREATE_CONTAINER}))
    assert not (await d.container(creq(), mode="test")).change
    assert hook.calls == 0
    assert HookPoint.PRE_CREATE_CONTAINER not in d.points()


async def test_a_failing_hook_is_left_out_counted_and_audited_and_the_rest_apply() -> None:
    audit = AuditLog(None)
    good = Fixed(Change(Resources(cpu_shares=30)))
    d, reg = dispatcher(table(bad=Fixed(RuntimeError("boom")), good=good), audit=audit)
    out = await d.container(creq(), mode="proxy")
    assert out.change.resources == Resources(cpu_shares=30)
    assert out.failed == ("bad",)
    labels = {"node": "node-1", "hook": "bad", "stage": "PreCreateContainer", "status": "failed"}
    assert value(reg, "koordlet_runtime_hook_invoked_duration_milliseconds_count", **labels) == 1
    strategies = [e.strategy for e in audit.recent()]
    assert "runtimehooks/bad" in strategies


async def test_bad_pod_input_leaves_it_unchanged_with_a_warning_and_a_metric() -> None:
    audit = AuditLog(None)
    d, reg = dispatcher(table(h=Fixed(BadPodInput("InvalidThing", "f", "no"))), audit=audit)
    warned: list[tuple[str, str]] = []

    class Sink:
        def warn(self, pod: PodMeta, reason: str, message: str) -> None:
            warned.append((reason, message))

    d._events = Sink()
    out = await d.container(creq(), mode="nri")
    assert not out.change
    assert warned == [("InvalidThing", "f: no")]
    labels = {"hook": "h", "stage": "PreCreateContainer", "reason": "InvalidThing"}
    assert value(reg, "koordlet_runtime_hook_bad_input_total", **labels) == 1
    assert any("InvalidThing" in e.reason for e in audit.recent())


async def test_dry_run_computes_and_audits_but_changes_nothing() -> None:
    audit = AuditLog(None)
    d, _ = dispatcher(table(h=Fixed(Change(Resources(cpu_shares=64)))), audit=audit, dry_run=True)
    out = await d.container(creq(), mode="proxy")
    assert not out.change
    assert out.proposed.resources.cpu_shares == 64
    [entry] = audit.recent()
    assert entry.dry_run
    assert entry.knob == "cpu_shares"
    assert entry.new == "64"


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)


@pytest.fixture
def writer(fake: FakeHost) -> Iterator[CgroupWriter]:
    audit = AuditLog(None)
    w = CgroupWriter(fake.host, on_change=audit.on_write)
    w.audit = audit  # type: ignore[attr-defined]
    with w:
        yield w


async def test_pod_level_resources_are_written_to_the_pod_cgroup_through_the_executor(
    fake: FakeHost, writer: CgroupWriter
) -> None:
    pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT)
    ann = spec_annotation({"a": batch("1000", "2000", "1Gi")})
    d, _ = dispatcher(dict(HOOKS), writer=writer)
    req = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, BE_LABELS, ann, "/" + pod_rel)
    out = await d.pod(req, mode="proxy")
    assert out.applied == ("BatchResource",)
    assert fake.read("cpu", pod_rel, "cpu.shares").strip() == "1024"
    assert fake.read("cpu", pod_rel, "cpu.cfs_quota_us").strip() == "200000"
    assert fake.read("memory", pod_rel, "memory.limit_in_bytes").strip() == str(1 << 30)
    entries = writer.audit.recent()  # type: ignore[attr-defined]
    assert {e.knob for e in entries} >= {"cpu_shares", "cpu_cfs_quota", "memory_limit"}
    assert all(e.strategy == "runtimehooks/BatchResource" for e in entries)


async def test_a_write_that_hangs_past_the_timeout_fails_open() -> None:
    class Stuck:
        def submit(self, *_a: object, **_k: object) -> concurrent.futures.Future[object]:
            return concurrent.futures.Future()

    ann = spec_annotation({"a": batch("1000", "2000", "1Gi")})
    d, reg = dispatcher(dict(HOOKS), writer=Stuck(), timeout=0.05)  # type: ignore[arg-type]
    req = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, BE_LABELS, ann, "/kubepods/pod1")
    out = await d.pod(req, mode="nri")
    assert not out.change
    assert out.failed == ("framework",)
    labels = {"mode": "nri", "stage": "PreRunPodSandbox", "reason": "timeout"}
    assert value(reg, "koordlet_runtime_hook_fail_open_total", **labels) == 1


@pytest.mark.parametrize(
    ("parent", "rel"),
    [
        ("/kubepods/besteffort/pod1", "kubepods/besteffort/pod1"),
        (
            "kubepods-besteffort-pod1_2.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice",
        ),
        ("kubepods.slice", "kubepods.slice"),
    ],
)
def test_the_kubelets_cgroup_parent_is_a_folder_for_both_drivers(parent: str, rel: str) -> None:
    # systemd.slice(5): a dash in a slice name is a level of the hierarchy
    from koordlet.runtimehooks.cgroupparent import rel_dir

    assert rel_dir(parent) == rel


@pytest.mark.parametrize("parent", ["", "/", "/kubepods/../etc", "a--b.slice"])
def test_a_cgroup_parent_that_is_no_cgroup_is_bad_input(parent: str) -> None:
    from koordlet.runtimehooks.cgroupparent import rel_dir

    with pytest.raises(BadPodInput):
        rel_dir(parent)

"""Resctrl reconcile: Koordinator's CAT mask and MBA arithmetic, and what rounds write on a fake
``/sys/fs/resctrl`` in the kernel's formats (schemata, tasks, info/L3/cbm_mask,
info/MB/min_bandwidth), v1 and v2 cgroups."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import ANNOTATION_POD_RESCTRL as POD_RESCTRL_ANNOTATION
from apis.extension import KubeQOS, QoSClass
from koordlet.executor import CgroupWriter
from koordlet.executor.resctrl import (
    ResctrlWriter,
    format_schemata_line,
    parse_schemata,
    read_alloc_info,
)
from koordlet.executor.writer import WriteResult
from koordlet.metriccache.store import MetricCache
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.podwarnings import PodAnnotationWarnings
from koordlet.qos.resctrl import ResctrlReconcile, cat_l3_mask, mba_value
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from tests.fakehost import FakeHost, container_id
from tests.strategyrig import config, in_force

GOLDEN = Path(__file__).parent.parent / "golden" / "resctrl"


@pytest.mark.parametrize(
    ("cbm", "start", "end", "expected"),
    [
        (0x7FF, 0, 100, 0x7FF),
        (0x7FF, 0, 30, 0xF),  # 11 ways: ceil(3.3) = 4 ways
        (0x3FF, 10, 80, 0xFE),  # upstream's example: ways [1, 8)
        (0xFFFFF, 50, 100, 0xFFC00),
        (0xF, 0, 1, 0x1),  # at least one way once the end rounds up
    ],
)
def test_cat_mask_covers_the_percent_range_of_the_ways(
    cbm: int, start: int, end: int, expected: int
) -> None:
    assert cat_l3_mask(cbm, start, end) == expected


@pytest.mark.parametrize(
    ("cbm", "start", "end", "min_bits", "match"),
    [
        (0x7FF, 30, 30, 1, "not 0 <= start < end"),
        (0x7FF, 50, 40, 1, "not 0 <= start < end"),
        (0x7F0, 0, 100, 1, "not a contiguous mask"),
        (0x7FF, 10, 15, 1, "0 ways"),  # ceil(1.1) == ceil(1.65): an empty mask
        (0x7FF, 0, 5, 2, "under min_cbm_bits 2"),  # 11 ways * 5 % is 1 way
    ],
)
def test_cat_mask_refuses_what_the_kernel_would(
    cbm: int, start: int, end: int, min_bits: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        cat_l3_mask(cbm, start, end, min_bits)


@pytest.mark.parametrize(
    ("percent", "kwargs", "expected"),
    [
        (100, {}, "100"),
        (45, {}, "50"),  # Intel: up to a multiple of 10
        (5, {}, "10"),
        (5, {"minimum": 20}, "20"),  # never under info/MB/min_bandwidth
        (100, {"amd": True}, "2048"),
        (50, {"amd": True}, "80"),
    ],
)
def test_mba_rounds_up_to_the_granularity(
    percent: int, kwargs: dict[str, Any], expected: str
) -> None:
    assert mba_value(percent, **kwargs) == expected


def test_mba_outside_1_to_100_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not in 1\.\.100"):
        mba_value(0)


def test_schemata_lines_parse_padded_names_and_format_back() -> None:
    text = "    L3:0=7ff;1=7ff\n      MB:0=100;1=100\n"
    parsed = parse_schemata(text)
    assert parsed == {"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", 1: "100"}}
    assert format_schemata_line("L3", parsed["L3"]) == "L3:0=7ff;1=7ff"


# On a fake resctrl mount -----------------------------------------------------------------------


def install_resctrl(fake: FakeHost) -> Path:
    """The golden Xeon mount (two L3 domains) and its cpuinfo flags, with empty tasks files."""
    root = Path(fake.paths.sys("fs", "resctrl"))
    shutil.copytree(GOLDEN / "fs", root)
    for group in ("", "LSR", "LS", "BE"):
        (root / group / "tasks").write_text("")
    shutil.copy(GOLDEN / "cpuinfo.xeon-6148", fake.paths.proc("cpuinfo"))
    return root


def _threads(fake: FakeHost, rel: str, tids: list[int]) -> None:
    name = "cgroup.threads" if fake.version is CgroupVersion.V2 else "tasks"
    fake.write("cpu", rel, name, "".join(f"{t}\n" for t in tids))


@pytest.fixture
def rig(fake_host: FakeHost) -> Iterator[SimpleNamespace]:
    fake = fake_host
    root = install_resctrl(fake)
    pods = []
    for i, (qos, kube_qos) in enumerate(
        [
            (QoSClass.LSR, KubeQOS.GUARANTEED),
            (QoSClass.LS, KubeQOS.BURSTABLE),
            (QoSClass.BE, KubeQOS.BESTEFFORT),
        ]
    ):
        uid = f"0000000{i}-0000-4000-8000-000000000000"
        cid = container_id(uid)
        rel, [crel] = fake.add_pod(uid, kube_qos, [("containerd", cid)])
        _threads(fake, crel, [100 * (i + 1), 100 * (i + 1) + 1])
        container = ContainerInfo(cid, "main", "containerd", crel)
        pods.append(PodInfo(uid, f"p{i}", "default", qos, kube_qos, rel, (container,)))
    box: dict[str, Any] = {"raw": {}, "pods": pods}
    audit: list[WriteResult] = []
    writer = CgroupWriter(fake.host, on_change=audit.append)
    writer.start()
    book = QoSBook()
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=MetricCache(),
        executor=writer,
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in box["pods"]}),
        node_slo=lambda: in_force(resourceQOSStrategy=box["raw"]),
        book=book,
    )
    try:
        yield SimpleNamespace(fake=fake, root=root, box=box, audit=audit, book=book, ctx=ctx)
    finally:
        writer.stop()


ALL_ON = {c: {"resctrlQOS": {"enable": True}} for c in ("lsrClass", "lsClass", "beClass")}


def _schemata(root: Path, group: str) -> dict[str, dict[int, str]]:
    return parse_schemata((root / group / "schemata").read_text())


def _tasks(root: Path, group: str) -> list[int]:
    return sorted(int(t) for t in (root / group / "tasks").read_text().split())


async def test_groups_get_their_ways_and_bandwidth_and_their_threads(rig: SimpleNamespace) -> None:
    rig.box["raw"] = {
        **ALL_ON,
        "beClass": {"resctrlQOS": {"enable": True, "mbaPercent": 45}},
    }
    strategy = ResctrlReconcile(rig.ctx)
    await strategy.reconcile()
    root: Path = rig.root
    assert _schemata(root, "LSR") == {"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", 1: "100"}}
    assert _schemata(root, "BE") == {"L3": {0: "f", 1: "f"}, "MB": {0: "50", 1: "50"}}
    assert (_tasks(root, "LSR"), _tasks(root, "LS"), _tasks(root, "BE")) == (
        [100, 101],
        [200, 201],
        [300, 301],
    )
    audited = {(Path(r.path).parent.name, r.knob) for r in rig.audit}
    assert ("BE", "resctrl_l3") in audited
    assert ("BE", "resctrl_tasks") in audited


async def test_disabled_classes_keep_the_full_cache_and_place_no_threads(
    rig: SimpleNamespace,
) -> None:
    rig.box["raw"] = {"beClass": {"resctrlQOS": {"enable": False, "catRangeEndPercent": 10}}}
    await ResctrlReconcile(rig.ctx).reconcile()
    assert _schemata(rig.root, "BE")["L3"] == {0: "7ff", 1: "7ff"}
    assert _tasks(rig.root, "BE") == []


async def test_missing_groups_are_created(rig: SimpleNamespace) -> None:
    shutil.rmtree(rig.root / "LS")
    rig.box["raw"] = ALL_ON
    writer = ResctrlWriter(rig.fake.paths)
    assert writer.ensure_group("LS") is True  # what the kernel does on mkdir: fill it in
    (rig.root / "LS" / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    (rig.root / "LS" / "tasks").write_text("")
    await ResctrlReconcile(rig.ctx).reconcile()
    assert _tasks(rig.root, "LS") == [200, 201]


async def test_threads_already_placed_are_not_written_again(rig: SimpleNamespace) -> None:
    rig.box["raw"] = ALL_ON
    strategy = ResctrlReconcile(rig.ctx)
    await strategy.reconcile()
    before = len(rig.audit)
    await strategy.reconcile()
    assert len(rig.audit) == before


async def test_pods_with_their_own_resctrl_group_are_left_out(rig: SimpleNamespace) -> None:
    rig.box["raw"] = ALL_ON
    be = rig.box["pods"][2]
    rig.box["pods"][2] = replace(be, annotations={POD_RESCTRL_ANNOTATION: "{}"})
    await ResctrlReconcile(rig.ctx).reconcile()
    assert _tasks(rig.root, "BE") == []
    report = rig.book.last_report("resctrl")
    assert report is not None
    assert POD_RESCTRL_ANNOTATION in report.detail["skipped"]["pod/p2"]


async def test_a_too_narrow_range_is_reported_and_not_written(rig: SimpleNamespace) -> None:
    rig.box["raw"] = {
        "beClass": {
            "resctrlQOS": {"enable": True, "catRangeStartPercent": 10, "catRangeEndPercent": 15}
        }
    }
    await ResctrlReconcile(rig.ctx).reconcile()
    assert _schemata(rig.root, "BE")["L3"] == {0: "3", 1: "3"}  # the golden value, untouched
    report = rig.book.last_report("resctrl")
    assert report is not None
    assert report.detail["groups"]["BE"]["L3"].startswith("not written: ")


async def test_dry_run_changes_no_schemata_and_moves_no_thread(rig: SimpleNamespace) -> None:
    rig.box["raw"] = ALL_ON
    dry = CgroupWriter(
        rig.fake.host, on_change=rig.audit.append, dry_run_strategies=frozenset({"resctrl"})
    )
    with dry:  # started, as the daemon's is
        await ResctrlReconcile(replace(rig.ctx, executor=dry)).reconcile()
    assert _schemata(rig.root, "BE")["L3"] == {0: "3", 1: "3"}
    assert _tasks(rig.root, "BE") == []
    assert [r.dry_run for r in rig.audit if r.knob == "resctrl_l3"] == [True]


async def test_without_rdt_flags_the_round_reports_unsupported_with_the_reason(
    rig: SimpleNamespace,
) -> None:
    shutil.rmtree(rig.root)
    shutil.copy(GOLDEN.parent / "proc" / "cpuinfo", rig.fake.paths.proc("cpuinfo"))
    rig.box["raw"] = ALL_ON
    await ResctrlReconcile(rig.ctx).reconcile()
    report = rig.book.last_report("resctrl")
    assert report is not None
    assert report.decision == "unsupported"
    assert "flags lack cat_l3" in report.result
    assert "flags lack mba" in report.result


class _CountingExecutor:
    """The rig's writer, counting the jobs sent to its thread (``call_on_writer``)."""

    def __init__(self, inner: CgroupWriter) -> None:
        self.inner = inner
        self.calls = 0

    def call(self, fn: Any) -> Any:
        self.calls += 1
        return self.inner.call(fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _steady(rig: SimpleNamespace) -> tuple[StrategyContext, _CountingExecutor, dict[str, Any]]:
    """The rig's context with one snapshot and one NodeSLO object until ``box`` swaps them, as
    the daemon hands them out, and a counting executor."""
    executor = _CountingExecutor(rig.ctx.executor)
    box: dict[str, Any] = {
        "snapshot": WorkloadSnapshot(pods={p.uid: p for p in rig.box["pods"]}),
        "slo": in_force(resourceQOSStrategy=ALL_ON),
    }
    ctx = replace(
        rig.ctx,
        executor=executor,
        workloads=lambda: box["snapshot"],
        node_slo=lambda: box["slo"],
        pod_warnings=PodAnnotationWarnings(Sink()),
    )
    return ctx, executor, box


async def test_a_cpu_without_rdt_is_not_asked_again_and_annotations_are_still_checked(
    rig: SimpleNamespace,
) -> None:
    shutil.rmtree(rig.root)
    shutil.copy(GOLDEN.parent / "proc" / "cpuinfo", rig.fake.paths.proc("cpuinfo"))
    ctx, executor, box = _steady(rig)
    strategy = ResctrlReconcile(ctx)
    await strategy.reconcile()
    first = rig.book.last_report("resctrl")
    assert first is not None
    assert first.decision == "unsupported"
    assert executor.calls == 1
    for _ in range(3):  # the same workloads and NodeSLO: the same report, no job, no pass
        await strategy.reconcile()
    again = rig.book.last_report("resctrl")
    assert again is not None
    assert (again.decision, again.result, again.inputs) == (
        first.decision,
        first.result,
        first.inputs,
    )
    assert again.inputs["BE"]["cgroups"] == 1
    assert executor.calls == 1
    pod = rig.box["pods"][0]
    bad = replace(pod, annotations={POD_RESCTRL_ANNOTATION: "{not json"})
    box["snapshot"] = WorkloadSnapshot(pods={**box["snapshot"].pods, pod.uid: bad})
    await strategy.reconcile()  # new workloads: the annotation is checked, still no job
    assert executor.calls == 1
    [warning] = ctx.pod_warnings.describe()
    assert warning["annotation"] == POD_RESCTRL_ANNOTATION
    box["snapshot"] = WorkloadSnapshot(pods={**box["snapshot"].pods, pod.uid: pod})
    await strategy.reconcile()  # mended: the warning goes
    assert ctx.pod_warnings.describe() == []
    assert executor.calls == 1


async def test_a_cpu_with_rdt_but_no_mount_is_looked_at_every_round(rig: SimpleNamespace) -> None:
    fs = Path(rig.fake.paths.sys("fs"))
    shutil.move(rig.root, fs / "resctrl.unmounted")
    rig.root.mkdir()  # the bare mount point of an unmounted kernel
    ctx, executor, _ = _steady(rig)
    strategy = ResctrlReconcile(ctx)
    await strategy.reconcile()
    await strategy.reconcile()
    report = rig.book.last_report("resctrl")
    assert report is not None
    assert report.decision == "unsupported"
    assert "not mounted" in report.result
    assert executor.calls == 2
    rig.root.rmdir()
    shutil.move(fs / "resctrl.unmounted", rig.root)  # mounted now
    await strategy.reconcile()
    report = rig.book.last_report("resctrl")
    assert report is not None
    assert report.decision == "apply schemata and tasks"
    assert _tasks(rig.root, "BE") == [300, 301]


def test_alloc_info_reads_the_mount(rig: SimpleNamespace) -> None:
    info = read_alloc_info(rig.fake.paths, ("LSR", "XX"))
    assert (info.l3_cbm, info.l3_min_cbm_bits, info.l3_domains) == (0x7FF, 1, (0, 1))
    assert (info.mb_min, info.mb_gran, info.mb_domains, info.amd) == (10, 10, (0, 1), False)
    assert info.groups == {"LSR": True, "XX": False}
    assert info.usable


def test_alloc_info_names_the_missing_mount(rig: SimpleNamespace) -> None:
    shutil.rmtree(rig.root)
    info = read_alloc_info(rig.fake.paths)
    assert not info.usable
    assert "resctrl not mounted" in info.l3_reason


# node.koordinator.sh/resctrl: a pod's own group (upstream v1.6, pkg/koordlet/util/resctrl's
# ParseSchemata: llc ranges and mb percents, per cache id where given) ---------------------------


def kernel_group(root: Path, group: str) -> None:
    """What mkdir in resctrl makes: a group with the default allocation and no threads."""
    (root / group).mkdir()
    (root / group / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    (root / group / "tasks").write_text("")


class Sink:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        self.messages.append(message)


def _own(rig: SimpleNamespace, index: int, value: str) -> str:
    pod = rig.box["pods"][index]
    rig.box["pods"][index] = replace(pod, annotations={POD_RESCTRL_ANNOTATION: value})
    return f"koordlet-{pod.uid}"


async def test_a_pod_with_the_annotation_gets_its_own_ways_bandwidth_and_threads(
    rig: SimpleNamespace,
) -> None:
    rig.box["raw"] = ALL_ON
    group = _own(
        rig, 2, '{"llc": {"schemata": {"range": [0, 30]}}, "mb": {"schemata": {"percent": 20}}}'
    )
    kernel_group(rig.root, group)
    await ResctrlReconcile(rig.ctx).reconcile()
    assert _schemata(rig.root, group) == {"L3": {0: "f", 1: "f"}, "MB": {0: "20", 1: "20"}}
    assert _tasks(rig.root, group) == [300, 301]
    assert _tasks(rig.root, "BE") == []  # its class's group leaves it alone
    report = rig.book.last_report("resctrl")
    assert report is not None
    assert report.detail["pods"]["default/p2"]["tasks"] == {"added": 2, "exited": 0}


async def test_per_cache_entries_win_for_their_domain_and_unnamed_resources_stay_full(
    rig: SimpleNamespace,
) -> None:
    value = (
        '{"llc": {"schemata": {"range": [0, 50]}, '
        '"schemataPerCache": [{"cacheID": 1, "range": [50, 100]}]}}'
    )
    group = _own(rig, 1, value)
    kernel_group(rig.root, group)
    await ResctrlReconcile(rig.ctx).reconcile()  # no resourceQOSStrategy: pod groups only
    assert _schemata(rig.root, group) == {
        "L3": {0: "3f", 1: "7c0"},  # 11 ways: [0, 6) and [6, 11)
        "MB": {0: "100", 1: "100"},
    }
    assert _tasks(rig.root, group) == [200, 201]


async def test_a_malformed_resctrl_annotation_keeps_the_pod_in_its_class_group(
    rig: SimpleNamespace,
) -> None:
    rig.box["raw"] = ALL_ON
    sink = Sink()
    ctx = replace(rig.ctx, pod_warnings=PodAnnotationWarnings(sink))
    group = _own(rig, 2, '{"llc": {"schemata": {"range": [30, 10]}}}')
    strategy = ResctrlReconcile(ctx)
    await strategy.reconcile()
    await strategy.reconcile()
    assert not (rig.root / group).exists()
    assert _tasks(rig.root, "BE") == [300, 301]
    [message] = sink.messages
    assert f"annotation {POD_RESCTRL_ANNOTATION} ignored" in message
    assert "llc.schemata.range [30, 10]" in message


async def test_groups_of_pods_gone_or_without_the_annotation_are_removed(
    rig: SimpleNamespace,
) -> None:
    stale = rig.root / "koordlet-00000000-dead-4000-8000-000000000000"
    stale.mkdir()
    group = _own(rig, 0, "{}")
    kernel_group(rig.root, group)
    await ResctrlReconcile(rig.ctx).reconcile()
    assert not stale.exists()
    assert (rig.root / group).is_dir()
    assert (rig.root / "LSR").is_dir()  # not ours by name: never touched
    removed = [r for r in rig.audit if r.knob == "resctrl_group" and r.new == "removed"]
    assert [Path(r.path).name for r in removed] == [stale.name]

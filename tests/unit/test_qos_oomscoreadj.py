"""The ``oom_score_adj`` hot update: upstream's annotation cases as a table, rounds on the fake
tree (fake ``/proc/<pid>`` files), the writer's dry run, audit and vanished processes, and a real
process of this machine in a test cgroup."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from apis.extension import KubeQOS, QoSClass
from apis.pod_overrides import (
    ANNOTATION_OOM_SCORE_ADJ,
    ANNOTATION_OOM_SCORE_ADJ_SPEC,
    AnnotationError,
    oom_score_adj_for,
)
from koordlet.executor.audit import AuditLog
from koordlet.executor.procfiles import OOM_SCORE_ADJ, ProcessFileWriter
from koordlet.executor.writer import CgroupWriter
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.oomscoreadj import NAME, OOMScoreAdj
from koordlet.qos.podwarnings import EVENT_REASON, PodAnnotationWarnings
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.probe import Capabilities, Capability
from koordlet.system.psi import has_cap_sys_resource
from tests.fakehost import FakeHost
from tests.strategyrig import config, in_force

# upstream's getOOMScoreAdjForContainer cases (pkg/koordlet/runtimehooks/hooks/oomscoreadj/
# helper_test.go and oom_score_adj_test.go, HEAD)


@pytest.mark.parametrize(
    ("annotations", "container", "want"),
    [
        ({}, "c1", None),
        ({"foo": "bar"}, "c1", None),
        ({ANNOTATION_OOM_SCORE_ADJ: "-500"}, "c1", -500),
        (
            {ANNOTATION_OOM_SCORE_ADJ: "-500", ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c1": 100}'},
            "c1",
            100,
        ),
        (
            {ANNOTATION_OOM_SCORE_ADJ: "-500", ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c2": 100}'},
            "c1",
            -500,
        ),
        ({ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c2": 100}'}, "c1", None),
        ({ANNOTATION_OOM_SCORE_ADJ: "+7"}, "c1", 7),  # Go's ParseInt takes a sign
        ({ANNOTATION_OOM_SCORE_ADJ: ""}, "c1", None),
    ],
)
def test_the_container_entry_wins_then_the_pod_value_then_nothing(
    annotations: dict[str, str], container: str, want: int | None
) -> None:
    assert oom_score_adj_for(annotations, container) == want


@pytest.mark.parametrize(
    ("annotations", "names"),
    [
        ({ANNOTATION_OOM_SCORE_ADJ: "-2000"}, ANNOTATION_OOM_SCORE_ADJ),  # out of range
        ({ANNOTATION_OOM_SCORE_ADJ: "abc"}, ANNOTATION_OOM_SCORE_ADJ),
        ({ANNOTATION_OOM_SCORE_ADJ: "1.5"}, ANNOTATION_OOM_SCORE_ADJ),
        ({ANNOTATION_OOM_SCORE_ADJ_SPEC: "{invalid}"}, ANNOTATION_OOM_SCORE_ADJ_SPEC),
        ({ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c1": "100"}'}, ANNOTATION_OOM_SCORE_ADJ_SPEC),
        ({ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c1": 1001}'}, ANNOTATION_OOM_SCORE_ADJ_SPEC),
        ({ANNOTATION_OOM_SCORE_ADJ_SPEC: "[1]"}, ANNOTATION_OOM_SCORE_ADJ_SPEC),
    ],
)
def test_malformed_values_name_their_annotation(annotations: dict[str, str], names: str) -> None:
    with pytest.raises(AnnotationError) as info:
        oom_score_adj_for(annotations, "c1")
    assert info.value.annotation == names
    assert str(info.value).startswith(f"annotation {names}: ")


# Rounds on the fake tree --------------------------------------------------------------------------


def fake_pid(fake: FakeHost, pid: int, value: int = 0) -> str:
    path = fake.paths.proc(str(pid), "oom_score_adj")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_text(f"{value}\n")
    return path


def put(path: str, text: str) -> None:
    Path(path).write_text(text + "\n")


def value_of(path: str) -> str:
    return Path(path).read_text().strip()


def pod_with(fake: FakeHost, annotations: dict[str, str], pids: dict[str, list[int]]) -> PodInfo:
    uid = f"{secrets.token_hex(4)}-0000-4000-8000-000000000001"
    cids = [(name, secrets.token_hex(32)) for name in pids]
    _, rels = fake.add_pod(uid, KubeQOS.BURSTABLE, [("containerd", cid) for _, cid in cids])
    containers = []
    for (name, cid), rel in zip(cids, rels, strict=True):
        fake.write("cpu", rel, "cgroup.procs", "".join(f"{p}\n" for p in pids[name]))
        containers.append(ContainerInfo(cid, name, "containerd", rel))
    return PodInfo(
        uid, "web", "ns", QoSClass.LS, KubeQOS.BURSTABLE, rels[0].rsplit("/", 1)[0],
        tuple(containers), annotations=annotations,
    )  # fmt: skip


class Sink:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, str, str]] = []

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        self.warnings.append((pod.name, reason, message))


def make(
    fake: FakeHost, pods: list[PodInfo], *, dry: bool = False, caps: Capabilities | None = None
) -> tuple[OOMScoreAdj, CgroupWriter, AuditLog, Sink, QoSBook]:
    audit = AuditLog(None)
    dry_set = frozenset({NAME}) if dry else frozenset()
    writer = CgroupWriter(fake.host, on_change=audit.on_write, dry_run_strategies=dry_set)
    writer.start()
    sink = Sink()
    book = QoSBook()
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=None,  # type: ignore[arg-type]  # reads no series
        executor=writer,
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in pods}),
        node_slo=lambda: in_force(),
        capabilities=caps,
        audit=audit,
        book=book,
        pod_warnings=PodAnnotationWarnings(sink),
    )
    return OOMScoreAdj(ctx), writer, audit, sink, book


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)


async def test_each_containers_processes_get_their_value_and_a_gone_pid_is_no_error(
    fake: FakeHost,
) -> None:
    ann = {ANNOTATION_OOM_SCORE_ADJ: "300", ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"sidecar": 800}'}
    pod = pod_with(fake, ann, {"main": [101, 102, 999], "sidecar": [201]})
    paths = {pid: fake_pid(fake, pid) for pid in (101, 102, 201)}  # 999 exited: no /proc/999
    put(paths[102], "300")
    strategy, writer, audit, sink, book = make(fake, [pod])
    try:
        await strategy.reconcile()
    finally:
        writer.stop()
    assert [value_of(paths[p]) for p in (101, 102, 201)] == ["300", "300", "800"]
    report = book.last_report(NAME)
    assert report is not None
    assert report.result == "2 updated, 1 unchanged, 1 gone"
    assert report.detail["ns/web/main"] == {"value": 300, "updated": 1, "unchanged": 1}
    changed = [e for e in audit.recent() if e.kind == "write"]
    assert sorted(e.path for e in changed) == sorted([paths[101], paths[201]])
    assert sink.warnings == []


async def test_a_malformed_value_leaves_the_pod_alone_and_is_said_once(fake: FakeHost) -> None:
    pod = pod_with(fake, {ANNOTATION_OOM_SCORE_ADJ: "-2000"}, {"main": [101]})
    path = fake_pid(fake, 101, 0)
    strategy, writer, _, sink, _ = make(fake, [pod])
    try:
        await strategy.reconcile()
        await strategy.reconcile()
    finally:
        writer.stop()
    assert value_of(path) == "0"
    [(name, reason, message)] = sink.warnings
    assert (name, reason) == ("web", EVENT_REASON)
    assert ANNOTATION_OOM_SCORE_ADJ in message
    assert "-2000 is outside -1000..1000" in message
    [entry] = strategy._ctx.pod_warnings.describe()
    assert entry["annotation"] == ANNOTATION_OOM_SCORE_ADJ
    assert strategy._ctx.pod_warnings.rejected == {ANNOTATION_OOM_SCORE_ADJ: 1}


async def test_dry_run_writes_nothing_and_audits_the_decision_once(fake: FakeHost) -> None:
    pod = pod_with(fake, {ANNOTATION_OOM_SCORE_ADJ: "500"}, {"main": [101]})
    path = fake_pid(fake, 101, 0)
    strategy, writer, audit, _, book = make(fake, [pod], dry=True)
    try:
        await strategy.reconcile()
        await strategy.reconcile()
    finally:
        writer.stop()
    assert value_of(path) == "0"
    decisions = [e for e in audit.recent() if e.dry_run]
    assert len(decisions) == 1
    assert (decisions[0].path, decisions[0].old, decisions[0].new) == (path, "0", "500")
    report = book.last_report(NAME)
    assert report is not None
    assert report.result == "dry run: 1 updated"


async def test_an_unsupported_host_does_nothing_and_says_why(fake: FakeHost) -> None:
    pod = pod_with(fake, {ANNOTATION_OOM_SCORE_ADJ: "500"}, {"main": [101]})
    path = fake_pid(fake, 101, 0)
    cap = Capability("oom_score_adj", False, "/proc/self/oom_score_adj absent", "")
    strategy, writer, _, _, book = make(fake, [pod], caps=Capabilities([cap], CgroupVersion.V1))
    try:
        await strategy.reconcile()
    finally:
        writer.stop()
    assert value_of(path) == "0"
    report = book.last_report(NAME)
    assert report is not None
    assert report.decision == "unsupported: /proc/self/oom_score_adj absent"


def test_the_writer_refuses_a_value_the_kernel_would_refuse(fake: FakeHost) -> None:
    from koordlet.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match=r"-1000\.\.1000"):
        ProcessFileWriter(fake.paths).apply(OOM_SCORE_ADJ, fake.layout, "kubepods", 1001)


# A real process -----------------------------------------------------------------------------------


REAL = HostPaths()
needs_root_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isfile(REAL.cgroup("cpu", "tasks")),
    reason="needs root and the cgroup v1 cpu hierarchy",
)


@pytest.mark.realcgroup
@needs_root_v1
def test_a_real_process_in_a_test_cgroup_gets_its_oom_score_adj_raised() -> None:
    rel = f"kpytest-{secrets.token_hex(4)}"
    folder = REAL.cgroup("cpu", rel)
    os.makedirs(folder)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        layout = CgroupLayout(REAL, CgroupVersion.V1, CgroupDriver.CGROUPFS, "kubepods")
        writer = ProcessFileWriter(Host(REAL, layout).paths)
        result = writer.apply(OOM_SCORE_ADJ, layout, rel, 600, strategy=NAME, reason="test")
        assert (result.updated, result.failed) == (1, [])
        with open(f"/proc/{proc.pid}/oom_score_adj") as f:
            assert f.read().strip() == "600"
        again = writer.apply(OOM_SCORE_ADJ, layout, rel, 600)
        assert (again.updated, again.unchanged) == (0, 1)
        # Lowering below the current value needs CAP_SYS_RESOURCE (this host's root lacks it):
        # the kernel's refusal is reported per process, never raised.
        lower = writer.apply(OOM_SCORE_ADJ, layout, rel, -500)
        if has_cap_sys_resource(REAL):
            assert lower.updated == 1
        else:
            assert lower.updated == 0
            assert lower.failed == [f"/proc/{proc.pid}/oom_score_adj: Permission denied"]
    finally:
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            os.rmdir(folder)

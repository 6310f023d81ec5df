"""Leveled batches: the order of the writes, against a model of the kernel's hierarchy checks,
and through the real writer on fake cgroup trees (gone cgroups, dry run, audit)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from koordlet.errors import CgroupGoneError, HostError
from koordlet.executor import AuditLog, BatchWrite, CgroupWriter, WriteResult
from koordlet.executor.batch import apply_batch, plan
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import CPU_CFS_QUOTA, CPUSET_CPUS, CPUSET_MEMS, Knob
from koordlet.system.paths import HostPaths

UNLIMITED = None


class KernelModel:
    """Nested cgroups with cgroup v1's checks: a child's cpuset within its parent's (EINVAL when
    a child grows out, EBUSY when a parent shrinks under a child), a child's CFS quota at most its
    parent's. Records every write in order."""

    def __init__(self, values: dict[tuple[str, str], Any]) -> None:
        self.values = dict(values)
        self.writes: list[tuple[str, str, Any]] = []
        self.gone: set[str] = set()
        self.dry = False

    def remove(self, rel: str) -> None:
        """The cgroup is deleted: gone for writes, no longer a child of its parent."""
        self.gone.add(rel)
        for key in [k for k in self.values if k[1] == rel]:
            del self.values[key]

    def _parent(self, rel: str) -> str | None:
        head, _, _ = rel.rpartition("/")
        return head or None

    def _children(self, rel: str) -> list[str]:
        return [d for (_, d) in self.values if d.rpartition("/")[0] == rel]

    def _check(self, knob: str, rel: str, value: Any) -> None:
        parent = self._parent(rel)
        kids = self._children(rel)
        if knob.startswith("cpuset"):
            if parent is not None and not value <= self.values[(knob, parent)]:
                raise HostError(f"{rel} {knob}: EINVAL (not within the parent)")
            for kid in kids:
                if not self.values[(knob, kid)] <= value:
                    raise HostError(f"{rel} {knob}: EBUSY (a child uses more)")
        elif knob == "cpu_cfs_quota":
            inf = float("inf")
            mine = inf if value is None else value
            if parent is not None:
                theirs = self.values[(knob, parent)]
                if mine > (inf if theirs is None else theirs):
                    raise HostError(f"{rel} quota: EINVAL (above the parent)")
            for kid in kids:
                theirs = self.values[(knob, kid)]
                if (inf if theirs is None else theirs) > mine:
                    raise HostError(f"{rel} quota: EINVAL (below a child)")

    def write(
        self,
        knob: Knob[Any],
        rel_dir: str,
        value: object,
        *,
        strategy: str = "",
        reason: str = "",
    ) -> WriteResult:
        knob_name = knob.name
        if rel_dir in self.gone:
            raise CgroupGoneError(f"{rel_dir}: gone")
        if isinstance(value, set | list | tuple):
            value = frozenset(value)
        old = self.values[(knob_name, rel_dir)]
        if old == value or self.dry:
            return WriteResult(rel_dir, str(old), str(value), False, knob_name, strategy, reason)
        self._check(knob_name, rel_dir, value)
        self.values[(knob_name, rel_dir)] = value
        self.writes.append((knob_name, rel_dir, value))
        return WriteResult(rel_dir, str(old), str(value), True, knob_name, strategy, reason)

    def read(self, knob: Knob[Any], rel_dir: str) -> Any:
        if rel_dir in self.gone:
            raise CgroupGoneError(f"{rel_dir}: gone")
        return self.values[(knob.name, rel_dir)]

    def is_dry_run(self, strategy: str) -> bool:
        return self.dry


TREE = ("kubepods", "kubepods/besteffort", "kubepods/besteffort/pod1", "kubepods/besteffort/pod2")


def cpusets(**sets: frozenset[int]) -> dict[tuple[str, str], Any]:
    names = dict(zip(("root", "be", "pod1", "pod2"), TREE, strict=True))
    return {("cpuset_cpus", names[k]): v for k, v in sets.items()}


def test_a_shrink_writes_children_before_parents() -> None:
    kernel = KernelModel(cpusets(root=frozenset(range(8)), be=frozenset(range(8)),
                                 pod1=frozenset(range(8)), pod2=frozenset(range(4))))  # fmt: skip
    target = frozenset({0, 1})
    result = apply_batch(kernel, [BatchWrite(CPUSET_CPUS, d, target) for d in TREE[1:]])
    assert result.ok
    order = [d for _, d, _ in kernel.writes]
    assert order.index("kubepods/besteffort/pod1") < order.index("kubepods/besteffort")
    assert all(kernel.values[("cpuset_cpus", d)] == target for d in TREE[1:])


def test_a_grow_writes_parents_before_children_and_each_file_once() -> None:
    small = frozenset({0})
    kernel = KernelModel(cpusets(root=frozenset(range(8)), be=small, pod1=small, pod2=small))
    result = apply_batch(
        kernel, [BatchWrite(CPUSET_CPUS, d, frozenset(range(6))) for d in reversed(TREE[1:])]
    )
    assert result.ok
    assert [d for _, d, _ in kernel.writes] == [TREE[1], TREE[3], TREE[2]]  # same depth: as asked


def test_a_move_to_disjoint_cpus_goes_through_the_union() -> None:
    kernel = KernelModel(cpusets(root=frozenset(range(4)), be=frozenset({0, 1}),
                                 pod1=frozenset({0}), pod2=frozenset({1})))  # fmt: skip
    to = frozenset({2, 3})
    result = apply_batch(kernel, [BatchWrite(CPUSET_CPUS, d, to) for d in TREE[1:]])
    assert result.ok, result.errors
    assert ("cpuset_cpus", "kubepods/besteffort", frozenset({0, 1, 2, 3})) in kernel.writes
    assert all(kernel.values[("cpuset_cpus", d)] == to for d in TREE[1:])


def test_mems_grow_before_cpus_and_cpus_shrink_before_mems_in_one_cgroup() -> None:
    grow, shrink = plan(
        [
            BatchWrite(CPUSET_CPUS, "kubepods/besteffort", {0}),
            BatchWrite(CPUSET_MEMS, "kubepods/besteffort", {0}),
        ]
    )
    assert [w.knob for w in grow] == [CPUSET_MEMS, CPUSET_CPUS]
    assert [w.knob for w in shrink] == [CPUSET_CPUS, CPUSET_MEMS]


def test_the_last_value_asked_for_a_file_wins() -> None:
    _, shrink = plan(
        [
            BatchWrite(CPU_CFS_QUOTA, "kubepods/besteffort", 2000),
            BatchWrite(CPU_CFS_QUOTA, "kubepods/besteffort/", 4000),
        ]
    )
    assert [w.value for w in shrink] == [4000]


def test_a_cgroup_gone_mid_batch_skips_it_and_its_children_and_the_batch_goes_on() -> None:
    kernel = KernelModel(cpusets(root=frozenset(range(8)), be=frozenset(range(8)),
                                 pod1=frozenset(range(8)), pod2=frozenset(range(8))))  # fmt: skip
    kernel.remove("kubepods/besteffort/pod1")
    result = apply_batch(kernel, [BatchWrite(CPUSET_CPUS, d, frozenset({0, 1})) for d in TREE[1:]])
    assert result.ok
    assert result.gone == ("kubepods/besteffort/pod1",)
    assert kernel.values[("cpuset_cpus", "kubepods/besteffort/pod2")] == frozenset({0, 1})


def test_a_refused_write_is_reported_and_the_others_are_done() -> None:
    kernel = KernelModel(cpusets(root=frozenset({0, 1}), be=frozenset({0, 1}),
                                 pod1=frozenset({0}), pod2=frozenset({1})))  # fmt: skip
    result = apply_batch(
        kernel,
        [
            BatchWrite(CPUSET_CPUS, "kubepods/besteffort", frozenset({0, 1, 5})),  # > root
            BatchWrite(CPUSET_CPUS, "kubepods/besteffort/pod2", frozenset({0})),
        ],
    )
    assert not result.ok
    assert [w.rel_dir for w, _ in result.errors] == ["kubepods/besteffort"]
    assert kernel.values[("cpuset_cpus", "kubepods/besteffort/pod2")] == frozenset({0})


def test_in_dry_run_the_grow_pass_is_skipped_and_nothing_changes() -> None:
    before = cpusets(root=frozenset(range(8)), be=frozenset({0}), pod1=frozenset({0}),
                     pod2=frozenset({0}))  # fmt: skip
    kernel = KernelModel(before)
    kernel.dry = True
    result = apply_batch(kernel, [BatchWrite(CPUSET_CPUS, d, {0, 1, 2}) for d in TREE[1:]])
    assert result.ok
    assert result.changed == 0
    assert kernel.values == before
    assert len(result.results) == 3  # only the final values, no grow steps


quotas = st.one_of(st.none(), st.integers(1000, 800_000))


def nested(draw: st.DrawFn, within: Any) -> list[Any]:
    """Four values for TREE, each within its parent (the root is kept as the outer bound):
    a non-empty subset of the parent's CPUs, or a quota no larger than the parent's (any quota,
    or none, under an unlimited parent). Built within the parent, not filtered, so drawing
    never starves on a busy machine."""
    out = [within]
    for i in range(1, 4):
        parent = out[i - 1] if i < 3 else out[1]
        out.append(draw(within_(parent)))
    return out


def within_(parent: Any) -> st.SearchStrategy[Any]:
    if isinstance(parent, frozenset):
        return st.frozensets(st.sampled_from(sorted(parent)), min_size=1)
    if parent is None:
        return quotas
    return st.integers(1000, parent)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_consistent_cpuset_or_quota_change_is_accepted_at_every_step(data: Any) -> None:
    k = data.draw(st.sampled_from([CPUSET_CPUS, CPU_CFS_QUOTA]))
    knob = k.name
    top = frozenset(range(8)) if k is CPUSET_CPUS else None
    draw = data.draw
    before = nested(draw, top)
    after = nested(draw, top)
    kernel = KernelModel({(knob, d): v for d, v in zip(TREE, before, strict=True)})
    order = draw(st.permutations(list(TREE[1:])))
    result = apply_batch(kernel, [BatchWrite(k, d, after[TREE.index(d)]) for d in order])
    assert result.ok, result.errors
    assert [kernel.values[(knob, d)] for d in TREE] == after


# Through the real writer on a fake tree ----------------------------------------------------------


def v1_host(tmp_path: Path) -> Host:
    paths = HostPaths(cgroup_root=str(tmp_path / "cgroup"))
    layout = detect_layout(paths, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
    for rel in TREE:
        d = tmp_path / "cgroup" / "cpuset" / rel
        d.mkdir(parents=True)
        (d / "cpuset.cpus").write_text("0-7\n")
        (d / "cpuset.mems").write_text("0\n")
    return Host(paths, layout)


async def test_submit_batch_runs_the_batch_on_the_writer_thread_and_audits_each_change(
    tmp_path: Path,
) -> None:
    host = v1_host(tmp_path)
    audit = AuditLog(None)
    threads: set[str] = set()

    def on_change(result: WriteResult) -> None:
        threads.add(threading.current_thread().name)
        audit.on_write(result)

    writer = CgroupWriter(host, on_change=on_change)
    with writer:
        future = writer.submit_batch(
            [BatchWrite(CPUSET_CPUS, d, {2, 3}, "cpusuppress", "node cpu high") for d in TREE]
        )
        result = future.result(timeout=10)
    assert result.ok
    assert result.changed == 4
    for rel in TREE:
        assert (tmp_path / "cgroup/cpuset" / rel / "cpuset.cpus").read_text() == "2-3"
    assert {t.split("_")[0] for t in threads} == {"cgroup-writer"}
    bottom_up = [TREE[2], TREE[3], TREE[1], TREE[0]]
    assert [e.path.split("/cpuset/")[1] for e in audit.recent()][::-1] == [
        f"{d}/cpuset.cpus" for d in bottom_up
    ]
    assert {e.strategy for e in audit.recent()} == {"cpusuppress"}


def test_a_batch_in_dry_run_writes_nothing_and_audits_the_decisions(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    audit = AuditLog(None)
    writer = CgroupWriter(host, on_change=audit.on_write, dry_run_strategies=frozenset({"s"}))
    result = apply_batch(writer, [BatchWrite(CPUSET_CPUS, d, {1}, "s", "why") for d in TREE])
    assert result.ok
    assert result.changed == 0
    for rel in TREE:
        assert (tmp_path / "cgroup/cpuset" / rel / "cpuset.cpus").read_text() == "0-7\n"
    decisions = audit.recent()
    assert len(decisions) == 4
    assert all(e.kind == "decision" and e.dry_run and e.new == "1" for e in decisions)

"""percentageOfNodesToScore: the standalone scheduler stops filtering once it has found enough
feasible nodes, as kube-scheduler does; and the caches that make the search cheap decide exactly
what a fresh computation decides."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugins.config import parse_config
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Framework, num_feasible_nodes_to_find
from scheduler_plugins.loading import build_snapshot
from scheduler_plugins.plugins import loadaware
from scheduler_plugins.plugins.loadindex import ExpiryIndex, ThresholdIndex
from scheduler_plugins.plugins.nodenumaresource import NodeNUMAResource
from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit
from scheduler_plugins.snapshot import PodInfo, Snapshot, parse_pod
from scheduler_plugins.standalone import EventRecorder, Scheduler
from scheduler_plugins.table import build_framework
from tests.scheduler.builders import NOW, node, node_metric, nrt, pod

STATUS = "scheduling.koordinator.sh/resource-status"


class CountingBinder:
    """Binds nothing; remembers where each pod went."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.bound[pod.name] = node


def cluster(count: int, *, hot_every: int = 3) -> Snapshot:
    """``count`` nodes; every ``hot_every``-th one is over LoadAware's 65 % cpu threshold."""
    objects: list[dict[str, Any]] = []
    for i in range(count):
        name = f"n{i:04d}"
        used = "30" if i % hot_every == 0 else f"{(i * 7) % 15 + 1}"
        objects += [node(name, cpu="32"), node_metric(name, cpu=used, memory="1Gi")]
    return build_snapshot(objects, "test")


def ours(name: str, cpu: str = "1") -> PodInfo:
    raw = pod(name, requests={"cpu": cpu, "memory": "1Gi"}, priority=9500)
    raw["spec"]["schedulerName"] = "koord-scheduler"
    return parse_pod(raw, "pod")


@pytest.mark.parametrize(
    ("percentage", "nodes", "expected"),
    [
        (0, 50, 50),  # under 100 nodes: every node
        (0, 100, 100),  # 50 % of 100 is under the 100-node floor
        (0, 1000, 420),  # 50 - 1000/125 = 42 %
        (0, 5000, 500),  # 50 - 40 = 10 %
        (0, 10000, 500),  # 50 - 80 < 5: the 5 % floor
        (30, 1000, 300),
        (1, 1000, 100),  # never fewer than 100 nodes
        (100, 5000, 5000),
    ],
)
def test_nodes_to_find_follow_kube_schedulers_adaptive_percentage(percentage, nodes, expected):
    assert num_feasible_nodes_to_find(percentage, nodes) == expected


def test_the_search_stops_at_the_wanted_count_of_nodes_that_are_all_feasible():
    snap = cluster(400)
    fw = build_framework()
    nodes = list(snap.nodes.values())
    p = ours("p")
    exhaustive, _ = fw.filter_nodes(fw.new_cycle(snap, NOW), p, nodes)
    found = fw.find_feasible(fw.new_cycle(snap, NOW), p, nodes, percentage=0, start=37)
    want = num_feasible_nodes_to_find(0, 400)
    assert len(found.feasible) == want < len(exhaustive)
    assert {n.name for n in found.feasible} <= {n.name for n in exhaustive}
    # examined in order from the start, and the search stopped at the last node it needed
    examined = [nodes[(37 + k) % 400] for k in range(found.processed)]
    assert [n for n in examined if n in exhaustive] == found.feasible
    assert examined[-1] is found.feasible[-1]
    assert set(found.failures) == {n.name for n in examined} - {n.name for n in found.feasible}


def test_the_search_wraps_around_the_end_of_the_node_list():
    snap = cluster(300)
    fw = build_framework()
    nodes = list(snap.nodes.values())
    found = fw.find_feasible(fw.new_cycle(snap, NOW), ours("p"), nodes, percentage=10, start=290)
    names = [n.name for n in found.feasible]
    assert len(names) == 100
    assert "n0292" in names  # n0291 is over the threshold
    assert "n0001" in names  # past the end, then from the beginning


def test_a_hundred_percent_examines_every_node_as_the_exhaustive_filter_does():
    snap = cluster(400)
    fw = build_framework()
    nodes = list(snap.nodes.values())
    p = ours("p")
    exhaustive, failures = fw.filter_nodes(fw.new_cycle(snap, NOW), p, nodes)
    found = fw.find_feasible(fw.new_cycle(snap, NOW), p, nodes, percentage=100, start=123)
    assert found.processed == 400
    assert found.feasible == exhaustive
    assert found.failures == failures


def test_a_pod_no_node_fits_is_checked_against_every_node():
    snap = cluster(300)
    fw = build_framework()
    found = fw.find_feasible(
        fw.new_cycle(snap, NOW), ours("huge", cpu="64"), list(snap.nodes.values()), percentage=10
    )
    assert found.feasible == []
    assert found.processed == 300
    assert len(found.failures) == 300


async def test_the_scheduler_starts_each_search_where_the_last_one_stopped():
    snap = cluster(350)
    binder = CountingBinder()
    sched = Scheduler(
        build_framework(),
        snap,
        binder,
        EventRecorder(None),
        clock=lambda: NOW,
        percentage_of_nodes_to_score=10,
    )
    starts = []
    for i in range(4):
        starts.append(sched.next_start)
        p = ours(f"p{i}")
        snap.pending_pods[p.uid] = p
        assert await sched.schedule_one(p) is not None
    assert starts[0] == 0
    assert starts[1] >= 100  # at least the 100 nodes it wanted were examined
    assert len(set(starts)) == 4
    assert min(starts[2:]) < starts[1]  # wrapped around the end of the node list
    assert all(0 <= s < 350 for s in starts)
    await sched.wait_bindings()
    assert len(binder.bound) == 4


async def test_the_scheduler_at_a_hundred_percent_picks_the_best_node_of_the_whole_cluster():
    snap = cluster(300)
    fw = build_framework()
    best = fw.evaluate(snap, ours("probe"), now=NOW).best()
    binder = CountingBinder()
    sched = Scheduler(
        fw, snap, binder, EventRecorder(None), clock=lambda: NOW, percentage_of_nodes_to_score=100
    )
    p = ours("p")
    snap.pending_pods[p.uid] = p
    assert await sched.schedule_one(p) == best


def test_a_percentage_outside_zero_to_a_hundred_is_refused():
    with pytest.raises(ValueError, match="percentageOfNodesToScore"):
        Scheduler(
            build_framework(),
            cluster(1),
            CountingBinder(),
            EventRecorder(None),
            percentage_of_nodes_to_score=101,
        )


def test_the_config_file_sets_the_percentage_and_the_profile_wins():
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "percentageOfNodesToScore": 20,
        "profiles": [{"schedulerName": "koord-scheduler", "percentageOfNodesToScore": 40}],
    }
    assert parse_config(doc, "cfg").percentage_of_nodes_to_score == 40
    del doc["profiles"][0]["percentageOfNodesToScore"]
    assert parse_config(doc, "cfg").percentage_of_nodes_to_score == 20
    assert parse_config({}, "cfg").percentage_of_nodes_to_score == 0
    doc["percentageOfNodesToScore"] = 150
    with pytest.raises(InputError, match="percentageOfNodesToScore"):
        parse_config(doc, "cfg")


# -- the caches decide what a fresh computation decides -----------------------------------------

subsets = st.lists(
    st.tuples(
        st.integers(1, 64),  # cores
        st.integers(0, 64_000),  # used milli-cores
        st.sampled_from([10, 100, 179, 181, 500]),  # NodeMetric age
        st.booleans(),  # in the subset filtered
    ),
    min_size=3,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(subsets, st.integers(0, 16_000), st.booleans())
def test_load_aware_on_a_few_nodes_decides_as_on_all_nodes(rows, request_milli, schedule_anyway):
    objects: list[dict[str, Any]] = []
    for i, (cores, used, age, _) in enumerate(rows):
        objects += [
            node(f"n{i}", cpu=str(cores), memory="64Gi"),
            node_metric(f"n{i}", cpu=f"{used}m", memory="1Gi", age=age),
        ]
    args = {"enableScheduleWhenNodeMetricsExpired": schedule_anyway}
    p = parse_pod(pod("p", requests={"cpu": f"{request_milli}m", "memory": "1Gi"}), "pod")
    snap = build_snapshot(objects, "t")
    nodes = list(snap.nodes.values())
    few = [n for n, row in zip(nodes, rows, strict=True) if row[3]]
    la_all = loadaware.build(args, "test")
    la_few = loadaware.build(args, "test")
    cycle = Framework([la_all]).new_cycle(snap, NOW)
    everywhere = la_all.filter_nodes(cycle, p, nodes)
    here = la_few.filter_nodes(Framework([la_few]).new_cycle(snap, NOW), p, few)
    assert here == {n.name: everywhere[n.name] for n in few if n.name in everywhere}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 3), st.integers(-3, 3)), max_size=40),
    st.integers(-4, 4),
    st.integers(-4, 4),
)
def test_threshold_index_updated_in_place_lists_what_a_fresh_one_lists(ops, e0, e1):
    """Many nodes share a headroom: upserts and discards inside runs of equal keys."""
    index = ThresholdIndex(2)
    rows: dict[str, tuple[str, list[int | None]]] = {}
    expiry = ExpiryIndex(())
    times: dict[str, float] = {}
    for k, h0, h1 in ops:
        name = f"n{k}"
        if h0 == 3 and name in rows:
            index.discard(name)
            expiry.discard(name)
            del rows[name], times[name]
            continue
        reason = "r%s" if h1 >= 0 else "a%s"
        heads: list[int | None] = [h0, None if h1 == -3 else h1]
        index.upsert(name, reason, heads)
        rows[name] = (reason, heads)
        expiry.upsert(name, float(h1))
        times[name] = float(h1)
    fresh = ThresholdIndex.build(2, [(n, r, h) for n, (r, h) in rows.items()])
    assert sorted(index.failing([e0, e1])) == sorted(fresh.failing([e0, e1]))
    assert sorted(expiry.expired(0.0)) == sorted(n for n, t in times.items() if t <= 0.0)
    assert index.rows() == rows


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 3)), min_size=1, max_size=12))
def test_fit_index_updated_in_place_decides_as_a_fresh_one(assignments):
    objects: list[dict[str, Any]] = [node(f"n{i}", cpu="8") for i in range(8)]
    snap = build_snapshot(objects, "t")
    fw = Framework([NodeResourcesFit()])
    probe = parse_pod(pod("probe", requests={"cpu": "4"}), "pod")
    nodes = list(snap.nodes.values())
    fw.filter_nodes(fw.new_cycle(snap, NOW), probe, nodes)  # index built, then kept current
    for i, (target, cores) in enumerate(assignments):
        p = parse_pod(pod(f"p{i}", requests={"cpu": str(cores)}), "pod")
        snap.assume(p, f"n{target}")
    kept, _ = fw.filter_nodes(fw.new_cycle(snap, NOW), probe, nodes)
    fresh_fw = Framework([NodeResourcesFit()])
    fresh, _ = fresh_fw.filter_nodes(fresh_fw.new_cycle(snap, NOW), probe, nodes)
    assert [n.name for n in kept] == [n.name for n in fresh]


def test_a_remembered_cpu_placement_is_forgotten_when_its_node_changes():
    snap = build_snapshot([node("n1", cpu="16"), nrt("n1", cores_per_numa=4, threads=2)], "test")
    plugin = NodeNUMAResource()
    fw = Framework([plugin])

    def lsr(name: str) -> PodInfo:
        raw = pod(
            name,
            requests={"cpu": "4", "memory": "1Gi"},
            limits={"cpu": "4", "memory": "1Gi"},
            labels={"koordinator.sh/qosClass": "LSR"},
            priority=9500,
        )
        return parse_pod(raw, "pod")

    cpusets = []
    for name in ("a", "b"):
        p = lsr(name)
        cycle = fw.new_cycle(snap, NOW)
        assert fw.evaluate(snap, p, cycle=cycle).best() == "n1"
        annotations = fw.reserve(cycle, p, "n1")
        cpusets.append(json.loads(annotations[STATUS])["cpuset"])
    assert cpusets[0] != cpusets[1]
    fresh = Framework([NodeNUMAResource()])
    third = lsr("c")
    cycle = fresh.new_cycle(snap, NOW)
    expected = fresh.reserve(cycle, third, "n1")
    fresh.unreserve(cycle, third, "n1")
    assert fw.reserve(fw.new_cycle(snap, NOW), third, "n1") == expected


def lsr_cluster(count: int) -> Snapshot:
    """``count`` nodes, a CPU topology on one in five."""
    objects: list[dict[str, Any]] = []
    for i in range(count):
        name = f"n{i:04d}"
        objects += [node(name, cpu="16"), node_metric(name, cpu="1", memory="1Gi")]
        if i % 5 == 0:
            objects.append(nrt(name, cores_per_numa=4, threads=2))
    return build_snapshot(objects, "test")


def lsr_pod(name: str, cpu: str) -> PodInfo:
    raw = pod(
        name,
        requests={"cpu": cpu, "memory": "1Gi"},
        limits={"cpu": cpu, "memory": "1Gi"},
        labels={"koordinator.sh/qosClass": "LSR"},
        priority=9500,
    )
    return parse_pod(raw, "pod")


@pytest.mark.parametrize("percentage", [0, 100])
def test_a_cpu_binding_pod_skips_nodes_without_a_topology_and_finds_the_same_nodes(percentage):
    snap = lsr_cluster(600)
    fw = build_framework()
    nodes = list(snap.nodes.values())
    p = lsr_pod("p", "4")
    exhaustive, failures = fw.filter_nodes(fw.new_cycle(snap, NOW), p, nodes)
    found = fw.find_feasible(fw.new_cycle(snap, NOW), p, nodes, percentage=percentage)
    assert len(exhaustive) == 120  # the nodes with a topology: fewer than wanted
    assert found.feasible == exhaustive
    assert found.processed == 600
    assert set(found.failures) < set(failures)  # the nodes it skipped have no reasons here


def test_a_cpu_binding_pod_that_fits_nowhere_gets_every_nodes_reasons():
    snap = lsr_cluster(300)
    fw = build_framework()
    nodes = list(snap.nodes.values())
    p = lsr_pod("p", "32")  # more cpus than any topology has
    _, failures = fw.filter_nodes(fw.new_cycle(snap, NOW), p, nodes)
    found = fw.find_feasible(fw.new_cycle(snap, NOW), p, nodes, percentage=10)
    assert found.feasible == []
    assert found.failures == failures
    assert len(found.failures) == 300

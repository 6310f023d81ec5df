"""The indexed filters decide exactly what a node-by-node check decides."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugins.framework import Framework
from scheduler_plugins.loading import build_snapshot
from scheduler_plugins.plugins.loadaware import LoadAwareScheduling, go_round
from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit
from scheduler_plugins.snapshot import parse_pod
from tests.scheduler.builders import NOW, node, node_metric, pod

clusters = st.lists(
    st.tuples(
        st.integers(1, 64),  # cores
        st.integers(0, 64_000),  # used milli-cores
        st.integers(0, 100),  # requested cores of running pods (percent of the node)
        st.sampled_from([10, 100, 179, 181, 500]),  # NodeMetric age
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(clusters, st.integers(0, 16_000))
def test_load_aware_index_matches_the_per_node_formula(cluster, request_milli):
    objects = []
    for i, (cores, used, _, age) in enumerate(cluster):
        objects += [
            node(f"n{i}", cpu=str(cores), memory="64Gi"),
            node_metric(f"n{i}", cpu=f"{used}m", memory="1Gi", age=age),
        ]
    p = parse_pod(pod("p", requests={"cpu": f"{request_milli}m", "memory": "1Gi"}), "pod")
    snap = build_snapshot(objects, "t")
    fw = Framework([LoadAwareScheduling()])
    _, failures = fw.filter_nodes(fw.new_cycle(snap, NOW), p, list(snap.nodes.values()))
    estimate = go_round(request_milli * 0.85) if request_milli else 250
    for i, (cores, used, _, age) in enumerate(cluster):
        total = cores * 1000
        if age >= 180:
            expected = "node(s) nodeMetric expired"
        elif go_round(used * 100 / total) > 65 or go_round((used + estimate) * 100 / total) > 65:
            pct = go_round((used + estimate) / total * 100)  # what the pod would make it
            expected = f"node(s) cpu usage exceed threshold, cpu usage {pct}% > threshold 65%"
        else:
            expected = None
        got = failures.get(f"n{i}")
        assert (got[0][1] if got else None) == expected


@settings(max_examples=60, deadline=None)
@given(clusters, st.integers(0, 64_000))
def test_fit_index_matches_the_per_node_check(cluster, request_milli):
    objects = []
    for i, (cores, _, requested_pct, _) in enumerate(cluster):
        objects.append(node(f"n{i}", cpu=str(cores)))
        objects.append(
            pod(f"r{i}", node_name=f"n{i}", requests={"cpu": f"{cores * 10 * requested_pct}m"})
        )
    p = parse_pod(pod("p", requests={"cpu": f"{request_milli}m"}), "pod")
    snap = build_snapshot(objects, "t")
    fw = Framework([NodeResourcesFit()])
    subset = list(snap.nodes.values())[::2]
    _, failures = fw.filter_nodes(fw.new_cycle(snap, NOW), p, subset)
    for i, (cores, _, requested_pct, _) in enumerate(cluster):
        name = f"n{i}"
        free = cores * 1000 - cores * 10 * requested_pct
        in_subset = i % 2 == 0
        assert (name in failures) == (in_subset and request_milli > free)


@settings(max_examples=40, deadline=None)
@given(
    clusters,
    st.lists(
        st.tuples(st.sampled_from([0, 500, 2000, 6000]), st.integers(0, 24), st.booleans()),
        min_size=1,
        max_size=12,
    ),
)
def test_load_aware_memos_decide_what_a_fresh_plugin_decides_as_pods_are_assumed(cluster, arrivals):
    # One plugin kept across pods (memoized verdicts and scores, updated as nodes change)
    # against a new plugin for every question: same failures, same scores, on chunks of nodes
    # (the memoized path) after every assume, with repeated pod shapes.
    objects = []
    for i, (cores, used, _, age) in enumerate(cluster):
        objects += [
            node(f"n{i}", cpu=str(cores), memory="64Gi"),
            node_metric(f"n{i}", cpu=f"{used}m", memory="1Gi", age=age),
        ]
    snap = build_snapshot(objects, "t")
    kept = Framework([LoadAwareScheduling()])
    names = list(snap.nodes)
    for k, (request_milli, where, prod) in enumerate(arrivals):
        spec = pod(f"p{k}", requests={"cpu": f"{request_milli}m", "memory": "1Gi"})
        spec["spec"]["priority"] = 9500 if prod else 5500
        p = parse_pod(spec, "pod")
        chunk = [snap.nodes[n] for n in names[: max(1, len(names) // 3)]]
        fresh = Framework([LoadAwareScheduling()])
        for fw in (kept, fresh):
            fw.plugins[0].warm(fw.new_cycle(snap, NOW))
        got = [
            (
                fw.plugins[0].filter_nodes(fw.new_cycle(snap, NOW), p, chunk),
                fw.plugins[0].score_nodes(fw.new_cycle(snap, NOW), p, chunk),
            )
            for fw in (kept, fresh)
        ]
        assert got[0] == got[1]
        snap.assume(p, names[where % len(names)])

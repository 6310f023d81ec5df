"""Arbitration: the sort tables of upstream's ``controllers/migration/arbitrator/sort_test.go``
(``TestSortJobsByPod``, ``TestSortJobsByCreationTime``, ``TestSortJobsByController``,
``TestSortJobsByMigratingNum``) and the filters of ``filter.go`` (``maxMigratingPerNode``,
``maxMigratingPerNamespace``, ``maxMigratingPerWorkload``, ``maxUnavailablePerWorkload``,
``maxMigratingGlobally``, expected replicas, object limiters), each held-back job with its
reason."""

from __future__ import annotations

from typing import Any

import pytest

from apis.podmigrationjob import parse_job
from descheduler.cluster import build_cluster
from descheduler.evictor import EvictorFilter
from descheduler.migration.arbitrator import (
    Arbitrator,
    by_controller,
    by_creation_time,
    by_migrating_num,
    by_pod,
)
from descheduler.migration.args import parse_args
from descheduler.migration.filters import MigrationFilter
from descheduler.migration.workloads import max_unavailable
from tests.descheduler.builders import NOW, build_node, build_pod, replica_set, ts


def job(
    name: str,
    pod: str,
    *,
    created: float = NOW,
    phase: str = "",
    passed: bool = False,
    namespace: str = "default",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "creationTimestamp": ts(created)}
    if passed:
        meta["annotations"] = {"descheduler.koordinator.sh/passed-arbitration": "true"}
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": meta,
        "spec": {"podRef": {"namespace": namespace, "name": pod, "uid": f"uid-{namespace}-{pod}"}},
    }
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def names(jobs: list[Any]) -> list[str]:
    return [j.name for j in jobs]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [f"test-job-{i}" for i in range(10)]),
        ([9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [f"test-job-{i}" for i in range(9, -1, -1)]),
        ([], []),
        (
            [8, 7, 5, 4, 9, 2, 3, 11],
            [f"test-job-{i}" for i in (5, 6, 3, 2, 1, 0, 4, 7)],
        ),
    ],
)
def test_sort_jobs_by_pod(order: list[int], expected: list[str]) -> None:
    jobs = [parse_job(job(f"test-job-{i}", f"test-pod-{i}")) for i in range(len(order))]
    rank = {f"test-pod-{i}": o for i, o in enumerate(order)}
    got = by_pod(jobs, lambda j: rank[j.spec.pod_ref.name])
    assert names(got) == expected


def test_sort_jobs_by_creation_time_newest_first_and_stable() -> None:
    created = [222222, 222222222, 111111111, 11111, 11111]
    jobs = [parse_job(job(f"test-job-{i + 1}", "p", created=c)) for i, c in enumerate(created)]
    assert names(by_creation_time(jobs)) == [
        "test-job-2",
        "test-job-3",
        "test-job-1",
        "test-job-4",
        "test-job-5",
    ]


@pytest.mark.parametrize(
    ("count", "owners", "expect"),
    [
        (10, {4: 0, 8: 0}, [0, 1, 2, 3, 4, 8, 5, 6, 7, 9]),
        (10, {}, list(range(10))),
        (10, {3: 0, 8: 0, 1: 1, 9: 1}, [0, 1, 9, 2, 3, 8, 4, 5, 6, 7]),
        (5, {2: 0, 3: 0, 4: 0}, [0, 1, 2, 3, 4]),
        (6, {0: 0, 4: 1, 2: 2}, [0, 1, 2, 3, 4, 5]),
    ],
)
def test_sort_jobs_by_controller(count: int, owners: dict[int, int], expect: list[int]) -> None:
    jobs = [parse_job(job(f"test-migration-job-{i}", f"test-pod-{i}")) for i in range(count)]
    owner = {j.name: (f"test-job-{owners[i]}" if i in owners else None) for i, j in enumerate(jobs)}
    assert names(by_controller(jobs, owner)) == [jobs[i].name for i in expect]


@pytest.mark.parametrize(
    ("count", "owners", "migrating", "expect"),
    [
        # (upstream's running and passed-pending jobs reduced to the count per Job they give)
        (10, {4: 0, 8: 0}, {0: 1, 1: 1}, [4, 8, 0, 1, 2, 3, 5, 6, 7, 9]),
        (10, {}, {}, list(range(10))),
        (5, {0: 0, 1: 0, 2: 0, 3: 0, 4: 0}, {0: 1}, [0, 1, 2, 3, 4]),
        (5, {2: 0, 3: 0, 4: 0}, {0: 1}, [2, 3, 4, 0, 1]),
        (6, {2: 0, 3: 1, 5: 0}, {0: 1, 1: 1}, [2, 3, 5, 0, 1, 4]),
        (10, {4: 0, 8: 0, 7: 1}, {0: 1, 1: 2}, [7, 4, 8, 0, 1, 2, 3, 5, 6, 9]),
    ],
)
def test_sort_jobs_by_migrating_num(
    count: int, owners: dict[int, int], migrating: dict[int, int], expect: list[int]
) -> None:
    jobs = [parse_job(job(f"test-migration-job-{i}", f"test-pod-{i}")) for i in range(count)]
    owner = {j.name: (f"test-job-{owners[i]}" if i in owners else None) for i, j in enumerate(jobs)}
    per_job = {f"test-job-{k}": v for k, v in migrating.items()}
    got = by_migrating_num(jobs, owner, lambda uid: per_job.get(uid, 0))
    assert names(got) == [jobs[i].name for i in expect]


@pytest.mark.parametrize(
    ("replicas", "value", "want"),
    [
        (1, None, 1),
        (3, None, 1),
        (4, None, 2),
        (10, None, 2),
        (11, None, 1),
        (50, None, 5),
        (10, 3, 3),
        (10, "30%", 3),
        (5, "10%", 1),  # v1.6: a share rounded down to 0 is one pod
        (2, 5, 2),
        (0, None, 0),
    ],
)
def test_max_unavailable(replicas: int, value: int | str | None, want: int) -> None:
    assert max_unavailable(replicas, value) == want


def arbitration(objects: list[dict[str, Any]], **args: Any) -> tuple[Arbitrator, Any]:
    cluster = build_cluster(objects)
    margs = parse_args(args, "args")
    mfilter = MigrationFilter(cluster, margs, EvictorFilter(cluster, margs), clock=lambda: NOW)
    arb = Arbitrator(cluster, mfilter)
    for j in cluster.jobs.jobs.values():
        if not cluster.jobs.passed(j) and j.effective_phase == "Pending":
            arb.add(j)
    return arb, cluster


def pods_on(node: str, count: int, prefix: str = "p", **kw: Any) -> list[dict[str, Any]]:
    return [build_pod(f"{prefix}{i}", 100, 100, node, **kw) for i in range(count)]


def test_max_migrating_per_node_holds_the_third_job_of_a_node() -> None:
    objects = [build_node("n1"), build_node("n2"), replica_set(replicas=100)]
    objects += pods_on("n1", 4) + pods_on("n2", 1, prefix="q")
    objects += [job(f"j{i}", f"p{i}", created=NOW - i) for i in range(3)]
    objects.append(job("k0", "q0"))
    arb, _ = arbitration(objects)
    out = arb.arbitrate()
    assert sorted(names(out.passed)) == ["j0", "j1", "k0"]
    ((held, reason),) = out.held
    assert held.name == "j2"
    assert reason == "maxMigratingPerNode: node n1 has 2 migrating pod(s), the limit is 2"
    assert "j2" in arb.waiting


def test_running_jobs_count_against_the_node_limit() -> None:
    objects = [build_node("n1"), replica_set(replicas=100), *pods_on("n1", 3)]
    objects += [job("running", "p0", phase="Running"), job("passed", "p1", passed=True)]
    objects.append(job("new", "p2"))
    arb, _ = arbitration(objects)
    out = arb.arbitrate()
    assert names(out.passed) == []
    assert out.held[0][1].startswith("maxMigratingPerNode: node n1 has 2 migrating pod(s)")


def test_max_migrating_per_namespace() -> None:
    objects = [build_node("n1"), build_node("n2"), replica_set(replicas=100)]
    objects += pods_on("n1", 1) + pods_on("n2", 1, prefix="q")
    objects += [job("a", "p0", created=NOW), job("b", "q0", created=NOW - 1)]
    arb, _ = arbitration(objects, maxMigratingPerNamespace=1)
    out = arb.arbitrate()
    assert names(out.passed) == ["a"]
    assert out.held[0][1] == (
        "maxMigratingPerNamespace: namespace default has 1 migrating pod(s), the limit is 1"
    )


def test_max_migrating_globally() -> None:
    objects = [build_node(f"n{i}") for i in range(3)] + [replica_set(replicas=100)]
    objects += [
        build_pod(
            f"p{i}", 100, 100, f"n{i}", namespace=f"ns{i}", owner=("ReplicaSet", "rs", "uid-rs")
        )
        for i in range(3)
    ]
    objects += [replica_set(namespace=f"ns{i}", replicas=100) for i in range(3)]
    objects += [job(f"j{i}", f"p{i}", namespace=f"ns{i}", created=NOW - i) for i in range(3)]
    arb, _ = arbitration(objects, maxMigratingGlobally=2)
    out = arb.arbitrate()
    assert len(out.passed) == 2
    assert out.held[0][1] == "maxMigratingGlobally: 2 pod(s) are migrating, the limit is 2"


def test_a_workload_limits_its_migrating_and_unavailable_pods() -> None:
    objects = [build_node(f"n{i}") for i in range(4)] + [replica_set(replicas=4)]
    objects += [build_pod(f"p{i}", 100, 100, f"n{i}") for i in range(4)]
    objects += [job(f"j{i}", f"p{i}", created=NOW - i) for i in range(4)]
    arb, _ = arbitration(objects)
    out = arb.arbitrate()
    # 4 replicas: 2 may migrate at once
    assert len(out.passed) == 2
    assert out.held[0][1] == (
        "maxMigratingPerWorkload: workload ReplicaSet/rs has 2 migrating pod(s), the limit is 2"
    )


def test_unready_pods_count_as_unavailable() -> None:
    objects = [build_node(f"n{i}") for i in range(4)] + [replica_set(replicas=4)]
    objects += [build_pod(f"p{i}", 100, 100, f"n{i}", ready=i > 1) for i in range(4)]
    objects.append(job("j", "p3"))
    arb, _ = arbitration(objects)
    out = arb.arbitrate()
    assert out.held[0][1] == (
        "maxUnavailablePerWorkload: workload ReplicaSet/rs has 2 unavailable pod(s), the limit is 2"
    )


@pytest.mark.parametrize(("replicas", "args"), [(1, {}), (2, {"maxUnavailablePerWorkload": 2})])
def test_a_job_whose_workload_cannot_spare_a_pod_fails(replicas: int, args: dict[str, Any]) -> None:
    objects = [build_node("n1"), replica_set(replicas=replicas), *pods_on("n1", 1), job("j", "p0")]
    arb, _ = arbitration(objects, **args)
    out = arb.arbitrate()
    ((failed, reason),) = out.failed
    assert failed.name == "j"
    assert reason.startswith(f"workload ReplicaSet/rs has {replicas} expected replica(s)")
    assert "j" not in arb.waiting


def test_a_daemonset_pods_job_fails_with_the_evictor_reason() -> None:
    objects = [build_node("n1"), *pods_on("n1", 1, owner=("DaemonSet", "ds", "uid-ds"))]
    objects.append(job("j", "p0"))
    arb, _ = arbitration(objects)
    out = arb.arbitrate()
    assert out.failed[0][1] == "pod is a DaemonSet pod"


def test_a_job_whose_pod_is_gone_passes_arbitration() -> None:
    arb, _ = arbitration([build_node("n1"), job("j", "nowhere")])
    assert names(arb.arbitrate().passed) == ["j"]


def test_the_workload_object_limiter_holds_the_next_eviction_for_its_window() -> None:
    now = [1000.0]
    objects = [build_node(f"n{i}") for i in range(3)] + [replica_set(replicas=3)]
    objects += [build_pod(f"p{i}", 100, 100, f"n{i}") for i in range(3)]
    cluster = build_cluster([*objects, job("j", "p1")])
    margs = parse_args({}, "args")  # workload limiter: 5m window
    mfilter = MigrationFilter(cluster, margs, EvictorFilter(cluster, margs), clock=lambda: now[0])
    mfilter.track_evicted(cluster.pod("default", "p0"))  # type: ignore[arg-type]
    arb = Arbitrator(cluster, mfilter)
    arb.add(cluster.jobs.get("j"))  # type: ignore[arg-type]
    out = arb.arbitrate()
    assert out.held[0][1] == (
        "objectLimiters.workload: workload ReplicaSet/rs was descheduled recently"
    )
    now[0] += 300  # 3 replicas: 1 eviction per 5 minutes
    assert names(arb.arbitrate().passed) == ["j"]


def test_lower_priority_pods_jobs_are_considered_first() -> None:
    objects = [build_node("n1"), replica_set(replicas=100)]
    objects += [
        build_pod("prod", 100, 100, "n1", priority=9500),
        build_pod("batch", 100, 100, "n1", priority=5500, qos_class="BestEffort"),
        build_pod("mid", 100, 100, "n1", priority=7500),
    ]
    objects += [
        job("jp", "prod", created=NOW),
        job("jb", "batch", created=NOW - 10),
        job("jm", "mid", created=NOW - 5),
    ]
    arb, _ = arbitration(objects, maxMigratingPerNode=1)
    out = arb.arbitrate()
    assert out.order == ["jb", "jm", "jp"]
    assert names(out.passed) == ["jb"]

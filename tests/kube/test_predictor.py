"""The peak predictor: histogram arithmetic, predictions for known samples, checkpoints."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from apis.crdschema import validate
from apis.extension import KubeQOS, QoSClass
from apis.quantity import int_value, milli_value
from apis.slo import NodeSLOSpec
from koordlet.metriccache import MetricCache, Sample, SeriesKey
from koordlet.metriccache import series as s
from koordlet.reporter.histogram import (
    CPU_BUCKETS,
    MEMORY_BUCKETS,
    DecayingHistogram,
    ExponentialBuckets,
)
from koordlet.reporter.nodemetric import NodeMetricReporter
from koordlet.reporter.predictor import PeakPredictor, PredictorConfig
from koordlet.statesinformer.kube import CollectPolicy
from koordlet.statesinformer.model import PodInfo
from kubeclient.client import KubeClient, Obj
from tests.kubefake import FakeApiServer

NOW = 1_800_000_000.0
DAY = 86400.0
GiB = 2**30
HOUR = 3600.0


def _end(buckets: ExponentialBuckets, value: float) -> float:
    """Where a percentile landing in ``value``'s bucket answers: the start of the next one."""
    return buckets.bucket_start(buckets.find_bucket(value) + 1)


# Histogram arithmetic --------------------------------------------------------------------------
def test_a_sample_one_half_life_newer_weighs_twice_as_much() -> None:
    h = DecayingHistogram(CPU_BUCKETS, half_life=HOUR)
    h.add_sample(1.0, 1.0, NOW)
    h.add_sample(4.0, 1.0, NOW + HOUR)
    old, new = CPU_BUCKETS.find_bucket(1.0), CPU_BUCKETS.find_bucket(4.0)
    assert h.weights[new] == pytest.approx(2 * h.weights[old])
    assert h.total == pytest.approx(h.weights[old] + h.weights[new])
    # one third of the weight sits at 1 core: p30 ends in its bucket, p50 in the newer one
    assert h.percentile(0.30) == pytest.approx(_end(CPU_BUCKETS, 1.0))
    assert h.percentile(0.50) == pytest.approx(_end(CPU_BUCKETS, 4.0))
    assert h.percentile(1.0) == pytest.approx(_end(CPU_BUCKETS, 4.0))


def test_renormalizing_after_a_hundred_half_lives_keeps_the_relative_weights() -> None:
    h = DecayingHistogram(CPU_BUCKETS, half_life=60.0)
    h.add_sample(1.0, 1.0, NOW)
    h.add_sample(2.0, 1.0, NOW + 30.0)
    before = h.weights[CPU_BUCKETS.find_bucket(2.0)] / h.weights[CPU_BUCKETS.find_bucket(1.0)]
    reference = h.reference
    h.add_sample(3.0, 1.0, NOW + 30.0 + 101 * 60.0)
    assert h.reference > reference
    # the old samples decayed by 2**-101 and fell below epsilon: only the newest one counts
    assert h.percentile(0.01) == pytest.approx(_end(CPU_BUCKETS, 3.0))
    assert before == pytest.approx(2**0.5)


def test_an_empty_histogram_answers_zero_and_the_last_bucket_has_no_end() -> None:
    h = DecayingHistogram(MEMORY_BUCKETS, half_life=DAY)
    assert h.percentile(0.95) == 0.0
    h.add_sample(float(1 << 45), 1.0, NOW)  # 32 TiB: beyond the 2 TiB range
    last = MEMORY_BUCKETS.num_buckets - 1
    assert h.percentile(0.95) == MEMORY_BUCKETS.bucket_start(last)
    assert MEMORY_BUCKETS.bucket_start(last) >= float(1 << 41)


def test_buckets_grow_by_five_percent() -> None:
    for i in range(2, CPU_BUCKETS.num_buckets - 1):
        width = CPU_BUCKETS.bucket_start(i + 1) - CPU_BUCKETS.bucket_start(i)
        previous = CPU_BUCKETS.bucket_start(i) - CPU_BUCKETS.bucket_start(i - 1)
        assert width == pytest.approx(previous * 1.05)
        assert CPU_BUCKETS.find_bucket(CPU_BUCKETS.bucket_start(i) * 1.0001) == i


# Predictions -----------------------------------------------------------------------------------
def _pod(uid: str, priority: str, *, age: float, cpu: int, mem: int) -> PodInfo:
    return PodInfo(
        uid=uid,
        name=f"pod-{uid}",
        namespace="ns",
        qos=QoSClass.LS,
        kube_qos=KubeQOS.BURSTABLE,
        cgroup_dir=f"kubepods/burstable/pod{uid}",
        priority_class=priority,
        cpu_request_milli=cpu,
        memory_request_bytes=mem,
        created_at=NOW - age,
    )


NODE: Obj = {"metadata": {"name": "node-1"}, "status": {"capacity": {"cpu": "8", "memory": "16Gi"}}}


@dataclass
class Rig:
    tmp: Path
    cache: MetricCache = field(default_factory=lambda: MetricCache(clock=lambda: NOW))
    pods: list[PodInfo] = field(default_factory=list)
    node: Obj | None = field(default_factory=lambda: NODE)

    def predictor(self, **kw: float) -> PeakPredictor:
        config = PredictorConfig(state_dir=str(self.tmp), **kw)  # type: ignore[arg-type]
        return PeakPredictor(
            config, self.cache, lambda: list(self.pods), lambda: self.node, clock=lambda: NOW
        )

    def usage(self, samples: Iterable[tuple[str, str, float]]) -> None:
        batch = [Sample(SeriesKey(metric, entity), v) for metric, entity, v in samples]
        for j in range(6):
            self.cache.append(NOW - 50 + 10 * j, batch)


def _known_rig(tmp_path: Path) -> Rig:
    """A Prod pod using 0.5 cores and 1 GiB of its 2 cores and 4 GiB; the node uses 1 core and
    2 GiB (so the system part is 0.5 cores and 1 GiB); capacity 8 cores and 16 GiB."""
    rig = Rig(tmp_path)
    rig.pods = [_pod("p1", "koord-prod", age=2 * DAY, cpu=2000, mem=4 * GiB)]
    rig.usage(
        [
            (s.POD_CPU_USAGE, s.pod_entity("p1"), 0.5),
            (s.POD_MEMORY_USAGE, s.pod_entity("p1"), float(GiB)),
            (s.NODE_CPU_USAGE, s.NODE, 1.0),
            (s.NODE_MEMORY_USAGE, s.NODE, 2.0 * GiB),
        ]
    )
    return rig


def test_prod_reclaimable_for_known_samples_is_the_smaller_of_both_estimates(
    tmp_path: Path,
) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    p.train(NOW)
    got = p.prod_reclaimable(NOW)
    assert got is not None

    # per pod: p95/p98 of the pod's own model, raised by 10 %
    pod_cpu = int(int(_end(CPU_BUCKETS, 0.5) * 1000) * 1.1)
    pod_mem = int(int(_end(MEMORY_BUCKETS, GiB)) * 1.1)
    by_pod = (min(8000 - pod_cpu, 2000 - pod_cpu), min(16 * GiB - pod_mem, 4 * GiB - pod_mem))
    # per priority: system (0.5 cores, 1 GiB) + koord-prod (same) + none (a 0 sample: bucket 0)
    cpu_parts = 2 * int(_end(CPU_BUCKETS, 0.5) * 1000) + int(_end(CPU_BUCKETS, 0.0) * 1000)
    mem_parts = 2 * int(_end(MEMORY_BUCKETS, GiB)) + int(_end(MEMORY_BUCKETS, 0.0))
    un_cpu, un_mem = int(cpu_parts * 1.1), int(mem_parts * 1.1)
    by_priority = (2000 - un_cpu, 4 * GiB - un_mem)

    assert (got.cpu_milli, got.memory_bytes) == (
        min(by_pod[0], by_priority[0]),
        min(by_pod[1], by_priority[1]),
    )
    assert 600 < got.cpu_milli < 1500  # sanity: about 2 cores - 1.1 x (0.5 + 0.5)
    metric = got.to_metric()["resource"]["resources"]
    assert milli_value(metric["cpu"]) == got.cpu_milli
    assert int_value(metric["memory"]) == got.memory_bytes


def test_a_pod_in_cold_start_lends_nothing(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    rig.pods = [_pod("p1", "koord-prod", age=HOUR, cpu=2000, mem=4 * GiB)]
    p = rig.predictor()
    p.train(NOW)
    got = p.prod_reclaimable(NOW)
    assert got is not None
    assert (got.cpu_milli, got.memory_bytes) == (0, 0)


def test_batch_pods_are_neither_reclaimed_nor_counted(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    rig.pods.append(_pod("b1", "koord-batch", age=2 * DAY, cpu=4000, mem=8 * GiB))
    p = rig.predictor()
    p.train(NOW)
    with_batch = p.prod_reclaimable(NOW)
    rig.pods.pop()
    without = p.prod_reclaimable(NOW)
    assert with_batch == without
    assert "b1" not in p.models  # no samples: skipped as upstream skips a pod without metrics


def test_no_prediction_without_capacity_or_before_training(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    assert p.prod_reclaimable(NOW) is None  # nothing trained: no model for the pod
    p.train(NOW)
    rig.node = None
    assert p.prod_reclaimable(NOW) is None


def test_models_not_trained_for_thirty_minutes_expire(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    p.train(NOW)
    assert "p1" in p.models
    rig.pods = []
    p.expire(NOW + 31 * 60)
    assert "p1" not in p.models


# Checkpoints -----------------------------------------------------------------------------------
def test_a_new_predictor_restores_what_the_old_one_learned(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    old = rig.predictor()
    old.train(NOW)
    old.save(NOW)
    path = tmp_path / "prediction" / "models.json"
    assert json.loads(path.read_text())["version"] == 1
    assert not [f for f in path.parent.iterdir() if f.name != "models.json"]  # no temp files

    new = rig.predictor()
    assert new.load() == len(old.models)
    assert new.prod_reclaimable(NOW) == old.prod_reclaimable(NOW)
    for uid, model in old.models.items():
        assert new.models[uid].cpu.percentile(0.95) == model.cpu.percentile(0.95)
        assert new.models[uid].memory.total == pytest.approx(model.memory.total)


async def test_the_loop_checkpoints_when_cancelled(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    trained = asyncio.Event()

    async def sleep(_: float) -> None:
        if p.trained:
            trained.set()
            await asyncio.Event().wait()  # park until cancelled

    p._sleep = sleep
    task = asyncio.create_task(p.run())
    await asyncio.wait_for(trained.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    restored = rig.predictor()
    assert restored.load() == len(p.models) > 0


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"version": 99, "models": {}}', b"[]", b'{"version": 1, "models": 3}'],
    ids=["garbage", "other-version", "not-an-object", "models-not-a-map"],
)
def test_a_corrupt_checkpoint_is_logged_and_ignored(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "prediction" / "models.json"
    path.parent.mkdir()
    path.write_bytes(content)
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    with caplog.at_level(logging.WARNING, logger="koordlet.reporter.predictor"):
        assert p.load() == 0
    assert "ignored" in caplog.text
    p.train(NOW)
    assert p.prod_reclaimable(NOW) is not None


def test_one_bad_model_is_skipped_and_the_others_kept(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    p.train(NOW)
    doc = json.loads(p.snapshot(NOW))
    doc["models"]["p1"]["cpu"]["buckets"] = {"100000": 1.0}
    path = tmp_path / "prediction" / "models.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    restored = rig.predictor()
    assert restored.load() == len(p.models) - 1
    assert "p1" not in restored.models
    assert "system" in restored.models


def test_the_checkpoint_holds_at_most_max_models(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor(max_models=3)
    p.train(NOW)
    assert len(p.models) > 3
    assert len(json.loads(p.snapshot(NOW))["models"]) == 3


# The NodeMetric ---------------------------------------------------------------------------------
@dataclass
class _States:
    pods: list[PodInfo]
    node_name: str = "node-1"
    collect_policy: CollectPolicy = field(default_factory=CollectPolicy)
    node_slo: NodeSLOSpec = field(default_factory=NodeSLOSpec)

    def node_metric(self) -> Obj | None:
        return {"metadata": {"name": self.node_name}}

    def list_pods(self) -> dict[str, PodInfo]:
        return {p.uid: p for p in self.pods}


async def test_the_reporter_writes_prod_reclaimable_that_validates(
    tmp_path: Path, kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    p.train(NOW)
    kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": {}})
    reporter = NodeMetricReporter(
        kube_client, _States(rig.pods), rig.cache, predictor=p, clock=lambda: NOW
    )
    assert await reporter.report_once()
    stored = kube_api.get("nodemetrics", "node-1")
    assert stored is not None
    expected = p.prod_reclaimable(NOW)
    assert expected is not None
    assert stored["status"]["prodReclaimableMetric"] == expected.to_metric()
    peak = p.prod_peak(NOW)
    assert peak is not None
    assert stored["status"]["prodPeakMetric"] == peak.to_metric()
    assert validate(stored) == []


def test_without_a_prediction_the_field_is_left_out(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()  # untrained: no prediction
    reporter = NodeMetricReporter(
        None,  # type: ignore[arg-type]
        _States(rig.pods),
        rig.cache,
        predictor=p,
        clock=lambda: NOW,
    )
    built = reporter.build()
    assert "prodReclaimableMetric" not in built
    assert "prodPeakMetric" not in built


def test_prod_peak_is_the_smaller_of_both_estimates_with_the_system_and_the_margin(
    tmp_path: Path,
) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    assert p.prod_peak(NOW) is None  # nothing trained: no system model
    p.train(NOW)
    got = p.prod_peak(NOW)
    assert got is not None
    # per pod: system peak + the pod's peak, each raised by 10 %
    sys_cpu = int(int(_end(CPU_BUCKETS, 0.5) * 1000) * 1.1)
    sys_mem = int(int(_end(MEMORY_BUCKETS, GiB)) * 1.1)
    by_pod = (2 * sys_cpu, 2 * sys_mem)
    # per priority: (system + koord-prod + none) raised by 10 %
    cpu_parts = 2 * int(_end(CPU_BUCKETS, 0.5) * 1000) + int(_end(CPU_BUCKETS, 0.0) * 1000)
    mem_parts = 2 * int(_end(MEMORY_BUCKETS, GiB)) + int(_end(MEMORY_BUCKETS, 0.0))
    by_priority = (int(cpu_parts * 1.1), int(mem_parts * 1.1))
    assert (got.cpu_milli, got.memory_bytes) == (
        min(by_pod[0], by_priority[0]),
        min(by_pod[1], by_priority[1]),
    )


def test_prod_peak_counts_the_request_of_a_pod_in_cold_start(tmp_path: Path) -> None:
    rig = _known_rig(tmp_path)
    p = rig.predictor()
    p.train(NOW)
    known = p.prod_peak(NOW)
    rig.pods = [_pod("p1", "koord-prod", age=HOUR, cpu=2000, mem=4 * GiB)]
    cold = p.prod_peak(NOW)
    assert known is not None
    assert cold is not None
    # the per-pod estimate now counts the 2 cores requested instead of the 0.5-core peak, so
    # the per-priority estimate (which the pod's usage is part of) is the smaller one
    assert cold.cpu_milli >= known.cpu_milli
    sys_cpu = int(int(_end(CPU_BUCKETS, 0.5) * 1000) * 1.1)
    assert cold.cpu_milli <= sys_cpu + 2000

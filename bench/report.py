"""NodeMetric reporting cost: CPU time to build one status, and API writes per node per hour.

    python -m bench.report [--json] [--pods 200] [--minutes 30] [--interval 1] [--repeat 20]

Fills a real :class:`~koordlet.metriccache.MetricCache` as the collectors would (node, system,
two NUMA nodes, a host application every ``--interval`` seconds for ``--minutes``; the pods for
the last 10 minutes, their retention), then builds the status ``--repeat`` times with
:func:`koordlet.reporter.nodemetric.build_status` at Koordinator's default collect policy
(300 s average, windows of 5, 10 and 30 minutes).

Writes per hour: the reporter writes once per ``reportIntervalSeconds`` (60 by default, at
least 30) and never more than the token bucket allows (0.1/s with a burst of 2, i.e. 360 an
hour), and only the status subresource: ``writes_per_hour_default`` is 3600/60; the bucket's
ceiling is ``writes_per_hour_limit``. A conflict adds one read and one write (rare: only the
manager's spec updates race with it).

The peak predictor (:mod:`koordlet.reporter.predictor`) is measured on the same cache: one
training round (``predict_train_cpu_ms``, median; every 60 s in the daemon, after 60 rounds so
the histograms hold a history), one ``prodReclaimableMetric`` (``predict_cpu_ms``), and its
checkpoint (``checkpoint_kib``, ``checkpoint_write_ms`` wall time of the atomic write to a
temporary directory).

With ``--json`` the last line is one JSON object: ``build_cpu_ms`` (median CPU time of one
build), ``build_cpu_ms_max``, ``status_kib`` (size of the JSON written), ``pods``, ``samples``,
``writes_per_hour_default``, ``writes_per_hour_limit`` and the predictor's keys above.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid

from apis.extension import KubeQOS, QoSClass
from apis.priority import PRIORITY_BATCH, PRIORITY_PROD
from apis.slo import parse_node_slo
from koordlet.metriccache import MetricCache, Sample, SeriesKey
from koordlet.metriccache import series as s
from koordlet.reporter.nodemetric import STATUS_UPDATE_QPS, build_status
from koordlet.reporter.predictor import PeakPredictor, PredictorConfig
from koordlet.statesinformer.kube import CollectPolicy
from koordlet.statesinformer.model import PodInfo

GiB = 1 << 30
POD_WINDOW_S = 600


def _pods(n: int) -> list[PodInfo]:
    out = []
    for i in range(n):
        uid = str(uuid.UUID(int=i + 1))
        qos = (QoSClass.LS, QoSClass.BE, QoSClass.LSR)[i % 3]
        out.append(
            PodInfo(
                uid=uid,
                name=f"pod-{i}",
                namespace=f"ns-{i % 7}",
                qos=qos,
                kube_qos=KubeQOS.BURSTABLE,
                cgroup_dir=f"kubepods/burstable/pod{uid}",
                priority_class=PRIORITY_BATCH if qos is QoSClass.BE else PRIORITY_PROD,
                cpu_request_milli=2000,
                memory_request_bytes=4 * GiB,
                created_at=1_000_000_000.0,
            )
        )
    return out


def _fill(cache: MetricCache, pods: list[PodInfo], now: float, minutes: int, step: float) -> int:
    ticks = int(minutes * 60 / step)
    count = 0
    for j in reversed(range(ticks)):
        ts = now - j * step
        wave = (j % 37) / 37
        batch = [
            Sample(SeriesKey(s.NODE_CPU_USAGE, s.NODE), 8 + 4 * wave),
            Sample(SeriesKey(s.NODE_MEMORY_USAGE, s.NODE), 40 * GiB * (1 + wave / 10)),
            Sample(SeriesKey(s.SYSTEM_CPU_USAGE, s.SYSTEM), 0.5 + wave),
            Sample(SeriesKey(s.SYSTEM_MEMORY_USAGE, s.SYSTEM), 2 * GiB),
            Sample(SeriesKey(s.NUMA_MEMORY_USAGE, s.numa_entity(0)), 20 * GiB),
            Sample(SeriesKey(s.NUMA_MEMORY_USAGE, s.numa_entity(1)), 21 * GiB),
            Sample(SeriesKey(s.HOST_APP_CPU_USAGE, s.host_app_entity("nginx")), 0.2),
            Sample(SeriesKey(s.HOST_APP_MEMORY_USAGE, s.host_app_entity("nginx")), GiB / 4),
        ]
        if j * step <= POD_WINDOW_S:
            for k, pod in enumerate(pods):
                entity = s.pod_entity(pod.uid)
                batch.append(Sample(SeriesKey(s.POD_CPU_USAGE, entity), 0.05 * (k % 9) + wave))
                batch.append(Sample(SeriesKey(s.POD_MEMORY_USAGE, entity), (k % 13 + 1) * 2**26))
        cache.append(ts, batch)
        count += len(batch)
    return count


def _predictor(
    cache: MetricCache, pods: list[PodInfo], now: float, repeat: int
) -> dict[str, float]:
    node = {"status": {"capacity": {"cpu": "96", "memory": "384Gi"}}}
    with tempfile.TemporaryDirectory() as tmp:
        p = PeakPredictor(PredictorConfig(state_dir=tmp), cache, lambda: pods, lambda: node)
        for k in range(60):  # an hour of history, all at the cache's end (decay is not cost)
            p.train(now - 60 * (60 - k))
        train, predict = [], []
        for _ in range(repeat):
            t0 = time.process_time()
            p.train(now)
            train.append((time.process_time() - t0) * 1000)
            t0 = time.process_time()
            p.prod_reclaimable(now)
            predict.append((time.process_time() - t0) * 1000)
        data = p.snapshot(now)
        w0 = time.perf_counter()
        p.save(now)
        write_ms = (time.perf_counter() - w0) * 1000
    return {
        "predict_train_cpu_ms": round(statistics.median(train), 2),
        "predict_cpu_ms": round(statistics.median(predict), 2),
        "checkpoint_kib": round(len(data) / 1024, 1),
        "checkpoint_write_ms": round(write_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    now = 1_800_000_000.0
    cache = MetricCache(clock=lambda: now)
    pods = _pods(args.pods)
    samples = _fill(cache, pods, now, args.minutes, args.interval)
    apps = parse_node_slo({"hostApplications": [{"name": "nginx", "qos": "LS"}]}, "bench")
    policy = CollectPolicy()
    times = []
    status: dict[str, object] = {}
    for _ in range(args.repeat):
        t0 = time.process_time()
        status = build_status(cache, policy, pods, apps.host_applications, now)
        times.append((time.process_time() - t0) * 1000)
    predictor = _predictor(cache, pods, now, args.repeat)
    result = {
        "build_cpu_ms": round(statistics.median(times), 2),
        "build_cpu_ms_max": round(max(times), 2),
        "status_kib": round(len(json.dumps(status)) / 1024, 1),
        "pods": args.pods,
        "pods_reported": len(status["podsMetric"]),  # type: ignore[arg-type]
        "samples": samples,
        "writes_per_hour_default": 3600 // policy.report_interval_seconds,
        "writes_per_hour_limit": int(3600 * STATUS_UPDATE_QPS),
        **predictor,
    }
    if not args.json:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

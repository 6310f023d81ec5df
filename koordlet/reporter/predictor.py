"""The peak predictor: how much of the Prod pods' requests the node can lend to batch work.

Koordinator's koordlet (``pkg/koordlet/prediction``) trains decaying histograms from the metric
cache and reports ``NodeMetric.status.prodReclaimableMetric``; the manager turns it into the
Mid-tier resources. This module does the same with the same defaults:

**Training** (:meth:`PeakPredictor.train`, every ``training_interval`` = 60 s): for every pod the
average CPU (cores) and memory (bytes, without page cache) over the last interval go into the
pod's model (a CPU histogram with a 12 h half-life and a memory one with 24 h, weight 1 each);
pods without samples are skipped. The node's usage goes into the ``node`` model; the sum over
pods of each priority class into ``priority/<class>`` (``koord-prod``, ``koord-mid``,
``koord-batch``, ``koord-free``, and ``priority/none`` for pods without one), a class with no
pod getting a 0 sample; ``system`` gets the node's usage minus all pods' (never negative).
Models not trained for ``model_expiration`` (30 min) are dropped.

**Prediction** (:meth:`PeakPredictor.prod_reclaimable`): the minimum, per resource, of two
estimates over the pods of priority ``koord-prod`` or none, with peaks scaled by
``1 + safety_margin_percent/100`` (10 %):

- *per pod*: a pod younger than ``cold_start`` (24 h) or of unknown age lends nothing; each
  other pod's peak is its CPU p95 and memory p98; ``reclaimable = sum(max(request - peak, 0))``,
  ``unreclaimable = sum(peak)``; result ``min(capacity - unreclaimable (>= 0), reclaimable)``;
- *per priority*: ``unreclaimable`` is the p95 CPU / p98 memory of ``system`` plus those of the
  ``koord-prod`` and ``none`` priority models; ``reclaimable = max(sum(requests) -
  unreclaimable, 0)``; the same capping by capacity.

Either estimate is impossible (None, and the field is left out of the NodeMetric) when the
Node's capacity is unknown, a non-cold-start Prod pod has no model yet, or ``system`` has none.
Quantities truncate as upstream's ``int64`` conversions do (CPU in milli-cores, memory in
bytes).

**Checkpoint**: ``<state_dir>/prediction/models.json`` (:data:`CHECKPOINT_VERSION`), written
atomically (temporary file, fsync, rename) every ``checkpoint_interval`` (10 min) and when the
loop stops, at most ``max_models`` models; loaded at start, so a restart keeps what was learned
(models of pods that no longer exist expire after the first training). A corrupt, oversized or
other-version file is logged and ignored; one bad model is skipped, the rest kept. Upstream
writes one file per model; the single file here bounds the directory and makes the write atomic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

from apis.priority import PriorityClass
from apis.quantity import format_bytes, format_milli, int_value, milli_value
from apis.records import frozen
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.reporter.histogram import (
    CPU_BUCKETS,
    MEMORY_BUCKETS,
    CheckpointError,
    DecayingHistogram,
)
from koordlet.statesinformer.model import PodInfo
from koordlet.system import atomicfile
from kubeclient.client import Obj

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
"""Format version of ``models.json``; another version is ignored (logged)."""
CHECKPOINT_DIR = "prediction"
"""Directory under the state directory."""
CHECKPOINT_FILE = "models.json"
MAX_CHECKPOINT_BYTES = 16 * 2**20
"""A larger checkpoint file is not read (logged)."""

NODE_UID = "node"
SYSTEM_UID = "system"
KNOWN_PRIORITIES = tuple(PriorityClass)
"""Priority classes with a node-level model (``extension.KnownPriorityClasses``)."""
RECLAIMABLE_PRIORITIES = frozenset({PriorityClass.PROD, PriorityClass.NONE})
"""Whose requests may be reclaimed (``isPriorityClassReclaimableForProd``)."""


def priority_uid(priority: str) -> str:
    return f"priority/{priority or 'none'}"


@frozen
class PredictorConfig:
    """Settings of the peak predictor (Koordinator's ``prediction.Config``)."""

    state_dir: str
    """The koordlet's state directory; the checkpoint lives in ``<state_dir>/prediction/``."""
    cold_start: float = 24 * 3600.0
    """Seconds after creation a pod lends nothing (``--prediction-cold-start-duration``, 24h)."""
    safety_margin_percent: int = 10
    """Peaks are raised by this percentage (``--prediction-safety-margin-percent``, 10)."""
    memory_half_life: float = 24 * 3600.0
    """Half-life of memory samples, s (``--prediction-memory-histogram-decay-halflife``, 24h)."""
    cpu_half_life: float = 12 * 3600.0
    """Half-life of CPU samples, s (``--prediction-cpu-histogram-decay-halflife``, 12h)."""
    training_interval: float = 60.0
    """Seconds between trainings, and the averaging window (``--prediction-training-interval``)."""
    model_expiration: float = 30 * 60.0
    """A model not trained this long is dropped (``--prediction-model-expiration-duration``)."""
    checkpoint_interval: float = 10 * 60.0
    """Seconds between checkpoints (``--prediction-model-checkpoint-interval``, 10m)."""
    max_models: int = 4096
    """Most models a checkpoint holds (the most recently trained are kept)."""

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.state_dir, CHECKPOINT_DIR, CHECKPOINT_FILE)


class Model:
    """The CPU and memory histograms of one pod or node item."""

    __slots__ = ("cpu", "last_updated", "memory")

    def __init__(self, config: PredictorConfig) -> None:
        self.cpu = DecayingHistogram(CPU_BUCKETS, config.cpu_half_life)
        self.memory = DecayingHistogram(MEMORY_BUCKETS, config.memory_half_life)
        self.last_updated = 0.0

    def add(self, cpu: float, memory: float, now: float) -> None:
        self.cpu.add_sample(cpu, 1.0, now)
        self.memory.add_sample(memory, 1.0, now)
        self.last_updated = now

    def peak(self, margin_percent: int) -> tuple[int, int]:
        """``(p95 CPU milli-cores, p98 memory bytes)`` raised by the safety margin."""
        ratio = (100 + margin_percent) / 100
        cpu = int(self.cpu.percentile(0.95) * 1000.0)
        mem = int(self.memory.percentile(0.98))
        return int(cpu * ratio), int(mem * ratio)


@frozen
class Reclaimable:
    """A prediction in CPU and memory: what Prod pods request but will not use, capped by the
    node's capacity (``prodReclaimableMetric``), or the Prod peak (``prodPeakMetric``)."""

    cpu_milli: int
    memory_bytes: int

    def to_metric(self) -> Obj:
        """``prodReclaimableMetric`` (or ``prodPeakMetric``) of a NodeMetric status."""
        return {
            "resource": {
                "resources": {
                    "cpu": format_milli(self.cpu_milli),
                    "memory": format_bytes(self.memory_bytes),
                }
            }
        }


class PeakPredictor:
    """Models per pod and per node item, trained from the metric cache (module docstring).

    :param config: the settings.
    :param cache: the metric cache (read on the event loop: it is not thread-safe).
    :param pods: the pods on this node now.
    :param node: the Node object (for ``status.capacity``), or None while unknown.
    """

    def __init__(
        self,
        config: PredictorConfig,
        cache: MetricCache,
        pods: Callable[[], Iterable[PodInfo]],
        node: Callable[[], Obj | None],
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._cache = cache
        self._pods = pods
        self._node = node
        self._clock = clock
        self._sleep = sleep
        self.models: dict[str, Model] = {}
        self.trained = False
        self._last_checkpoint = clock()

    # Training ---------------------------------------------------------------------------------
    def _usage(
        self, cpu_metric: str, mem_metric: str, entity: str, now: float
    ) -> tuple[float, float] | None:
        start = now - self.config.training_interval
        cpu = self._cache.aggregate(cpu_metric, entity, start, now)
        mem = self._cache.aggregate(mem_metric, entity, start, now)
        if cpu is None or mem is None:
            return None
        return cpu.avg, mem.avg

    def _model(self, uid: str) -> Model:
        model = self.models.get(uid)
        if model is None:
            model = self.models[uid] = Model(self.config)
        return model

    def train(self, now: float | None = None) -> None:
        """One training round (``training()`` upstream), then expiry of stale models."""
        now = self._clock() if now is None else now
        sums: dict[str, tuple[float, float]] = {}
        all_cpu = all_mem = 0.0
        any_pod = False
        for pod in self._pods():
            usage = self._usage(s.POD_CPU_USAGE, s.POD_MEMORY_USAGE, s.pod_entity(pod.uid), now)
            if usage is None:
                continue
            cpu, mem = usage
            self._model(pod.uid).add(cpu, mem, now)
            c0, m0 = sums.get(pod.priority_class, (0.0, 0.0))
            sums[pod.priority_class] = (c0 + cpu, m0 + mem)
            all_cpu, all_mem, any_pod = all_cpu + cpu, all_mem + mem, True
        node = self._usage(s.NODE_CPU_USAGE, s.NODE_MEMORY_USAGE, s.NODE, now)
        if node is None:
            logger.debug("prediction: no node usage in the last %ss", self.config.training_interval)
        else:
            self._model(NODE_UID).add(node[0], node[1], now)
        for priority in KNOWN_PRIORITIES:
            cpu, mem = sums.get(priority.value, (0.0, 0.0))
            self._model(priority_uid(priority.value)).add(cpu, mem, now)
        node_cpu, node_mem = node if node is not None else (0.0, 0.0)
        if any_pod:
            node_cpu, node_mem = max(node_cpu - all_cpu, 0.0), max(node_mem - all_mem, 0.0)
        self._model(SYSTEM_UID).add(node_cpu, node_mem, now)
        self.trained = True
        self.expire(now)

    def expire(self, now: float) -> int:
        """Drop models not trained for ``model_expiration``; how many."""
        stale = [
            uid
            for uid, m in self.models.items()
            if now - m.last_updated > self.config.model_expiration
        ]
        for uid in stale:
            del self.models[uid]
        if stale:
            logger.info("prediction: %d stale models dropped", len(stale))
        return len(stale)

    # Prediction -------------------------------------------------------------------------------
    def _capacity(self) -> tuple[int, int] | None:
        node = self._node()
        capacity = ((node or {}).get("status") or {}).get("capacity") or {}
        try:
            return milli_value(capacity["cpu"]), int_value(capacity["memory"])
        except (KeyError, ValueError):
            return None

    def prod_reclaimable(self, now: float | None = None) -> Reclaimable | None:
        """The prediction for now, or None when it cannot be made (module docstring)."""
        now = self._clock() if now is None else now
        capacity = self._capacity()
        if capacity is None:
            logger.debug("prediction: node capacity unknown")
            return None
        pods = [p for p in self._pods() if p.priority_class in RECLAIMABLE_PRIORITIES]
        by_pod = self._by_pod(pods, capacity, now)
        by_priority = self._by_priority(pods, capacity)
        if by_pod is None or by_priority is None:
            return None
        return Reclaimable(
            min(by_pod[0], by_priority[0]),
            min(by_pod[1], by_priority[1]),
        )

    def prod_peak(self, now: float | None = None) -> Reclaimable | None:
        """The predicted peak of the Prod pods with the system's usage, ``prodPeakMetric``
        (the smaller of two estimates, as the reclaimable prediction), None when it cannot be
        made: *per pod*, the system's peak plus each Prod (or no-class) pod's peak, a pod without
        a valid prediction (cold start, no model) counting its request; *per priority*, the
        system's peak plus those of the ``koord-prod`` and ``none`` priority models. Peaks are
        CPU p95 and memory p98 scaled by the safety margin, as the CRD says consumers expect
        (no extra margin on their side)."""
        now = self._clock() if now is None else now
        system = self.models.get(SYSTEM_UID)
        if system is None:
            return None
        margin = self.config.safety_margin_percent
        pods = [p for p in self._pods() if p.priority_class in RECLAIMABLE_PRIORITIES]
        pod_cpu, pod_mem = system.peak(margin)
        for pod in pods:
            model = self.models.get(pod.uid)
            cold = pod.created_at is None or now - pod.created_at <= self.config.cold_start
            if cold or model is None:
                pod_cpu += pod.cpu_request_milli or 0
                pod_mem += pod.memory_request_bytes or 0
                continue
            cpu, mem = model.peak(margin)
            pod_cpu, pod_mem = pod_cpu + cpu, pod_mem + mem
        by_priority = self._priority_peak(system)
        if by_priority is None:
            return None
        return Reclaimable(min(pod_cpu, by_priority[0]), min(pod_mem, by_priority[1]))

    def _by_pod(
        self, pods: list[PodInfo], capacity: tuple[int, int], now: float
    ) -> tuple[int, int] | None:
        margin = self.config.safety_margin_percent
        rec_cpu = rec_mem = un_cpu = un_mem = 0
        for pod in pods:
            if pod.created_at is None or now - pod.created_at <= self.config.cold_start:
                continue
            model = self.models.get(pod.uid)
            if model is None:
                logger.debug("prediction: no model for pod %s/%s", pod.namespace, pod.name)
                return None
            peak_cpu, peak_mem = model.peak(margin)
            un_cpu += peak_cpu
            un_mem += peak_mem
            rec_cpu += max((pod.cpu_request_milli or 0) - peak_cpu, 0)
            rec_mem += max((pod.memory_request_bytes or 0) - peak_mem, 0)
        return (
            min(max(capacity[0] - un_cpu, 0), rec_cpu),
            min(max(capacity[1] - un_mem, 0), rec_mem),
        )

    def _by_priority(
        self, pods: list[PodInfo], capacity: tuple[int, int]
    ) -> tuple[int, int] | None:
        system = self.models.get(SYSTEM_UID)
        if system is None:
            return None
        req_cpu = sum(p.cpu_request_milli or 0 for p in pods)
        req_mem = sum(p.memory_request_bytes or 0 for p in pods)
        peak = self._priority_peak(system)
        if peak is None:
            return None
        un_cpu, un_mem = peak
        return (
            min(max(capacity[0] - un_cpu, 0), max(req_cpu - un_cpu, 0)),
            min(max(capacity[1] - un_mem, 0), max(req_mem - un_mem, 0)),
        )

    def _priority_peak(self, system: Model) -> tuple[int, int] | None:
        """The system's peak plus those of the reclaimable priority models (``koord-prod`` and
        ``none``), unscaled, then scaled by the safety margin; None while a priority model is
        missing."""
        cpu, mem = system.peak(0)
        for priority in sorted(RECLAIMABLE_PRIORITIES):
            model = self.models.get(priority_uid(priority))
            if model is None:
                return None
            model_cpu, model_mem = model.peak(0)
            cpu, mem = cpu + model_cpu, mem + model_mem
        ratio = (100 + self.config.safety_margin_percent) / 100
        return int(cpu * ratio), int(mem * ratio)

    # Checkpoints ------------------------------------------------------------------------------
    def snapshot(self, now: float) -> bytes:
        """The checkpoint document (built on the event loop; written elsewhere)."""
        newest = sorted(self.models.items(), key=lambda kv: kv[1].last_updated, reverse=True)
        doc = {
            "version": CHECKPOINT_VERSION,
            "savedAt": now,
            "models": {
                uid: {
                    "lastUpdated": m.last_updated,
                    "cpu": m.cpu.to_json(),
                    "memory": m.memory.to_json(),
                }
                for uid, m in newest[: self.config.max_models]
            },
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    def save(self, now: float | None = None) -> None:
        """Write the checkpoint atomically (blocking: call from a thread)."""
        write_atomic(
            self.config.checkpoint_path, self.snapshot(self._clock() if now is None else now)
        )

    def load(self) -> int:
        """Restore the models of the checkpoint (blocking); how many. Never raises for a bad
        file: it is logged and ignored."""
        path = self.config.checkpoint_path
        try:
            if os.path.getsize(path) > MAX_CHECKPOINT_BYTES:
                logger.warning(
                    "prediction checkpoint %s is over %d bytes; ignored", path, MAX_CHECKPOINT_BYTES
                )
                return 0
            with open(path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as err:
            logger.warning("prediction checkpoint %s unreadable, ignored: %s", path, err)
            return 0
        if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            logger.warning(
                "prediction checkpoint %s has version %r, not %d; ignored",
                path,
                version,
                CHECKPOINT_VERSION,
            )
            return 0
        raw = doc.get("models")
        if not isinstance(raw, dict):
            logger.warning("prediction checkpoint %s has no models; ignored", path)
            return 0
        loaded = bad = 0
        for uid, data in list(raw.items())[: self.config.max_models]:
            try:
                model = _load_model(self.config, data)
            except CheckpointError as err:
                bad += 1
                logger.debug("prediction checkpoint: model %s skipped: %s", uid, err)
                continue
            self.models[str(uid)] = model
            loaded += 1
        logger.info("prediction: %d models restored from %s (%d skipped)", loaded, path, bad)
        return loaded

    # The loop ---------------------------------------------------------------------------------
    async def checkpoint(self) -> None:
        data = self.snapshot(self._clock())
        try:
            await asyncio.to_thread(write_atomic, self.config.checkpoint_path, data)
        except OSError as err:
            logger.warning(
                "prediction checkpoint %s not written: %s", self.config.checkpoint_path, err
            )
        self._last_checkpoint = self._clock()

    async def step(self) -> None:
        """One training, and a checkpoint when one is due."""
        self.train()
        if self._clock() - self._last_checkpoint >= self.config.checkpoint_interval:
            await self.checkpoint()

    async def run(self) -> NoReturn:
        """Restore, then train every ``training_interval`` until cancelled (a last checkpoint
        is written on the way out)."""
        await asyncio.to_thread(self.load)
        try:
            while True:
                await self._sleep(self.config.training_interval)
                try:
                    await self.step()
                except Exception:
                    logger.exception("prediction training failed")
        finally:
            if self.trained:
                await asyncio.shield(self.checkpoint())


def _load_model(config: PredictorConfig, data: object) -> Model:
    if not isinstance(data, dict):
        raise CheckpointError("model is not an object")
    model = Model(config)
    model.cpu.load_json(data.get("cpu"))
    model.memory.load_json(data.get("memory"))
    try:
        model.last_updated = float(data.get("lastUpdated", 0.0))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"lastUpdated: {err}") from err
    return model


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, whole."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    atomicfile.write_atomic(path, data, prefix=".models-")

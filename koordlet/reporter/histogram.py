"""Exponentially bucketed histograms whose sample weights decay with age.

The peak predictor (:mod:`koordlet.reporter.predictor`) keeps one per resource per model, as
Koordinator's koordlet does with the Vertical Pod Autoscaler's ``util/histogram``:

- **buckets** (:class:`ExponentialBuckets`): bucket ``i`` starts at
  ``first * (ratio**i - 1) / (ratio - 1)``; bucket 0 starts at 0; a value past the last start
  falls in the last bucket, which has no upper bound. CPU uses a first bucket of 0.025 cores and
  memory one of 5 MiB, both growing by 5 % a bucket up to 1024 cores and 2 TiB;
- **percentile** ``p``: walk the buckets from the lowest with weight, adding weights until the
  sum reaches ``p`` times the total; the answer is the *end* of that bucket (the start of the
  next), or the start of the last bucket when the walk ends there. An empty histogram answers 0;
- **decay** (:class:`DecayingHistogram`): a sample at time ``t`` weighs
  ``weight * 2**((t - reference) / half_life)``, so a sample one half-life older counts half as
  much. When ``t`` runs more than 100 half-lives past the reference, the reference moves to
  ``t`` rounded to a multiple of the half-life and every weight is scaled by ``2**-shift``,
  so the numbers stay finite (buckets whose weight fell below ``epsilon`` stop counting as the
  lowest or highest with weight).

Checkpoints are plain data (:meth:`DecayingHistogram.to_json`): the reference time, the total
weight and the non-empty buckets, with full float precision.
"""

from __future__ import annotations

import math
from typing import Any

from apis.records import frozen

MAX_DECAY_EXPONENT = 100
"""Half-lives a sample may run ahead of the reference before the weights are renormalized."""


@frozen
class ExponentialBuckets:
    """Bucket boundaries growing by ``ratio`` from ``first_bucket_size`` up to ``max_value``."""

    max_value: float
    """Values at and above the last bucket's start share the last bucket."""
    first_bucket_size: float
    """Width of bucket 0 (``[0, first_bucket_size)``)."""
    ratio: float
    """Each bucket is this many times wider than the one before (> 1)."""
    epsilon: float
    """Weights below this count as nothing."""

    @property
    def num_buckets(self) -> int:
        growth = self.max_value * (self.ratio - 1) / self.first_bucket_size + 1
        return math.ceil(math.log(growth, self.ratio)) + 1

    def bucket_start(self, bucket: int) -> float:
        if bucket == 0:
            return 0.0
        return self.first_bucket_size * (self.ratio**bucket - 1) / (self.ratio - 1)

    def find_bucket(self, value: float) -> int:
        if value < self.first_bucket_size:
            return 0
        bucket = int(math.log(value * (self.ratio - 1) / self.first_bucket_size + 1, self.ratio))
        return min(bucket, self.num_buckets - 1)


MIN_SAMPLE_WEIGHT = 0.1
"""Koordinator's ``MinSampleWeight``; :data:`EPSILON` derives from it."""
EPSILON = 0.001 * MIN_SAMPLE_WEIGHT
"""Smallest weight a bucket keeps."""
BUCKET_GROWTH = 0.05
"""Each bucket 5 % wider than the previous (``DefaultHistogramBucketSizeGrowth``)."""

CPU_BUCKETS = ExponentialBuckets(1024.0, 0.025, 1.0 + BUCKET_GROWTH, EPSILON)
"""CPU in cores: 0.025 to 1024."""
MEMORY_BUCKETS = ExponentialBuckets(float(1 << 41), float(5 << 20), 1.0 + BUCKET_GROWTH, EPSILON)
"""Memory in bytes: 5 MiB to 2 TiB."""


class CheckpointError(ValueError):
    """A histogram checkpoint does not fit these buckets or is malformed."""


class DecayingHistogram:
    """A histogram of ``buckets`` whose samples lose half their weight every ``half_life`` s."""

    __slots__ = ("_max", "_min", "buckets", "half_life", "reference", "total", "weights")

    def __init__(self, buckets: ExponentialBuckets, half_life: float) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        self.buckets = buckets
        self.half_life = half_life
        self.weights = [0.0] * buckets.num_buckets
        self.total = 0.0
        self.reference = 0.0
        """Unix seconds at which a sample weighs exactly its weight."""
        self._min = buckets.num_buckets - 1
        self._max = 0

    @property
    def empty(self) -> bool:
        return self.weights[self._min] < self.buckets.epsilon

    def decay_factor(self, ts: float) -> float:
        """The multiplier of a sample taken at ``ts`` (renormalizing first when needed)."""
        if ts - self.reference > MAX_DECAY_EXPONENT * self.half_life:
            self._shift_reference(ts)
        return float(2.0 ** ((ts - self.reference) / self.half_life))

    def add_sample(self, value: float, weight: float, ts: float) -> None:
        if weight < 0:
            raise ValueError(f"negative sample weight {weight}")
        w = weight * self.decay_factor(ts)
        bucket = self.buckets.find_bucket(max(value, 0.0))
        self.weights[bucket] += w
        self.total += w
        if self.weights[bucket] >= self.buckets.epsilon:
            self._min = min(self._min, bucket)
            self._max = max(self._max, bucket)

    def percentile(self, p: float) -> float:
        if self.empty:
            return 0.0
        threshold = p * self.total
        partial = 0.0
        bucket = self._min
        while bucket < self._max:
            partial += self.weights[bucket]
            if partial >= threshold:
                break
            bucket += 1
        if bucket < self.buckets.num_buckets - 1:
            return self.buckets.bucket_start(bucket + 1)
        return self.buckets.bucket_start(bucket)

    def scale(self, factor: float) -> None:
        for b in range(self._min, self._max + 1):
            self.weights[b] *= factor
        self.total *= factor
        self._update_bounds()

    def _shift_reference(self, ts: float) -> None:
        new_ref = round(ts / self.half_life) * self.half_life
        exponent = round((self.reference - new_ref) / self.half_life)
        self.scale(math.ldexp(1.0, exponent))
        self.reference = new_ref

    def _update_bounds(self) -> None:
        eps = self.buckets.epsilon
        last = self.buckets.num_buckets - 1
        self._min = next((b for b in range(last + 1) if self.weights[b] >= eps), last)
        self._max = next((b for b in range(last, -1, -1) if self.weights[b] >= eps), 0)

    # Checkpoints ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "total": self.total,
            "buckets": {str(b): w for b, w in enumerate(self.weights) if w > 0.0},
        }

    def load_json(self, data: object) -> None:
        """Replace the content with a :meth:`to_json` value. Raises :class:`CheckpointError`
        (and leaves the histogram unchanged) when it does not fit."""
        if not isinstance(data, dict):
            raise CheckpointError("histogram is not an object")
        try:
            reference = float(data["reference"])
            total = float(data["total"])
            raw = data["buckets"]
            if not isinstance(raw, dict):
                raise CheckpointError("buckets is not an object")
            weights = [0.0] * self.buckets.num_buckets
            for key, value in raw.items():
                b, w = int(key), float(value)
                if not 0 <= b < len(weights) or not math.isfinite(w) or w < 0:
                    raise CheckpointError(f"bucket {key}={value} out of range")
                weights[b] = w
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"malformed histogram: {err!r}") from err
        if not (math.isfinite(reference) and math.isfinite(total) and total >= 0):
            raise CheckpointError("reference or total is not a finite number")
        self.weights = weights
        self.total = total
        self.reference = reference
        self._update_bounds()

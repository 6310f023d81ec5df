"""CPU normalization and resource amplification of one node (Koordinator's ``CPUNormalization``
and ``ResourceAmplification`` node resource plugins).

CPU normalization (``plugins/cpunormalization/plugin.go`` upstream): the node's CPU model,
hyper-threading and turbo state (the koordlet's ``node.koordinator.sh/cpu-basic-info``) pick a
ratio from ``cpu-normalization-config``'s ``ratioModel``: ``baseRatio`` (neither),
``hyperThreadEnabledRatio``, ``turboEnabledRatio`` or ``hyperThreadTurboEnabledRatio`` (both).
When the model has no entry, or its entry lacks that ratio, ``defaultRatio`` applies if set
(``getCPUNormalizationRatio``). The node label ``node.koordinator.sh/cpu-normalization-enabled``
overrides the strategy's ``enable``; disabled writes ``1.00``. The ratio chosen must be in
[1.0, 5.0] (``isCPUNormalizationRatioValid``), else the node keeps its annotation. The ratio goes
to the node annotation ``node.koordinator.sh/cpu-normalization-ratio`` (two decimals) and
batch-cpu is amplified by it.

Resource amplification (``plugins/resourceamplification/plugin.go``): the
``resource-amplification-config`` ratios (when enabled), the CPU ratio (1 when unset or not
positive) multiplied by the normalization ratio and kept when above 1; only these final ratios
must be ≥ 1 (``validateResourceAmplificationRatios``). Written as JSON with two decimals (the
``extension.Ratio`` type's ``MarshalJSON``) to ``node.koordinator.sh/resource-amplification-ratio``;
the scheduler then sees allocatable x ratio.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from apis.configuration import (
    CPU_NORMALIZATION_MAX_RATIO,
    CPU_NORMALIZATION_MIN_RATIO,
    CPUNormalizationConfig,
    CPUNormalizationStrategy,
    ResourceAmplificationConfig,
)
from apis.gobool import parse_go_bool
from apis.manager_keys import ANNOTATION_CPU_BASIC_INFO, LABEL_CPU_NORMALIZATION_ENABLED
from apis.nodetopo import CPUBasicInfo
from apis.records import frozen

DEFAULT_RATIO_TEXT = "1.00"
"""The annotation value written when normalization is off."""


@frozen
class NormalizationResult:
    """The outcome for one node."""

    ratio: float | None
    """The ratio to write; None when none can be worked out (the annotation is left alone)."""
    reason: str
    """How the ratio was chosen, or why there is none."""

    @property
    def annotation(self) -> str | None:
        """The annotation value (two decimals), or None."""
        return None if self.ratio is None else ratio_text(self.ratio)


def _label_enabled(labels: Mapping[str, str]) -> bool | None:
    raw = labels.get(LABEL_CPU_NORMALIZATION_ENABLED)
    if raw is None:
        return None
    try:
        return parse_go_bool(raw)
    except ValueError:
        raise ValueError(
            f"label {LABEL_CPU_NORMALIZATION_ENABLED}={raw!r} is not a boolean"
        ) from None


def normalization_ratio(
    config: CPUNormalizationConfig,
    labels: Mapping[str, str],
    basic_info: CPUBasicInfo | None,
) -> NormalizationResult:
    """The CPU normalization ratio of a node with ``labels`` and ``basic_info``."""
    strategy = config.for_node(labels)
    try:
        label = _label_enabled(labels)
    except ValueError as err:
        return NormalizationResult(None, str(err))
    enabled = label if label is not None else bool(strategy.enable)
    if not enabled:
        return NormalizationResult(1.0, "disabled: ratio 1.00")
    if basic_info is None:  # upstream requires the CPU basic info before any ratio, default too
        return NormalizationResult(None, f"no {ANNOTATION_CPU_BASIC_INFO} for the node")
    ratio, how = ratio_from_model(strategy, basic_info)
    if ratio is None:
        if strategy.default_ratio is None:
            return NormalizationResult(None, how)
        ratio, how = strategy.default_ratio, f"defaultRatio ({how})"
    if not CPU_NORMALIZATION_MIN_RATIO <= ratio <= CPU_NORMALIZATION_MAX_RATIO:
        return NormalizationResult(
            None,
            f"{how}: {ratio:g} outside "
            f"[{CPU_NORMALIZATION_MIN_RATIO:g}, {CPU_NORMALIZATION_MAX_RATIO:g}]: rejected",
        )
    return NormalizationResult(ratio, how)


def ratio_from_model(
    strategy: CPUNormalizationStrategy, info: CPUBasicInfo
) -> tuple[float | None, str]:
    """The ``ratioModel`` ratio of ``info``'s model and state, and how it was chosen (or why
    there is none): upstream's ``getCPUNormalizationRatioFromModel``."""
    model = strategy.ratio_model.get(info.cpu_model)
    if model is None:
        return None, f"no ratio for CPU model {info.cpu_model!r}"
    ht, turbo = info.hyper_thread_enabled, info.turbo_enabled
    name, ratio = (
        ("hyperThreadTurboEnabledRatio", model.hyper_thread_turbo_enabled_ratio)
        if ht and turbo
        else ("hyperThreadEnabledRatio", model.hyper_thread_enabled_ratio)
        if ht
        else ("turboEnabledRatio", model.turbo_enabled_ratio)
        if turbo
        else ("baseRatio", model.base_ratio)
    )
    if ratio is None:
        return None, f"missing {name} for CPU model {info.cpu_model!r}"
    return ratio, f"{name} of {info.cpu_model!r}"


def amplify_batch_cpu(milli_cores: int, ratio: float | None) -> int:
    """batch-cpu after normalization: milli-cores x ratio when the ratio exceeds 1, rounded up to
    a whole number as the Node's integer quantity (upstream ``MultiplyMilliQuant``)."""
    if ratio is None or ratio <= 1.0:
        return milli_cores
    scaled = int(float(milli_cores * 1000) * ratio)  # in thousandths of the written integer
    return -(-scaled // 1000)


def ratio_text(value: float) -> str:
    """A ratio as upstream writes it: two decimals (``strconv.FormatFloat(f, 'f', 2, 64)``;
    both round the exact binary value half to even)."""
    return f"{value:.2f}"


def amplification_ratios(
    config: ResourceAmplificationConfig, labels: Mapping[str, str], cpu_ratio: float | None
) -> tuple[dict[str, float], str | None]:
    """Resource → final amplification ratio of a node, and the annotation JSON (None: remove
    it). ``cpu_ratio`` is the node's CPU normalization ratio. Raises ``ValueError`` naming the
    resource when a final ratio is below 1 (upstream then leaves the annotation alone)."""
    strategy = config.for_node(labels)
    ratios = dict(strategy.ratios) if strategy.enable else {}
    cpu = ratios.get("cpu", 0.0)
    final = cpu if cpu > 0 else 1.0
    if cpu_ratio is not None and cpu_ratio > 0:
        final *= cpu_ratio
    if final > 1:
        ratios["cpu"] = final
    for name, value in sorted(ratios.items()):
        if value < 1 or not math.isfinite(value):
            detail = (
                f" (cpu {cpu:g} x normalization {cpu_ratio:g})"
                if name == "cpu" and cpu_ratio
                else ""
            )
            raise ValueError(
                f"final amplification ratio of {name} is {value:g}{detail}, must be >= 1"
            )
    if not ratios:
        return ratios, None
    body = ",".join(f"{json.dumps(k)}:{ratio_text(v)}" for k, v in sorted(ratios.items()))
    return ratios, "{" + body + "}"


def amplified(value: int, ratio: float) -> int:
    """An allocatable value as the scheduler sees it under an amplification ratio."""
    return int(float(value) * ratio) if ratio > 1 else value

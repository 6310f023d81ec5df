"""The koordlet's feature gates: Koordinator's names, stages and defaults, Kubernetes' syntax.

The table mirrors ``pkg/features/koordlet_features.go`` upstream (koordinator-sh/koordinator),
so ``--feature-gates=CPUBurst=false,PSICollector=true`` means here what it means to the Go
koordlet. ``AllAlpha`` and ``AllBeta`` work as in Kubernetes' ``component-base``: they set every
gate of that stage that is not named explicitly, and an explicit setting always wins.

Each gate also says whether this implementation acts on it yet (:attr:`FeatureSpec.implemented`):
a gate that is known but not implemented is accepted, so a Koordinator command line keeps working,
and ``/debug/config`` shows it as "known but not implemented here" instead of pretending.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from apis.gobool import parse_go_bool
from apis.records import frozen
from koordlet.errors import ConfigError

FLAG = "--feature-gates"
"""The flag name, used as the error source for gate strings from the command line."""


class Stage(StrEnum):
    """Maturity of a gate, spelled as Kubernetes prints it."""

    ALPHA = "ALPHA"
    BETA = "BETA"


@frozen
class FeatureSpec:
    """One gate of the table."""

    default: bool
    """Value when neither the gate nor ``AllAlpha``/``AllBeta`` is set (Koordinator's default)."""
    stage: Stage
    """Koordinator's pre-release stage of the gate."""
    implemented: bool
    """True when koordinator-py acts on the gate; False: accepted and shown, but nothing here
    reads it yet."""
    summary: str
    """One line on what the gate turns on."""


ALL_ALPHA = "AllAlpha"
"""Kubernetes' special gate: the value of every alpha gate that is not set explicitly."""
ALL_BETA = "AllBeta"
"""Kubernetes' special gate: the value of every beta gate that is not set explicitly."""
_SPECIAL = {ALL_ALPHA: Stage.ALPHA, ALL_BETA: Stage.BETA}
_ALL_OF = {stage: name for name, stage in _SPECIAL.items()}

_A, _B = Stage.ALPHA, Stage.BETA

KOORDLET_FEATURES: Mapping[str, FeatureSpec] = MappingProxyType(
    {
        "AuditEvents": FeatureSpec(False, _A, False, "record recent koordlet events for audit"),
        "AuditEventsHTTPHandler": FeatureSpec(
            False, _A, False, "serve the audited events on the koordlet port"
        ),
        "BECPUSuppress": FeatureSpec(
            True, _B, True, "shrink the cpuset of BE pods when node CPU usage is high"
        ),
        "BECPUManager": FeatureSpec(
            False, _A, False, "manage BE cpusets (exclusive with BECPUSuppress)"
        ),
        "BECPUEvict": FeatureSpec(False, _A, True, "evict BE pods starved of CPU"),
        "BEMemoryEvict": FeatureSpec(False, _A, True, "evict BE pods on node memory pressure"),
        "MemoryEvict": FeatureSpec(
            False, _A, True, "evict opted-in pods under a priority on node memory pressure"
        ),
        "MemoryAllocatableEvict": FeatureSpec(
            False, _A, True, "evict batch/mid pods whose memory requests exceed the allocatable"
        ),
        "CPUEvict": FeatureSpec(
            False, _A, True, "evict opted-in pods under a priority on node CPU usage"
        ),
        "CPUAllocatableEvict": FeatureSpec(
            False, _A, True, "evict batch/mid pods whose CPU requests exceed the allocatable"
        ),
        "CPUBurst": FeatureSpec(True, _B, True, "set cfs burst; scale CFS quota of throttled pods"),
        "SystemConfig": FeatureSpec(
            False, _A, True, "tune vm.min_free_kbytes and vm.watermark_scale_factor"
        ),
        "RdtResctrl": FeatureSpec(True, _B, True, "LLC and memory-bandwidth isolation by resctrl"),
        "CgroupReconcile": FeatureSpec(False, _A, True, "reconcile QoS cgroup settings"),
        "NodeTopologyReport": FeatureSpec(
            True, _B, True, "report the node topology as a NodeResourceTopology object"
        ),
        "Accelerators": FeatureSpec(False, _A, True, "GPU support (NVIDIA)"),
        "NetDevices": FeatureSpec(False, _A, False, "report network devices (RDMA)"),
        "CPICollector": FeatureSpec(False, _A, True, "collect cycles-per-instruction by perf"),
        "Libpfm4": FeatureSpec(False, _A, False, "use libpfm4 for the CPI collector"),
        "PSICollector": FeatureSpec(False, _A, True, "collect pressure stall information"),
        "BlkIOReconcile": FeatureSpec(False, _A, True, "block I/O QoS (blkio/io cgroup files)"),
        "ColdPageCollector": FeatureSpec(
            False, _A, True, "collect cold page memory (kidled, or DAMON on mainline kernels)"
        ),
        "HugePageReport": FeatureSpec(False, _A, False, "report hugepages per NUMA node"),
        # Koordinator HEAD's runtime hook gate of the oom_score_adj hot update (PR #3139).
        "OOMScoreAdj": FeatureSpec(
            False, _A, True, "set oom_score_adj of pods' processes from their annotations"
        ),
        # Ours, not Koordinator's (docs/configuration.md marks it so).
        "BEEvictionCondition": FeatureSpec(
            False,
            _A,
            True,
            "(ours) Node condition koordinator.sh/BEEvictionPressure while evicting BE pods",
        ),
        # The runtime hooks' gates, which upstream adds to the koordlet's
        # (pkg/koordlet/runtimehooks/config.go: defaultRuntimeHooksFG).
        "GroupIdentity": FeatureSpec(True, _B, True, "runtime hook: group identity (bvt)"),
        "CPUSetAllocator": FeatureSpec(
            True, _B, True, "runtime hook: cpuset of LSR/LSE pods from the scheduler"
        ),
        "GPUEnvInject": FeatureSpec(False, _A, True, "runtime hook: allocated GPUs' env"),
        "RDMADeviceInject": FeatureSpec(False, _A, False, "runtime hook: allocated RDMA devices"),
        "BatchResource": FeatureSpec(
            True, _B, True, "runtime hook: cgroups of batch and mid pods from their resources"
        ),
        "CPUNormalization": FeatureSpec(
            False, _A, False, "runtime hook: cpu cgroups of CPU-normalized LS pods"
        ),
        "CoreSched": FeatureSpec(False, _A, True, "runtime hook: core scheduling cookies"),
        "TerwayQoS": FeatureSpec(
            False, _A, True, "runtime hook: terway-qos's bandwidth and pod files (Terway CNI)"
        ),
        "TCNetworkQoS": FeatureSpec(
            False, _A, True, "network QoS by tc: the HTB tree and pods' net_cls class ids"
        ),
        "Resctrl": FeatureSpec(
            False, _A, True, "runtime hook: a started container's threads into its class's group"
        ),
    }
)
"""Every koordlet gate Koordinator defines (upstream ``defaultKoordletFeatureGates``, commit
1366c7d, and the runtime hooks' ``defaultRuntimeHooksFG``), with whether this implementation acts
on it; plus ``BEEvictionCondition``, ours (alpha, off)."""

DEFAULTS: Mapping[str, bool] = MappingProxyType(
    {name: spec.default for name, spec in KOORDLET_FEATURES.items()}
)
"""Koordinator's default value of each gate."""


def _check(overrides: Mapping[str, object], source: str) -> None:
    """ConfigError naming ``source`` and the gate for an unknown name or a non-bool value."""
    for name, value in overrides.items():
        if name not in KOORDLET_FEATURES and name not in _SPECIAL:
            known = ", ".join(known_names())
            raise ConfigError(f"unknown feature gate (known: {known})", source=source, field=name)
        if not isinstance(value, bool):
            raise ConfigError(f"must be true or false, got {value!r}", source=source, field=name)


class FeatureGates(Mapping[str, bool]):
    """The effective value of every known gate; immutable.

    Iterates over :data:`KOORDLET_FEATURES` names (``AllAlpha``/``AllBeta`` are inputs, not gates).
    Equality compares effective values, so two spellings of the same settings are equal.
    """

    __slots__ = ("_overrides", "_values")

    def __init__(self, overrides: Mapping[str, bool] | None = None, *, source: str = "") -> None:
        """Gates with ``overrides`` (gate or ``AllAlpha``/``AllBeta`` → value) applied to the
        defaults. Raises ConfigError naming ``source`` and the gate for an unknown name."""
        given = dict(overrides or {})
        _check(given, source)
        values = {}
        for name, spec in KOORDLET_FEATURES.items():
            values[name] = given.get(name, given.get(_ALL_OF[spec.stage], spec.default))
        self._overrides: Mapping[str, bool] = MappingProxyType(given)
        self._values: Mapping[str, bool] = MappingProxyType(values)

    @property
    def overrides(self) -> Mapping[str, bool]:
        """What was set explicitly, ``AllAlpha``/``AllBeta`` included."""
        return self._overrides

    def enabled(self, name: str) -> bool:
        """Whether gate ``name`` is on; KeyError for a name that is not a koordlet gate."""
        return self._values[name]

    def merged(self, overrides: Mapping[str, bool], *, source: str = "") -> FeatureGates:
        """New gates with ``overrides`` applied over this one's explicit settings."""
        return FeatureGates({**self._overrides, **overrides}, source=source)

    def __getitem__(self, name: str) -> bool:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(frozenset(self._values.items()))

    def __repr__(self) -> str:
        return f"FeatureGates({dict(self._overrides)!r})"

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, "_values"):
            raise AttributeError("FeatureGates is immutable")
        object.__setattr__(self, name, value)


def known_names() -> list[str]:
    """Every name ``--feature-gates`` accepts: ``AllAlpha``, ``AllBeta`` and the gates, sorted."""
    return sorted([*_SPECIAL, *KOORDLET_FEATURES])


def parse_overrides(text: str, *, source: str = FLAG) -> dict[str, bool]:
    """``"A=true,B=false"`` → ``{"A": True, "B": False}``, Kubernetes' ``--feature-gates`` syntax.

    Items are comma-separated ``Name=bool``; blanks around items are ignored; a later item wins.
    Raises ConfigError naming ``source`` and the gate for a missing or bad value or an unknown gate.
    """
    result: dict[str, bool] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(
                "missing bool value (want Name=true|false)", source=source, field=name
            )
        try:
            result[name] = parse_go_bool(raw.strip())
        except ValueError as err:
            raise ConfigError(str(err), source=source, field=name) from err
    _check(result, source)
    return result


def parse_feature_gates(text: str, *, source: str = FLAG) -> FeatureGates:
    """Gates from a ``--feature-gates`` string applied to Koordinator's defaults."""
    return FeatureGates(parse_overrides(text, source=source), source=source)


def describe(gates: FeatureGates) -> list[dict[str, Any]]:
    """One JSON-ready row per gate for ``/debug/config``: name, enabled, default, stage, whether
    it was set explicitly (directly or by ``AllAlpha``/``AllBeta``) and whether it is
    implemented here."""
    rows = []
    for name, spec in KOORDLET_FEATURES.items():
        rows.append(
            {
                "name": name,
                "enabled": gates.enabled(name),
                "default": spec.default,
                "stage": spec.stage.value,
                "explicit": name in gates.overrides or _ALL_OF[spec.stage] in gates.overrides,
                "implemented": spec.implemented,
                "summary": spec.summary,
            }
        )
    return rows


def help_lines() -> list[str]:
    """``Name=true|false (STAGE - default=...)`` per accepted name, as Kubernetes lists them."""
    lines = [
        f"{name}=true|false ({stage.value} - default=false)" for name, stage in _SPECIAL.items()
    ]
    for name, spec in sorted(KOORDLET_FEATURES.items()):
        note = "" if spec.implemented else ", not implemented here"
        default = str(spec.default).lower()
        lines.append(f"{name}=true|false ({spec.stage.value} - default={default}{note})")
    return lines


def gate_enabled(config: object, gate: str) -> bool:
    """Whether ``config.feature_gates`` has ``gate`` on; False without gates or for a gate this
    koordlet does not define (a strategy's optional sub-feature)."""
    gates = getattr(config, "feature_gates", None)
    if gates is None:
        return False
    try:
        return bool(gates.enabled(gate))
    except KeyError:
        return False

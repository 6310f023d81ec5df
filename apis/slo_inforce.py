"""The NodeSLO in force: what the koordlet works with, parsed once per change of the NodeSLO.

Both NodeSLO sources (the local file, the API server) build a :class:`NodeSLOInForce` with
:func:`node_slo_in_force` whenever their document changes, and the strategies read its typed
sections (``in_force.resource_used_threshold_with_be.cpu_suppress_threshold_percent``): nothing
downstream parses, thaws or caches a NodeSLO again.

The rule, section by section (the four strategy sections of :data:`apis.slo_strategies.SECTIONS`
and ``hostApplications`` with ``extensions``), as upstream's states informer merges each section
on its own over ``pkg/util/sloconfig``'s defaults (``mergeNodeSLOSpec``):

- a section that parses is read over Koordinator's defaults (:data:`DEFAULTS`), never over the
  previous value: a field removed from the NodeSLO goes back to its default;
- a section that does not parse keeps the value in force before (the last good one; the defaults
  when none was good yet) and is recorded as rejected, with the :class:`~apis.errors.FieldError`
  naming the field and when it was first rejected; the other sections are unaffected, so a bad
  ``cpuBurstStrategy`` does not throw away a good ``resourceUsedThresholdWithBE``;
- a document that is not a NodeSLO at all (not an object, another ``kind``, an unknown section
  name in strict mode) raises :class:`~apis.slo.SchemaError`: the caller keeps everything.

:meth:`NodeSLOInForce.newly_rejected` says which rejections a change brought, so that a source
logs (and posts an Event) once per change, not once per round. ``docs/apis.md`` has the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from types import MappingProxyType
from typing import Any

from apis.errors import FieldError
from apis.records import frozen
from apis.slo import (
    HostApplication,
    NodeSLOSpec,
    SchemaError,
    parse_spec,
    read_document,
    spec_of,
)
from apis.slo_strategies import (
    SECTIONS,
    CPUBurstStrategy,
    NodeSLOStrategies,
    ResourceQOSStrategy,
    ResourceThresholdStrategy,
    SystemStrategy,
    parse_section,
    strategies_of,
)

__all__ = [
    "ALL_SECTIONS",
    "CPU_BURST_STRATEGY",
    "DEFAULTS",
    "HOST_APPLICATIONS",
    "RESOURCE_QOS_STRATEGY",
    "RESOURCE_USED_THRESHOLD_WITH_BE",
    "SYSTEM_STRATEGY",
    "NodeSLOInForce",
    "Rejection",
    "node_slo_in_force",
    "read_node_slo_file",
]

RESOURCE_USED_THRESHOLD_WITH_BE = "resourceUsedThresholdWithBE"
RESOURCE_QOS_STRATEGY = "resourceQOSStrategy"
CPU_BURST_STRATEGY = "cpuBurstStrategy"
SYSTEM_STRATEGY = "systemStrategy"
HOST_APPLICATIONS = "hostApplications"
"""The section of the host applications (with ``extensions``, which travel with it)."""
ALL_SECTIONS: tuple[str, ...] = (*SECTIONS, HOST_APPLICATIONS)
assert ALL_SECTIONS == (
    RESOURCE_USED_THRESHOLD_WITH_BE,
    RESOURCE_QOS_STRATEGY,
    CPU_BURST_STRATEGY,
    SYSTEM_STRATEGY,
    HOST_APPLICATIONS,
)
"""Every section that is kept or rejected on its own, by JSON name."""

DEFAULTS: NodeSLOStrategies = strategies_of(NodeSLOSpec())
"""The defaults in force: Koordinator's ``DefaultNodeSLOSpecConfig`` as the koordlet applies it
(each section's dataclass defaults, ``apis.slo_strategies`` and ``apis.slo_qos``, with the
disabled QoS parts cleared). The one place a strategy's missing setting comes from."""


@frozen
class Rejection:
    """Why a section of the NodeSLO was not taken."""

    error: FieldError
    """The first bad value: its source (file or ``NodeSLO <node>``), field path and message."""
    since: float
    """Wall-clock seconds when this error was first seen (it stays while the same error does)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``/debug/qos``)."""
        return {
            "status": "rejected",
            "field": self.error.field,
            "error": str(self.error),
            "since": self.since,
        }


@frozen
class NodeSLOInForce:
    """The NodeSLO the koordlet works with: each section typed and complete, and which sections
    were rejected (they hold their last good value). Immutable; a change builds a new one."""

    strategies: NodeSLOStrategies = DEFAULTS
    """The four strategy sections in force."""
    host_applications: tuple[HostApplication, ...] = ()
    """``spec.hostApplications`` in force."""
    extensions: Mapping[str, Any] | None = None
    """``spec.extensions`` in force (read-only, free-form)."""
    rejected: Mapping[str, Rejection] = field(default_factory=lambda: MappingProxyType({}))
    """Section (JSON name) → why the NodeSLO's value of it was rejected; absent when taken."""
    present: frozenset[str] = frozenset()
    """The sections the document holds (absent ones are the defaults): a strategy that acts only
    on a configured section (resctrl) asks here."""
    source: str = ""
    """Where the document came from (the file, ``NodeSLO <node>``); empty for the defaults."""
    generation: int = 0
    """Counts the changes of what is in force (0: the defaults, nothing read yet)."""

    @property
    def resource_used_threshold_with_be(self) -> ResourceThresholdStrategy:
        """``resourceUsedThresholdWithBE`` in force."""
        return self.strategies.resource_used_threshold_with_be

    @property
    def resource_qos_strategy(self) -> ResourceQOSStrategy:
        """``resourceQOSStrategy`` in force (disabled parts of LSR/LS/BE cleared)."""
        return self.strategies.resource_qos_strategy

    @property
    def cpu_burst_strategy(self) -> CPUBurstStrategy:
        """``cpuBurstStrategy`` in force."""
        return self.strategies.cpu_burst_strategy

    @property
    def system_strategy(self) -> SystemStrategy:
        """``systemStrategy`` in force."""
        return self.strategies.system_strategy

    def status(self, section: str) -> dict[str, Any]:
        """``{"status": "ok"}`` or the section's rejection, JSON-ready."""
        rejection = self.rejected.get(section)
        return {"status": "ok"} if rejection is None else rejection.as_dict()

    def newly_rejected(self, before: NodeSLOInForce | None) -> dict[str, Rejection]:
        """The rejections that ``before`` did not have (a new section, or a new error): what a
        change should log, count and report once."""
        old = before.rejected if before is not None else {}
        return {
            section: rejection
            for section, rejection in self.rejected.items()
            if section not in old or str(old[section].error) != str(rejection.error)
        }

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (``/debug/qos``): source, generation, each section's status."""
        return {
            "source": self.source,
            "generation": self.generation,
            "sections": {section: self.status(section) for section in ALL_SECTIONS},
        }


def node_slo_in_force(
    doc: object,
    *,
    source: str,
    strict: bool,
    now: float,
    previous: NodeSLOInForce | None = None,
) -> NodeSLOInForce:
    """What is in force after reading ``doc`` (a NodeSLO object or its spec), section by section
    as the module docstring says, over :data:`DEFAULTS` and ``previous`` (the value in force so
    far; None: the defaults). ``strict`` (local files) makes unknown field names errors; without
    it (the API server, possibly a newer CRD) they are logged and ignored. The generation
    advances when anything in force or rejected changed. Raises :class:`~apis.slo.SchemaError`
    when ``doc`` is not a NodeSLO at all."""
    base = previous if previous is not None else NodeSLOInForce()
    spec, prefix = spec_of(doc, source, strict=strict)
    rejected: dict[str, Rejection] = {}

    def reject(section: str, err: SchemaError) -> None:
        old = base.rejected.get(section)
        same = old is not None and str(old.error) == str(err)
        rejected[section] = old if same and old is not None else Rejection(err, now)

    strategies: dict[str, Any] = {}
    for section, attr in SECTIONS.items():
        try:
            strategies[attr] = parse_section(
                section, spec.get(section), path=prefix + section, source=source, strict=strict
            )
        except SchemaError as err:
            strategies[attr] = getattr(base.strategies, attr)
            reject(section, err)
    apps, extensions = base.host_applications, base.extensions
    try:
        parsed = parse_spec(
            {k: spec[k] for k in (HOST_APPLICATIONS, "extensions") if k in spec},
            source,
            prefix=prefix,
            strict=strict,
        )
        apps, extensions = parsed.host_applications, parsed.extensions
    except SchemaError as err:
        reject(HOST_APPLICATIONS, err)
    built = NodeSLOInForce(
        strategies=NodeSLOStrategies(**strategies),
        host_applications=apps,
        extensions=extensions,
        rejected=MappingProxyType(rejected),
        present=frozenset(k for k in ALL_SECTIONS if spec.get(k) is not None),
        source=source,
        generation=base.generation,
    )
    changed = (
        built.strategies != base.strategies
        or built.host_applications != base.host_applications
        or built.extensions != base.extensions
        or dict(built.rejected) != dict(base.rejected)
        or built.present != base.present
        or built.source != base.source
    )
    return replace(built, generation=base.generation + 1) if changed else built


def read_node_slo_file(
    path: str, *, now: float, previous: NodeSLOInForce | None = None
) -> NodeSLOInForce:
    """:func:`node_slo_in_force` of a local YAML or JSON file (a whole NodeSLO or just its spec;
    an empty file is an empty spec), strict: unknown field names are errors. A bad section is
    recorded in ``rejected``, as for any document; raises :class:`~apis.slo.SchemaError` naming
    the file when it cannot be read or is not a NodeSLO."""
    doc = read_document(path)
    return node_slo_in_force(
        {} if doc is None else doc, source=path, strict=True, now=now, previous=previous
    )

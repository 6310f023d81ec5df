"""The ``--config`` file: plugin args and weights, KubeSchedulerConfiguration style.

Accepted shapes (YAML or JSON):

- a ``KubeSchedulerConfiguration``: the profile whose ``schedulerName`` is ``koord-scheduler``
  (else the first profile) gives ``pluginConfig`` (``[{name, args}]``), score weights
  (``plugins.score.enabled[].weight``, ``plugins.multiPoint.enabled[].weight``) and disabled
  plugins (``plugins.filter.disabled[].name`` and ``multiPoint``: the plugin does not run;
  ``plugins.score.disabled``: it filters but does not score; ``"*"`` is ignored);
- a bare plugin args file: ``{"pluginConfig": [{name, args}]}``.

``percentageOfNodesToScore`` (top level, or in the chosen profile, which wins) is read for the
standalone scheduler.

Feature gates come from the command line (``--feature-gates ElasticQuotaGuaranteeUsage=true``,
:func:`parse_feature_gates`), as koord-scheduler takes them; only the gates this scheduler
implements are accepted.

``args.apiVersion`` and ``args.kind`` (``LoadAwareSchedulingArgs``) are accepted and dropped.
Plugins this scheduler does not have are ignored (a stock configuration names many), but a
plugin of the table with bad args is an error naming the file and field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from apis.records import frozen
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins import elasticquota
from scheduler_plugins.table import PLUGINS, PluginFactory, build_framework

SCHEDULER_NAME = "koord-scheduler"
GC_GEN0_THRESHOLD = 50_000
"""Allocations between young-generation collections in a process that is the scheduler's
alone (``koord-scheduler run``, the extender; CPython's default is 700)."""
ELASTIC_QUOTA_GUARANTEE_USAGE = "ElasticQuotaGuaranteeUsage"
"""Koordinator's feature gate (default off): what a quota uses is guaranteed to it."""
FEATURE_GATES = {ELASTIC_QUOTA_GUARANTEE_USAGE: False}
"""The gates koord-scheduler here implements, with their defaults."""


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` as kube components read ``--feature-gates``; raises
    :class:`InputError` naming an unknown gate or a value that is not a bool."""
    gates = dict(FEATURE_GATES)
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES))
            raise InputError("--feature-gates", name, f"unknown feature gate (known: {known})")
        if value.lower() not in ("true", "false"):
            raise InputError("--feature-gates", name, f"must be true or false, got {value!r}")
        gates[name] = value.lower() == "true"
    return gates


@frozen
class SchedulerConfig:
    """What the config file says."""

    plugin_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Plugin name → its args (``pluginConfig``)."""
    weights: dict[str, int] = field(default_factory=dict)
    """Plugin name → score weight."""
    disabled: tuple[str, ...] = ()
    """Plugins switched off."""
    source: str = "<defaults>"
    """The file, for error messages."""
    percentage_of_nodes_to_score: int = 0
    """``percentageOfNodesToScore`` (top level, or the profile's, which wins): the standalone
    scheduler stops filtering once this share of the nodes is found feasible; 0 is
    kube-scheduler's adaptive default, 100 every node. The extender scores what it is sent."""
    feature_gates: dict[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    """``--feature-gates``: Koordinator's gates this scheduler implements."""

    def framework(self, table: Mapping[str, PluginFactory] = PLUGINS) -> Framework:
        """The framework this configuration describes. Raises :class:`InputError`."""
        if self.feature_gates.get(ELASTIC_QUOTA_GUARANTEE_USAGE) and elasticquota.NAME in table:
            table = {**table, elasticquota.NAME: elasticquota.build_guaranteeing}
        return build_framework(
            table,
            self.plugin_args,
            weights=self.weights,
            disabled=self.disabled,
            source=self.source,
        )


def parse_config(doc: Any, source: str) -> SchedulerConfig:
    """A :class:`SchedulerConfig` from a decoded document. Raises :class:`InputError`."""
    if doc is None:
        return SchedulerConfig(source=source)
    if not isinstance(doc, Mapping):
        raise InputError(source, "", "must be an object")
    where = ""
    profile: Mapping[str, Any] = doc
    profiles = doc.get("profiles")
    if profiles is not None:
        if not isinstance(profiles, list) or not profiles:
            raise InputError(source, "profiles", "must be a non-empty list")
        index = next(
            (
                i
                for i, p in enumerate(profiles)
                if isinstance(p, Mapping) and p.get("schedulerName") == SCHEDULER_NAME
            ),
            0,
        )
        if not isinstance(profiles[index], Mapping):
            raise InputError(source, f"profiles[{index}]", "must be an object")
        profile = profiles[index]
        where = f"profiles[{index}]."
    plugin_args: dict[str, dict[str, Any]] = {}
    entries = profile.get("pluginConfig") or []
    if not isinstance(entries, list):
        raise InputError(source, where + "pluginConfig", "must be a list")
    for i, entry in enumerate(entries):
        ewhere = f"{where}pluginConfig[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise InputError(source, ewhere, "needs a name")
        args = entry.get("args") or {}
        if not isinstance(args, Mapping):
            raise InputError(source, ewhere + ".args", "must be an object")
        plugin_args[entry["name"]] = {
            k: v for k, v in args.items() if k not in ("apiVersion", "kind")
        }
    weights: dict[str, int] = {}
    disabled: list[str] = []
    plugins = profile.get("plugins") or {}
    if not isinstance(plugins, Mapping):
        raise InputError(source, where + "plugins", "must be an object")
    for point, sets in plugins.items():
        pwhere = f"{where}plugins.{point}"
        if not isinstance(sets, Mapping):
            raise InputError(source, pwhere, "must be an object")
        for i, item in enumerate(sets.get("enabled") or []):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise InputError(source, f"{pwhere}.enabled[{i}]", "needs a name")
            weight = item.get("weight")
            if weight is not None and point in ("score", "multiPoint"):
                if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
                    raise InputError(
                        source, f"{pwhere}.enabled[{i}].weight", f"must be >= 0, got {weight!r}"
                    )
                weights[item["name"]] = weight
        for i, item in enumerate(sets.get("disabled") or []):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise InputError(source, f"{pwhere}.disabled[{i}]", "needs a name")
            if item["name"] == "*":
                continue
            if point in ("filter", "multiPoint"):
                disabled.append(item["name"])
            elif point == "score":  # still filters, no longer scores
                weights[item["name"]] = 0
    percentage = 0
    for holder, pwhere in ((doc, ""), (profile, where)):
        value = holder.get("percentageOfNodesToScore")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
            raise InputError(
                source, pwhere + "percentageOfNodesToScore", f"must be 0..100, got {value!r}"
            )
        percentage = value
    return SchedulerConfig(plugin_args, weights, tuple(disabled), source, percentage)


def load_config(path: Path) -> SchedulerConfig:
    """:func:`parse_config` of a file; the framework is built once to validate the args."""
    source = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as err:
        raise InputError(source, "", f"cannot read: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise InputError(source, "", f"not YAML: {err}") from err
    cfg = parse_config(doc, source)
    cfg.framework()
    return cfg

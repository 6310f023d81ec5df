"""The ``--config`` file: a ``DeschedulerConfiguration`` (``descheduler/v1alpha2``).

Read as upstream's ``v1alpha2`` types and ``SetDefaults_DeschedulerConfiguration`` read it
(``pkg/descheduler/apis/config/v1alpha2/types.go``, ``defaults.go``, ``default_plugins.go``):

- ``profiles``: none means one profile; a single unnamed profile is ``koord-descheduler``. Each
  profile's ``plugins.{deschedule,balance,evict,filter}`` merges its ``enabled`` and ``disabled``
  lists over the defaults (evict: ``MigrationController``) as ``mergePluginSet`` does (``"*"``
  disables every default; an enabled default keeps its place). ``pluginConfig[].args`` are each
  plugin's args (the table's parser: defaults, validation); a plugin enabled without args gets its
  defaults.
- ``dryRun``, ``deschedulingInterval`` (0: one round at start), ``nodeSelector`` (a LabelSelector
  over the nodes of every round), ``maxNoOfPodsToEvictPerNode``, ``...PerNamespace``,
  ``...Total``.
- ``leaderElection`` (``LeaderElectionConfiguration``): ``leaderElect`` (true),
  ``leaseDuration`` 15s, ``renewDeadline`` 10s, ``retryPeriod`` 2s, ``resourceLock`` leases,
  ``resourceName`` koord-descheduler, ``resourceNamespace`` koordinator-system.

Every error is a :class:`~descheduler.errors.ConfigError` naming the file and the field
(``descheduler.yaml: profiles[0].pluginConfig[1].args.highThresholds.cpu: ...``); the CLI exits 2.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from apis.records import frozen
from descheduler.errors import ConfigError
from descheduler.readers import Fields
from descheduler.selectors import Selector
from descheduler.table import DEFAULT_EVICTOR, EVICT, PLUGINS, POINTS, PluginSpec

logger = logging.getLogger(__name__)

API_VERSION = "descheduler/v1alpha2"
KIND = "DeschedulerConfiguration"
DEFAULT_PROFILE = "koord-descheduler"
LEASE_NAME = "koord-descheduler"
LEASE_NAMESPACE = "koordinator-system"


@frozen
class LeaderElection:
    """``leaderElection`` (``componentbaseconfig.LeaderElectionConfiguration``)."""

    leader_elect: bool = True
    """``leaderElect``: run only while holding the Lease."""
    lease_duration_s: float = 15.0
    """``leaseDuration``."""
    renew_deadline_s: float = 10.0
    """``renewDeadline``."""
    retry_period_s: float = 2.0
    """``retryPeriod``."""
    resource_name: str = LEASE_NAME
    """``resourceName``: the Lease's name."""
    resource_namespace: str = LEASE_NAMESPACE
    """``resourceNamespace``: the Lease's namespace."""


@frozen
class ProfileConfig:
    """One profile: its plugins per extension point and their parsed args."""

    name: str
    """``name``."""
    plugins: Mapping[str, tuple[str, ...]]
    """Extension point → enabled plugin names, in order."""
    args: Mapping[str, Any]
    """Plugin name → its parsed args."""
    node_selector: Selector | None = None
    """``nodeSelector`` of the profile."""


@frozen
class DeschedulerConfig:
    """The whole configuration after defaulting."""

    profiles: tuple[ProfileConfig, ...]
    """``profiles``."""
    dry_run: bool = False
    """``dryRun`` (the ``--dry-run`` flag also sets it): decide and log, create nothing."""
    interval_s: float = 0.0
    """``deschedulingInterval`` in seconds; 0: one round at start."""
    node_selector: Selector | None = None
    """``nodeSelector``."""
    max_pods_per_node: int | None = None
    """``maxNoOfPodsToEvictPerNode``."""
    max_pods_per_namespace: int | None = None
    """``maxNoOfPodsToEvictPerNamespace``."""
    max_pods_total: int | None = None
    """``maxNoOfPodsToEvictTotal``."""
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    """``leaderElection``."""
    source: str = "<defaults>"
    """The file, for messages."""

    def migration_args(self) -> Any:
        """The MigrationController's args: the first profile that has them, else defaults."""
        for p in self.profiles:
            if DEFAULT_EVICTOR in p.args:
                return p.args[DEFAULT_EVICTOR]
        return PLUGINS[DEFAULT_EVICTOR].parse_args(None, self.source, "")


def _plugin_set(
    f: Fields, point: str, defaults: tuple[str, ...], table: Mapping[str, PluginSpec]
) -> tuple[str, ...]:
    """``mergePluginSet``."""
    ps = f.sub(point)
    ps.warn_unknown(("enabled", "disabled"))
    disabled = {item.string("name") for item in ps.items("disabled")}
    enabled: list[tuple[str, str]] = []
    for item in ps.items("enabled"):
        item.warn_unknown(("name", "weight"))
        name = item.string("name")
        if not name:
            continue  # upstream's default deschedule set holds one empty entry
        spec = table.get(name)
        if spec is None:
            raise item.error("name", f"unknown plugin {name!r} (known: {', '.join(table)})")
        if point not in spec.points:
            raise item.error("name", f"plugin {name} is not a {point} plugin")
        enabled.append((name, item.where("name")))
    out: list[str] = []
    replaced: set[str] = set()
    names = [n for n, _ in enabled]
    if "*" not in disabled:
        for d in defaults:
            if d in disabled:
                continue
            out.append(d)
            if d in names:
                replaced.add(d)
    out.extend(n for n in names if n not in replaced)
    return tuple(dict.fromkeys(out))


def _profile(f: Fields, table: Mapping[str, PluginSpec]) -> ProfileConfig:
    f.warn_unknown(("name", "plugins", "pluginConfig", "nodeSelector"))
    plugins = f.sub("plugins")
    plugins.warn_unknown(POINTS)
    sets = {
        point: _plugin_set(plugins, point, (DEFAULT_EVICTOR,) if point == EVICT else (), table)
        for point in POINTS
    }
    enabled = {n for names in sets.values() for n in names}
    raw_args: dict[str, tuple[Any, str]] = {}
    for item in f.items("pluginConfig"):
        name = item.string("name")
        if not name:
            raise item.error("name", "required")
        if name not in table:
            logger.warning("%s: %s: args of unknown plugin %s ignored", f.source, item.path, name)
            continue
        raw_args[name] = (item.raw.get("args"), item.where("args"))
    args: dict[str, Any] = {}
    for name in enabled | set(raw_args):
        raw, where = raw_args.get(name, (None, f.where("pluginConfig")))
        args[name] = table[name].parse_args(raw, f.source, where)
    return ProfileConfig(
        name=f.string("name"),
        plugins=sets,
        args=args,
        node_selector=f.label_selector("nodeSelector"),
    )


def _leader(f: Fields) -> LeaderElection:
    le = f.sub("leaderElection")
    le.warn_unknown(
        (
            "leaderElect",
            "leaseDuration",
            "renewDeadline",
            "retryPeriod",
            "resourceLock",
            "resourceName",
            "resourceNamespace",
        )
    )
    lock = le.string("resourceLock", "leases")
    if lock != "leases":
        raise le.error("resourceLock", f"only leases, not {lock!r}")
    out = LeaderElection(
        leader_elect=le.boolean("leaderElect", True),
        lease_duration_s=le.duration("leaseDuration", 15.0) or 15.0,
        renew_deadline_s=le.duration("renewDeadline", 10.0) or 10.0,
        retry_period_s=le.duration("retryPeriod", 2.0) or 2.0,
        resource_name=le.string("resourceName") or LEASE_NAME,
        resource_namespace=le.string("resourceNamespace") or LEASE_NAMESPACE,
    )
    if out.leader_elect and not (
        0 < out.retry_period_s < out.renew_deadline_s < out.lease_duration_s
    ):
        raise le.error("", "need 0 < retryPeriod < renewDeadline < leaseDuration")
    return out


def parse_config(
    doc: Any, source: str, table: Mapping[str, PluginSpec] = PLUGINS
) -> DeschedulerConfig:
    """A :class:`DeschedulerConfig` from a decoded document. Raises :class:`ConfigError`."""
    f = Fields(doc, source, "")
    api_version = f.string("apiVersion")
    if api_version and api_version != API_VERSION:
        raise f.error("apiVersion", f"must be {API_VERSION}, got {api_version!r}")
    kind = f.string("kind")
    if kind and kind != KIND:
        raise f.error("kind", f"must be {KIND}, got {kind!r}")
    f.warn_unknown(
        (
            "leaderElection",
            "clientConnection",
            "enableProfiling",
            "enableContentionProfiling",
            "healthzBindAddress",
            "metricsBindAddress",
            "deschedulingInterval",
            "dryRun",
            "profiles",
            "nodeSelector",
            "maxNoOfPodsToEvictPerNode",
            "maxNoOfPodsToEvictPerNamespace",
            "maxNoOfPodsToEvictTotal",
        )
    )
    items = f.items("profiles") or [Fields({}, source, "profiles[0]")]
    profiles = [_profile(p, table) for p in items]
    if len(profiles) == 1 and not profiles[0].name:
        p = profiles[0]
        profiles = [ProfileConfig(DEFAULT_PROFILE, p.plugins, p.args, p.node_selector)]
    names = [p.name for p in profiles]
    for i, p in enumerate(profiles):
        if not p.name:
            raise ConfigError(source, f"profiles[{i}].name", "required when there are several")
        if names.count(p.name) > 1:
            raise ConfigError(source, f"profiles[{i}].name", f"duplicate profile {p.name!r}")
    return DeschedulerConfig(
        profiles=tuple(profiles),
        dry_run=f.boolean("dryRun", False),
        interval_s=f.duration("deschedulingInterval", 0.0) or 0.0,
        node_selector=f.label_selector("nodeSelector"),
        max_pods_per_node=f.integer("maxNoOfPodsToEvictPerNode", None, minimum=0),
        max_pods_per_namespace=f.integer("maxNoOfPodsToEvictPerNamespace", None, minimum=0),
        max_pods_total=f.integer("maxNoOfPodsToEvictTotal", None, minimum=0),
        leader_election=_leader(f),
        source=source,
    )


def default_config() -> DeschedulerConfig:
    """The configuration of no file: one profile, the MigrationController alone."""
    return parse_config({}, "<defaults>")


def load_config(path: Path, table: Mapping[str, PluginSpec] = PLUGINS) -> DeschedulerConfig:
    """Read and parse a YAML or JSON file. Raises :class:`ConfigError` naming the file."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(source, "", f"cannot read: {err.strerror or err}") from err
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(source, "", f"not YAML: {err}") from err
    return parse_config(doc, source, table)

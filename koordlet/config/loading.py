"""Loading the configuration: flags over the YAML file over the defaults (feature gates merged
gate by gate), cross-field checks, the configuration back in the file's schema
(``/debug/config``), and the local NodeSLO file checked at start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from apis.slo import SchemaError, read_document
from apis.slo_inforce import ALL_SECTIONS, NodeSLOInForce, read_node_slo_file
from koordlet.config.convert import boolean, verbosity
from koordlet.config.model import (
    DEFAULT_NODESLO_FILE,
    AuditConfig,
    CgroupConfig,
    CollectConfig,
    KoordletConfig,
    KubeConfig,
    QoSConfig,
    RuntimeHooksConfig,
    ServerConfig,
    default_node_name,
)
from koordlet.config.settings import (
    BY_KEY,
    FEATURE_GATES_KEY,
    SECTIONS,
    SETTINGS,
    Setting,
    attr_of,
    build_parser,
    go_style,
)
from koordlet.errors import ConfigError
from koordlet.features import FLAG as FEATURE_GATES_FLAG
from koordlet.features import FeatureGates, parse_overrides
from koordlet.system.paths import HostPaths


def _convert(setting: Setting, raw: object, source: str, field: str = "") -> Any:
    try:
        return setting.convert(raw)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err), source=source, field=field) from err


def _config_error(err: SchemaError) -> ConfigError:
    return ConfigError(err.message, source=err.source, field=err.field)


def _unknown_key(key: str, path: str) -> ConfigError:
    import difflib  # only for a misspelt key: not worth its import on every start

    known = [*BY_KEY, FEATURE_GATES_KEY, *SECTIONS]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown setting{hint}; see docs/configuration.md", source=path, field=key)


def _file_entries(doc: Mapping[Any, Any], path: str) -> list[tuple[str, Any]]:
    """(key path, value) pairs of a config document; sections are flattened."""
    entries: list[tuple[str, Any]] = []
    for key, value in doc.items():
        if key not in SECTIONS:
            entries.append((str(key), value))
        elif isinstance(value, Mapping):
            entries.extend((f"{key}.{sub}", v) for sub, v in value.items())
        elif value is not None:
            raise ConfigError(f"must be a mapping, got {value!r}", source=path, field=str(key))
    return entries


def _file_gates(value: object, path: str) -> FeatureGates:
    source = f"{path}: {FEATURE_GATES_KEY}"
    if isinstance(value, str):
        return FeatureGates(parse_overrides(value, source=source), source=source)
    if not isinstance(value, Mapping):
        raise ConfigError("must be a mapping of gate: bool", source=path, field=FEATURE_GATES_KEY)
    overrides = {}
    for name, raw in value.items():
        try:
            overrides[str(name)] = boolean(raw)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err), source=source, field=str(name)) from err
    return FeatureGates(overrides, source=source)


def _read_file(
    path: str, values: dict[str, Any], sources: dict[str, tuple[str, str]]
) -> FeatureGates:
    """Converts the settings of config file ``path`` into ``values``; returns its gates."""
    try:
        doc = read_document(path)
    except SchemaError as err:
        raise _config_error(err) from err
    if doc is None:
        return FeatureGates()
    if not isinstance(doc, Mapping):
        raise ConfigError("must be a mapping of settings", source=path)
    gates = FeatureGates()
    for key, value in _file_entries(doc, path):
        if key == FEATURE_GATES_KEY:
            gates = FeatureGates() if value is None else _file_gates(value, path)
        elif key not in BY_KEY:
            raise _unknown_key(key, path)
        elif value is not None:  # null: leave the default
            values[key] = _convert(BY_KEY[key], value, path, key)
            sources[key] = (path, key)
    return gates


def _checked_node_name(environ: Mapping[str, str]) -> str:
    source = "NODE_NAME" if environ.get("NODE_NAME", "").strip() else "host name"
    name: str = _convert(BY_KEY["nodeName"], default_node_name(environ), source)
    return name


def _nodeslo_file(
    given: str | None, where: tuple[str, str], standalone: bool, default: str
) -> str | None:
    if given is None:
        return default if standalone and os.path.isfile(default) else None
    if not given:
        return None
    if not standalone:
        raise ConfigError(
            "only used with --standalone (the API server provides the NodeSLO otherwise)",
            source=where[0],
            field=where[1],
        )
    if where[1]:  # from a config file: relative to that file
        given = os.path.join(os.path.dirname(where[0]), given)
    return os.path.abspath(given)


def load_config(
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    default_nodeslo_file: str = DEFAULT_NODESLO_FILE,
    commands: Mapping[str, str] | None = None,
) -> KoordletConfig:
    """The configuration from command-line arguments (without the program name), the config file
    they name and ``environ`` (``os.environ`` by default; ``NODE_NAME``). Raises ConfigError
    naming the flag or file and the field. ``--help`` (which lists ``commands`` too) and
    ``--version`` print and raise SystemExit(0), as argparse does."""
    env = os.environ if environ is None else environ
    args = vars(build_parser(commands).parse_args(go_style(argv)))
    values: dict[str, Any] = {}
    sources: dict[str, tuple[str, str]] = {}
    config_file: str | None = args.pop("config", None)
    verbose = args.pop("verbose", None)
    gates = FeatureGates() if config_file is None else _read_file(config_file, values, sources)
    for text in args.pop(FEATURE_GATES_KEY, []):
        overrides = parse_overrides(text, source=FEATURE_GATES_FLAG)
        gates = gates.merged(overrides, source=FEATURE_GATES_FLAG)
    for key, raw in args.items():
        flag = BY_KEY[key].flags[0]
        values[key] = _convert(BY_KEY[key], raw, flag)
        sources[key] = (flag, "")
    if verbose is not None:
        values["logLevel"] = verbosity(verbose)

    top: dict[str, Any] = {}
    # keyed by KoordletConfig attribute (the YAML section names but runtimeHooks)
    sections: dict[str, dict[str, Any]] = {name: {} for name in (*SECTIONS, "runtime_hooks")}
    for key, value in values.items():
        section, _, attr = BY_KEY[key].attr.rpartition(".")
        (sections[section] if section else top)[attr] = value
    if "node_name" not in top:
        top["node_name"] = _checked_node_name(env)
    top["nodeslo_file"] = _nodeslo_file(
        top.get("nodeslo_file"),
        sources.get("nodesloFile", ("", "")),
        top.get("standalone", False),
        default_nodeslo_file,
    )
    collect = CollectConfig(**sections["collect"])
    if collect.cpi_window >= collect.cpi_interval:
        where = sources.get("collect.cpiTimeWindow", ("defaults", ""))
        raise ConfigError(
            f"the CPI window ({collect.cpi_window:g} s) must be shorter than the CPI interval "
            f"({collect.cpi_interval:g} s)",
            source=where[0],
            field=where[1] or "collect.cpiTimeWindow",
        )
    qos = QoSConfig(**sections["qos"])
    _check_distress(qos, sources)
    return KoordletConfig(
        paths=HostPaths(**sections["paths"]),
        cgroup=CgroupConfig(**sections["cgroup"]),
        collect=collect,
        server=ServerConfig(**sections["server"]),
        qos=qos,
        audit=AuditConfig(**sections["audit"]),
        kube=KubeConfig(**sections["kube"]),
        runtime_hooks=RuntimeHooksConfig(**sections["runtime_hooks"]),
        feature_gates=gates,
        config_file=config_file,
        **top,
    )


def _check_distress(qos: QoSConfig, sources: Mapping[str, tuple[str, str]]) -> None:
    """Each distress signal's off threshold below its on threshold (0: half of it)."""
    pairs = (
        ("qos.memoryDistressPSIFullOffPercent", qos.memory_distress_psi_full_on,
         qos.memory_distress_psi_full_off),
        ("qos.memoryDistressReclaimOffPagesPerSecond", qos.memory_distress_reclaim_on,
         qos.memory_distress_reclaim_off),
    )  # fmt: skip
    for key, on, off in pairs:
        if on and off and off >= on:
            where = sources.get(key, ("defaults", ""))
            raise ConfigError(
                f"the off threshold ({off:g}) must be below the on threshold ({on:g})",
                source=where[0],
                field=where[1] or key,
            )


def config_as_dict(cfg: KoordletConfig) -> dict[str, Any]:
    """The configuration in the config file's schema, JSON-ready (``/debug/config``): written
    back as YAML and loaded, it gives the same configuration. Durations are in seconds; the
    feature gates show every gate's effective value (``koordlet.features.describe`` has more)."""
    out: dict[str, Any] = {}
    for s in SETTINGS:
        value = attr_of(cfg, s.attr)
        if isinstance(value, frozenset):
            value = sorted(value)
        section, _, name = s.key.rpartition(".")
        (out.setdefault(section, {}) if section else out)[name] = "" if value is None else value
    out[FEATURE_GATES_KEY] = dict(cfg.feature_gates)
    return out


def load_node_slo(path: str) -> NodeSLOInForce:
    """The local NodeSLO file, every section checked: what the koordlet's start (and ``koordlet
    host-app``) accepts. Raises ConfigError naming the file and the field of the first bad value
    (a bad section at start is a configuration error; on reload it keeps its last good value,
    ``koordlet.statesinformer.hostapps``)."""
    try:
        in_force = read_node_slo_file(path, now=time.time())
    except SchemaError as err:
        raise _config_error(err) from err
    for section in ALL_SECTIONS:
        rejection = in_force.rejected.get(section)
        if rejection is not None:
            raise ConfigError(
                rejection.error.message, source=rejection.error.source, field=rejection.error.field
            )
    return in_force

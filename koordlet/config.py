"""The koordlet's configuration: Koordinator's flags, an optional YAML file, frozen dataclasses.

Precedence: built-in defaults < the YAML file named by ``--config`` < flags. Feature gates merge
gate by gate across the three. Flags keep Koordinator's koordlet names where it has one
(``--addr``, ``--cgroup-root-dir``, ``--collect-res-used-interval-seconds``, ``--feature-gates``,
...), accept Go's single-dash spelling (``-addr=:9316``) and take durations as Go writes them
(``500ms``, ``1m30s``) or as plain seconds. The YAML file nests the same settings under
``paths``, ``cgroup``, ``collect``, ``server``, ``qos`` and ``audit`` (see
docs/configuration.md); an unknown key is an error, never ignored. Every error is a
:class:`~koordlet.errors.ConfigError` naming the flag or the file and the field.

:data:`SETTINGS` is the one table of settings: the parser, ``--help``, the YAML schema and
:func:`config_as_dict` (``/debug/config``) are all derived from it.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

from apis.duration import parse_duration
from apis.gobool import parse_go_bool
from apis.kubernetes_keys import SERVICE_ACCOUNT_TOKEN_PATH
from apis.slo import SchemaError, read_document
from apis.slo_inforce import ALL_SECTIONS, NodeSLOInForce, read_node_slo_file
from apis.terway import TERWAY_QOS_DIR
from koordlet import __version__
from koordlet.errors import ConfigError
from koordlet.features import FLAG as FEATURE_GATES_FLAG
from koordlet.features import FeatureGates, help_lines, parse_overrides
from koordlet.system.paths import HostPaths
from kubeclient.flags import SuggestingParser, suggestion

DEFAULT_NODESLO_FILE = "/etc/koordinator/nodeslo.yaml"
"""The NodeSLO file standalone mode reads when ``--nodeslo-file`` is not given, if it exists."""
VERSION_TEXT = f"koordlet (koordinator-py) {__version__}"
"""What ``--version`` prints."""

CgroupVersionSetting = Literal["auto", "v1", "v2"]
CgroupDriverSetting = Literal["auto", "systemd", "cgroupfs"]
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True, slots=True)
class CgroupConfig:
    """How the cgroup hierarchy is laid out."""

    version: CgroupVersionSetting = "auto"
    """``v1``, ``v2`` or ``auto`` (detect from the mounts); ``--cgroup-version``, ours:
    Koordinator always detects."""
    driver: CgroupDriverSetting = "auto"
    """The kubelet's cgroup driver, ``systemd``, ``cgroupfs`` or ``auto`` (detect from the
    kubepods directory names); ``--cgroup-driver``, ours: Koordinator detects it."""
    kube_path: str = "kubepods/"
    """The kubepods directory below each hierarchy root, as the cgroupfs driver names it;
    Koordinator's ``--cgroup-kube-dir`` (default ``kubepods/``)."""


@dataclass(frozen=True, slots=True)
class CollectConfig:
    """How often collectors run; every interval is in seconds."""

    res_used_interval: float = 1.0
    """Node, pod and container usage collection; Koordinator's
    ``--collect-res-used-interval-seconds`` (default 1)."""
    node_cpu_info_interval: float = 60.0
    """CPU topology and node info; Koordinator's ``--collect-node-cpu-info-interval-seconds``
    (default 60)."""
    node_storage_info_interval: float = 1.0
    """Block devices, volume groups and pod volume devices (for blkio QoS, gate
    ``BlkIOReconcile``); Koordinator's ``--collect-node-storage-info-interval`` (default 1 s)."""
    psi_interval: float = 10.0
    """Pressure stall information (gate ``PSICollector``); Koordinator's
    ``--psi-collector-interval-seconds`` (default 10)."""
    cpi_interval: float = 60.0
    """How often a CPI window starts (gate ``CPICollector``); Koordinator's
    ``--cpi-collector-interval`` (default 60 s)."""
    cpi_window: float = 10.0
    """How long the CPI counters run in each window; Koordinator's ``--collect-cpi-timewindow``
    (default 10 s). Must be shorter than ``cpi_interval``."""
    cold_page_interval: float = 5.0
    """Cold memory from kidled (gate ``ColdPageCollector``); Koordinator's
    ``--coldpage-collector-interval`` (default 5 s)."""
    enable_resctrl_collector: bool = False
    """Collect LLC occupancy and memory bandwidth from resctrl monitoring; Koordinator's
    ``--enable-resctrl-collector`` (default false)."""
    resctrl_interval: float = 1.0
    """resctrl monitoring collection; Koordinator's ``--resctrl-collector-interval`` (default
    1 s)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The HTTP server (``/metrics``, ``/healthz``, ``/readyz``, ``/debug/``)."""

    addr: str = "127.0.0.1:9316"
    """``HOST:PORT`` to listen on; an empty host (``:9316``) means every interface. Koordinator's
    ``--addr``, whose default is ``:9316``: ours is loopback only, safe by default."""
    debug_allow_remote: bool = False
    """Whether ``/debug/`` answers clients other than loopback; ``--debug-allow-remote``, ours."""
    max_requests_in_flight: int = 8
    """Requests to ``/metrics`` and ``/debug/`` admitted at once; one more is answered 503 with
    ``Retry-After``; ``--server-max-requests-in-flight``, ours (default 8). The probes have
    their own limit."""
    cpu_share: float = 0.1
    """Fraction of one core that requests to ``/metrics`` and ``/debug/`` may use on average
    (the event loop is shared with collection and the QoS strategies); past it they wait, then
    get 503; ``--server-cpu-share``, ours (default 0.1)."""

    @property
    def host(self) -> str:
        """The host part without IPv6 brackets; empty for every interface."""
        return self.addr.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        """The port (0: any free port)."""
        return int(self.addr.rpartition(":")[2])


@dataclass(frozen=True, slots=True)
class QoSConfig:
    """The QoS manager's safety switches."""

    dry_run: bool = False
    """Every QoS strategy computes, logs and audits its decisions but writes and evicts nothing;
    ``--dry-run``, ours (default false)."""
    dry_run_strategies: frozenset[str] = frozenset()
    """QoS strategies (table names, ``cpusuppress,memoryevict``) in dry run while the others act;
    ``--qos-dry-run-strategies``, ours (default none). A name not in the strategy table stops
    the koordlet at start: a typo must not leave a strategy acting for real."""
    reconcile_interval: float = 1.0
    """Seconds between rounds of the cgroup reconcilers and CPU burst; Koordinator's
    ``--reconcile-interval-seconds`` (default 1)."""
    cpu_suppress_interval: float = 1.0
    """Seconds between CPU suppress rounds; ``--cpu-suppress-interval-seconds`` (default 1)."""
    cpu_evict_interval: float = 1.0
    """Seconds between CPU eviction rounds; ``--cpu-evict-interval-seconds`` (default 1)."""
    memory_evict_interval: float = 1.0
    """Seconds between memory eviction rounds (pressure events wake it between);
    ``--memory-evict-interval-seconds`` (default 1)."""
    memory_evict_cool_time: float = 4.0
    """Seconds after a memory eviction before the next; ``--memory-evict-cool-time-seconds``
    (default 4)."""
    cpu_evict_cool_time: float = 20.0
    """Seconds after a CPU eviction before the next; ``--cpu-evict-cool-time-seconds``
    (default 20)."""
    evict_max_per_round: int = 0
    """Evictions the evictor performs per strategy round at most; ``--qos-evict-max-per-round``,
    ours: 0 (the default) is no cap, as upstream."""
    evict_dedupe_window: float = 120.0
    """Seconds during which a pod is not evicted again (Koordinator's evictor cache expiry,
    2 minutes); ``--qos-evict-dedupe-window-seconds``, ours."""
    memory_distress_psi_full_on: float = 0.0
    """Memory eviction's distress trigger: percent of wall time in ``full`` memory stall (all
    non-idle tasks stalled at once, ``/proc/pressure/memory``) over the window at or above which
    BE pods are evicted even below the usage threshold; ``--memory-distress-psi-full-percent``,
    ours: 0 (the default) is off."""
    memory_distress_psi_full_off: float = 0.0
    """The PSI signal turns off below this percent; ``--memory-distress-psi-full-off-percent``,
    ours: 0 (the default) is half of the on threshold."""
    memory_distress_reclaim_on: float = 0.0
    """Memory eviction's distress trigger: pages scanned per second by reclaim (``pgscan_*`` of
    ``/proc/vmstat``, global reclaim) at or above which BE pods are evicted;
    ``--memory-distress-reclaim-pages-per-second``, ours: 0 (the default) is off."""
    memory_distress_reclaim_off: float = 0.0
    """The reclaim signal turns off below this rate; ``--memory-distress-reclaim-off-pages-per-
    second``, ours: 0 (the default) is half of the on threshold."""
    memory_distress_window: float = 0.5
    """Seconds over which the distress rates are computed; ``--memory-distress-window``, ours
    (default 0.5)."""
    memory_distress_sustain: float = 0.0
    """Seconds a distress signal must stay at or above its on threshold before it turns on;
    ``--memory-distress-sustain``, ours (default 0: the window already smooths)."""
    memory_distress_interval: float = 0.1
    """Seconds between two readings of the distress counters while the trigger is on;
    ``--memory-distress-interval``, ours (default 0.1)."""
    be_eviction_condition_cool_down: float = 300.0
    """Cluster mode, gate ``BEEvictionCondition``: seconds after the last BE eviction before the
    Node condition ``koordinator.sh/BEEvictionPressure`` is lifted;
    ``--be-eviction-condition-cool-down``, ours (default 5 min)."""
    only_evict_by_api: bool = False
    """In cluster mode, evict only through the Eviction API, never by killing the cgroup's
    processes when the API refuses or fails; Koordinator's ``--only-evict-by-api`` (default
    false)."""


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """The Kubernetes API server (cluster mode, i.e. without ``--standalone``)."""

    kubeconfig: str = ""
    """kubeconfig file; empty: ``$KUBECONFIG``, else the in-cluster service account.
    Koordinator's ``--kubeconfig``."""
    sync_timeout: float = 30.0
    """Seconds start-up waits for the first lists of Node, pods, NodeSLO and NodeMetric before
    going on in protect-only mode (the persisted NodeSLO, else the defaults) while the informers
    keep retrying; ``--kube-sync-timeout``, ours."""
    request_timeout: float = 30.0
    """Seconds one API request may take before it counts as a transient failure;
    ``--kube-request-timeout``, ours."""
    enable_node_metric_report: bool = True
    """Write the NodeMetric status at the NodeMetric spec's report interval (default 60 s);
    Koordinator's ``--enable-node-metric-report`` (default true)."""
    kubelet_config_file: str = "/var/lib/kubelet/config.yaml"
    """The kubelet's configuration file, read for the topology manager policy and scope and the
    reserved CPUs and memory reported in NodeResourceTopology; missing: defaults, logged.
    ``--kubelet-config-file``, ours."""
    kubelet_topology_policy: str = ""
    """The kubelet's topology manager policy when its config file does not say (``none``,
    ``best-effort``, ``restricted``, ``single-numa-node``); ``--kubelet-topology-manager-policy``,
    ours; empty: from the file, else ``none``."""
    kubelet_topology_scope: str = ""
    """The kubelet's topology manager scope (``container`` or ``pod``);
    ``--kubelet-topology-manager-scope``, ours; empty: from the file, else ``container``."""
    pods_source: str = "apiserver"
    """Where the koordlet learns its pods in cluster mode: ``apiserver`` (the ``spec.nodeName``
    watch), ``kubelet`` (the kubelet's ``/pods``, as Koordinator's koordlet does) or ``both``
    (the API server wins on a UID); ``--pods-source``, ours."""
    kubelet_address: str = ""
    """Kubelet host; empty: the Node's address of ``kubelet_preferred_address_type``.
    ``--kubelet-address``, ours."""
    kubelet_preferred_address_type: str = "InternalIP"
    """Koordinator's ``--kubelet-preferred-address-type`` (default ``InternalIP``)."""
    kubelet_port: int = 0
    """Kubelet HTTPS port; 0: the Node's ``daemonEndpoints.kubeletEndpoint.Port``, else 10250.
    ``--kubelet-port``, ours."""
    kubelet_insecure_tls: bool = False
    """Plain HTTP to the read-only port; Koordinator's ``--kubelet-insecure-tls`` (default
    false)."""
    kubelet_read_only_port: int = 10255
    """Koordinator's ``--kubelet-read-only-port`` (default 10255)."""
    kubelet_token_file: str = SERVICE_ACCOUNT_TOKEN_PATH
    """Bearer token for the kubelet, re-read when it changes; ``--kubelet-token-file``, ours."""
    kubelet_ca_file: str = ""
    """CA of the kubelet's serving certificate; empty: not verified (as Koordinator).
    ``--kubelet-ca-file``, ours."""
    kubelet_sync_interval: float = 10.0
    """Seconds between polls of ``/pods``; Koordinator's ``--kubelet-sync-interval`` (10 s)."""
    kubelet_sync_timeout: float = 3.0
    """Seconds one kubelet request may take; Koordinator's ``--kubelet-sync-timeout`` (3 s)."""


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """The audit log of every change made to the host (``docs/qos.md``)."""

    log_dir: str = ""
    """Directory of ``audit.jsonl`` and its rotated copies; empty means ``<stateDir>/audit``.
    Koordinator's ``--audit-log-dir`` (default ``/var/log/koordlet``)."""
    max_disk_space_mb: int = 16
    """MiB the audit files may take on disk, in four files; Koordinator's
    ``--audit-max-disk-space-mb`` (default 16)."""


RUNTIME_HOOK_POINTS = (
    "PreRunPodSandbox",
    "PostStopPodSandbox",
    "PreRemoveRunPodSandbox",
    "PreCreateContainer",
    "PreStartContainer",
    "PostStartContainer",
    "PreUpdateContainerResources",
    "PostStopContainer",
)
"""Koordinator's runtime hook stage names (``RuntimeHookType``), for
``--runtime-hooks-disable-stages`` (koordlet.runtimehooks.model.HookPoint holds the same)."""


@dataclass(frozen=True, slots=True)
class RuntimeHooksConfig:
    """The runtime hooks: the hook server koord-runtime-proxy calls, and the NRI plugin
    (docs/runtimehooks.md). Paths default to the host's, as the other path settings do; the
    DaemonSet passes the in-container ones upstream uses as defaults."""

    addr: str = "/var/run/koordlet/koordlet.sock"
    """Unix socket the hook server listens on; empty disables it. Koordinator's
    ``--runtime-hooks-addr`` (upstream default ``/host-var-run-koordlet/koordlet.sock``, the
    DaemonSet's mount of the host's ``/var/run/koordlet``). The folder must exist: it is not
    created (the systemd unit's ``RuntimeDirectory``, the DaemonSet's mount)."""
    host_endpoint: str = "/var/run/koordlet/koordlet.sock"
    """The same socket as the host sees it, written for koord-runtime-proxy into
    ``<config_path>/koordlet.json``; Koordinator's ``--runtime-hooks-host-endpoint``."""
    config_path: str = "/etc/runtime/hookserver.d"
    """Folder of the runtime proxy's hook-server files, where ``koordlet.json`` is written when
    the folder exists; Koordinator's ``--runtime-hooks-config-path`` (upstream default the
    DaemonSet's ``/host-etc-hookserver/``)."""
    disable_stages: frozenset[str] = frozenset()
    """Stages where no hook runs (``PreCreateContainer,...``); Koordinator's
    ``--runtime-hooks-disable-stages``."""
    timeout: float = 1.0
    """Seconds one request's hooks (pod-level cgroup writes included) may take before the
    request goes on unchanged; ``--runtime-hooks-timeout``, ours."""
    reconcile_interval: float = 10.0
    """Seconds between the reconciler's rounds over the running pods' cgroups; Koordinator's
    ``--runtime-hooks-reconcile-interval`` (default 10 s)."""
    nri: bool = True
    """Register as an NRI plugin with the runtime; Koordinator's ``--enable-nri-runtime-hook``
    (default true)."""
    var_run_root: str = "/var/run"
    """The host's ``/var/run``; Koordinator's ``--var-run-root-dir`` (DaemonSet:
    ``/host-var-run/``)."""
    nri_socket_path: str = "nri/nri.sock"
    """The runtime's NRI socket, relative to ``var_run_root`` unless absolute; Koordinator's
    ``--runtime-hooks-nri-socket-path`` (default ``nri/nri.sock``)."""
    nri_plugin_name: str = "koordlet_nri"
    """Name the plugin registers with; Koordinator's ``--runtime-hooks-nri-plugin-name``."""
    nri_plugin_index: str = "00"
    """Two-digit invocation index (lower runs first); Koordinator's
    ``--runtime-hooks-nri-plugin-index``."""
    nri_connect_timeout: float = 6.0
    """Seconds to connect, register and get configured; Koordinator's
    ``--runtime-hooks-nri-connect-timeout`` (6 s, a little over the runtime's 5 s registration
    timeout)."""
    nri_backoff_duration: float = 1.0
    """First reconnect delay in seconds; Koordinator's ``--runtime-hooks-nri-backoff-duration``."""
    nri_backoff_factor: float = 2.0
    """Reconnect delay multiplier; Koordinator's ``--runtime-hooks-nri-backoff-factor``."""
    nri_backoff_cap: float = 30.0
    """Longest reconnect delay in seconds; ``--runtime-hooks-nri-backoff-cap`` (upstream's
    default is unbounded; ours retries at least every 30 s so a restarted runtime is found)."""
    terway_qos_dir: str = TERWAY_QOS_DIR
    """terway-qos's folder, where the ``TerwayQoS`` hook writes ``global_bps_config`` and
    ``pod.json``; ``--runtime-hooks-terway-qos-dir``, ours (upstream's koordlet hard-codes the
    DaemonSet's ``/host-var-lib/terway/qos``). Created when first written."""

    @property
    def nri_socket(self) -> str:
        """The NRI socket's absolute path."""
        return os.path.join(self.var_run_root, self.nri_socket_path)


def default_node_name(environ: Mapping[str, str] | None = None) -> str:
    """``$NODE_NAME`` (as Koordinator's DaemonSet sets it) or else the host name, lower-cased as
    the kubelet registers it."""
    env = os.environ if environ is None else environ
    return env.get("NODE_NAME", "").strip() or socket.gethostname().strip().lower()


@dataclass(frozen=True, slots=True)
class KoordletConfig:
    """Everything the koordlet is configured with; built by :func:`load_config`."""

    node_name: str = field(default_factory=default_node_name)
    """This node's Kubernetes name; ``--node-name``, default ``$NODE_NAME`` (Koordinator reads
    that variable) or the lower-cased host name."""
    paths: HostPaths = field(default_factory=HostPaths)
    """Host file system roots; Koordinator's ``--cgroup-root-dir`` (default ``/sys/fs/cgroup``),
    ``--proc-root-dir`` (``/proc``), ``--sys-root-dir`` (``/sys``) and ``--var-lib-kubelet-dir``
    (``/var/lib/kubelet``), as in its host mode."""
    cgroup: CgroupConfig = field(default_factory=CgroupConfig)
    """Cgroup version, driver and kubepods directory."""
    collect: CollectConfig = field(default_factory=CollectConfig)
    """Collection intervals."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """The HTTP server."""
    qos: QoSConfig = field(default_factory=QoSConfig)
    """Dry run for the QoS strategies."""
    audit: AuditConfig = field(default_factory=AuditConfig)
    """The audit log."""
    kube: KubeConfig = field(default_factory=KubeConfig)
    """The API server connection and NodeMetric reporting (ignored with ``--standalone``)."""
    runtime_hooks: RuntimeHooksConfig = field(default_factory=RuntimeHooksConfig)
    """The runtime hooks' server and NRI plugin."""
    standalone: bool = False
    """Run without the Kubernetes API server: pods from the kubepods hierarchy, the NodeSLO from
    a local file; ``--standalone``, ours (default false)."""
    nodeslo_file: str | None = None
    """Absolute path of the local NodeSLO (YAML or JSON, standalone mode only); None for none,
    then Koordinator's NodeSLO defaults apply. ``--nodeslo-file``, ours; default
    ``/etc/koordinator/nodeslo.yaml`` when standalone and that file exists."""
    state_dir: str = "/var/lib/koordlet"
    """Directory for state kept across restarts; ``--state-dir``, ours."""
    feature_gates: FeatureGates = field(default_factory=FeatureGates)
    """Koordinator's koordlet feature gates; ``--feature-gates``."""
    log_level: LogLevel = "info"
    """``debug``, ``info``, ``warning`` or ``error``; ``--log-level``, ours (Koordinator uses
    klog's ``-v``)."""
    config_file: str | None = None
    """The YAML file the settings were read from, if any (``--config``)."""

    @property
    def audit_dir(self) -> str:
        """Where the audit log lives: ``audit.log_dir``, else ``<state_dir>/audit``."""
        return self.audit.log_dir or os.path.join(self.state_dir, "audit")


# Value converters: a YAML scalar or flag string in, a checked value out; TypeError or ValueError
# (with the reason) on bad input.
def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"must be a string, got {value!r}")
    return value


def _nonempty(value: object) -> str:
    text = _string(value).strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def _abs_path(value: object) -> str:
    text = _nonempty(value)
    if not os.path.isabs(text):
        raise ValueError(f"must be an absolute path, got {text!r}")
    return os.path.normpath(text)


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return parse_go_bool(_string(value).strip())


def _choice(*choices: str) -> Callable[[object], str]:
    def convert(value: object) -> str:
        text = _string(value).strip().lower()
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
        return text

    return convert


_PLAIN_SECONDS = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")


def duration_seconds(text: str) -> float:
    """Seconds from a Go duration (:func:`apis.duration.parse_duration`: ``300ms``, ``1m30s``,
    ``-1.5h``) or, as our flags also take, a plain number of seconds (``1.5``); ValueError."""
    text = text.strip()
    if _PLAIN_SECONDS.fullmatch(text):
        return float(text)
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError(
            f"invalid duration {text!r} (want e.g. 1s, 500ms, 1m30s or seconds)"
        ) from None


def _positive_duration(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a duration, got {value!r}")
    seconds = duration_seconds(value) if isinstance(value, str) else float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"must be a positive duration, got {value!r}")
    return seconds


def _duration_or_zero(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a duration, got {value!r}")
    seconds = duration_seconds(value) if isinstance(value, str) else float(value)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"must be a duration of 0 or more, got {value!r}")
    return seconds


def _finite(value: object) -> float:
    """A finite number from a number or its text; TypeError/ValueError naming the value."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError as err:
        raise ValueError(f"must be a number, got {value!r}") from err
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value!r}")
    return number


def _non_negative(value: object) -> float:
    number = _finite(value)
    if number < 0:
        raise ValueError(f"must be a number of 0 or more, got {value!r}")
    return number


def _percent(value: object) -> float:
    number = _non_negative(value)
    if number > 100:
        raise ValueError(f"must be a percent from 0 to 100, got {value!r}")
    return number


def _cpu_share(value: object) -> float:
    """A fraction of one core, above 0 and at most 1."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a number, got {value!r}")
    try:
        share = float(value)
    except ValueError:
        raise ValueError(f"must be a number, got {value!r}") from None
    if not (math.isfinite(share) and 0 < share <= 1):
        raise ValueError(f"must be above 0 and at most 1 (a fraction of one core), got {value!r}")
    return share


def _kube_dir(value: object) -> str:
    text = _nonempty(value)
    parts = text.strip("/").split("/")
    if os.path.isabs(text) or "." in parts or ".." in parts or "" in parts:
        raise ValueError(f"must be a relative directory below the cgroup roots, got {text!r}")
    if parts[-1] not in ("kubepods", "kubepods.slice"):  # the kubelet names nothing else
        raise ValueError(f"must end in kubepods/ or kubepods.slice/, got {text!r}")
    return text


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _node_name(value: object) -> str:
    name = _nonempty(value)
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"must be a valid Kubernetes node name (DNS subdomain), got {name!r}")
    return name


def _addr(value: object) -> str:
    text = _nonempty(value)
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"must be HOST:PORT with a port in 0..65535, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"bad IPv6 address in {text!r}") from None
    elif ":" in host or "[" in host or "]" in host:
        raise ValueError(f"an IPv6 host needs brackets ([::1]:9316), got {text!r}")
    return text


def _optional_path(value: object) -> str:
    return _string(value).strip()


def _verbosity(text: str) -> str:
    """``-v N`` (klog's verbosity) as a log level: 4 and above is debug, below that info."""
    try:
        level = int(text)
    except ValueError:
        raise ConfigError(f"must be a whole number, got {text!r}", source="-v") from None
    return "debug" if level >= 4 else "info"


def _optional_host(value: object) -> str:
    """A host name or IP address (no scheme, port or path); empty for none."""
    text = _string(value).strip()
    if any(c in text for c in "/ \t") or text.count(":") == 1:
        raise ValueError(
            f"must be a host name or IP address (no scheme, port or path), got {text!r}"
        )
    return text


def _optional_file(value: object) -> str:
    """A file path, made absolute against the working directory; empty for none."""
    text = _string(value).strip()
    return os.path.abspath(text) if text else ""


def _optional_abs_path(value: object) -> str:
    text = _string(value).strip()
    return _abs_path(text) if text else ""


_STRATEGY_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def _strategy_names(value: object) -> frozenset[str]:
    """``a,b`` (flag or YAML string) or a YAML list of strategy table names."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple | frozenset | set):
        items = [_string(item).strip() for item in value]
    else:
        raise TypeError(f"must be a comma-separated string or a list of names, got {value!r}")
    names = frozenset(item for item in items if item)
    bad = sorted(n for n in names if not _STRATEGY_NAME.fullmatch(n))
    if bad:
        raise ValueError(f"not strategy names (lower case, as in the strategy table): {bad}")
    return names


def _disk_mb(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"must be a whole number of MiB, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"must be a whole number of MiB, got {value!r}")
        number = int(text)
    elif isinstance(value, int):
        number = value
    else:
        raise TypeError(f"must be a whole number of MiB, got {value!r}")
    if not 1 <= number <= 10240:
        raise ValueError(f"must be between 1 and 10240 MiB, got {number}")
    return number


def _port(allow_zero: bool) -> Callable[[object], int]:
    """A TCP port (1..65535), or 0 too when ``allow_zero``."""

    def convert(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(f"must be a TCP port, got {value!r}")
        text = str(value).strip()
        lowest = 0 if allow_zero else 1
        if not (text.isascii() and text.isdigit()) or not lowest <= int(text) <= 65535:
            raise ValueError(f"must be a TCP port{' or 0' if allow_zero else ''}, got {value!r}")
        return int(text)

    return convert


def _hook_stages(value: object) -> frozenset[str]:
    """``A,B`` (flag or YAML string) or a YAML list of Koordinator's runtime hook stage names."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple | frozenset | set):
        items = [_string(item).strip() for item in value]
    else:
        raise TypeError(f"must be a comma-separated string or a list of stages, got {value!r}")
    stages = frozenset(item for item in items if item)
    bad = sorted(stages - set(RUNTIME_HOOK_POINTS))
    if bad:
        raise ValueError(f"unknown stages {bad}; known: {', '.join(RUNTIME_HOOK_POINTS)}")
    return stages


def _optional_socket(value: object) -> str:
    text = _string(value).strip()
    return _abs_path(text) if text else ""


def _factor(value: object) -> float:
    number = _finite(value)
    if number < 1.0:
        raise ValueError(f"must be a number >= 1, got {value!r}")
    return number


def _plugin_index(value: object) -> str:
    text = _string(value).strip()
    if not re.fullmatch(r"[0-9]{2}", text):
        raise ValueError(f"must be two digits (NRI's plugin index), got {value!r}")
    return text


def _plugin_name(value: object) -> str:
    text = _nonempty(value)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", text):
        raise ValueError(f"must be letters, digits, '_', '.', '-', got {value!r}")
    return text


def _evictions(value: object) -> int:
    """A whole number of evictions per round, 0 (no cap) to 1000."""
    number = _whole_number(value)
    if not 0 <= number <= 1000:
        raise ValueError(f"must be between 0 (no cap) and 1000, got {number}")
    return number


def _requests_in_flight(value: object) -> int:
    """A whole number of requests, 1 to 1000."""
    number = _whole_number(value)
    if not 1 <= number <= 1000:
        raise ValueError(f"must be between 1 and 1000, got {number}")
    return number


def _whole_number(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"must be a whole number, got {value!r}")
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"must be a whole number, got {value!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class Setting:
    """One configuration setting: its YAML key, flags and where it lands in KoordletConfig."""

    key: str
    """YAML key path (``collect.resUsedInterval``); also the field name in error messages."""
    attr: str
    """Attribute path in :class:`KoordletConfig` (``collect.res_used_interval``)."""
    flags: tuple[str, ...]
    """Command-line flags; the first is the primary, the others aliases."""
    convert: Callable[[object], Any]
    """Checks and converts a YAML value or flag string; TypeError or ValueError say why not."""
    help: str
    """One line for ``--help``."""
    koordinator: str = ""
    """The Koordinator flag this mirrors; empty when the setting is koordinator-py's own."""
    is_bool: bool = False
    """A switch: ``--flag`` alone means true, ``--flag=false`` is accepted too."""


# fmt: off
SETTINGS: tuple[Setting, ...] = (
    Setting("nodeName", "node_name", ("--node-name",), _node_name, "this node's name"),
    Setting("standalone", "standalone", ("--standalone",), _bool, "run without the API server",
            is_bool=True),
    Setting("nodesloFile", "nodeslo_file", ("--nodeslo-file",), _optional_path,
            "local NodeSLO YAML/JSON for --standalone ('' for none)"),
    Setting("stateDir", "state_dir", ("--state-dir",), _abs_path, "state kept across restarts"),
    Setting("logLevel", "log_level", ("--log-level",),
            _choice("debug", "info", "warning", "error"), "debug, info, warning or error"),
    Setting("paths.cgroupRootDir", "paths.cgroup_root", ("--cgroup-root-dir",), _abs_path,
            "cgroup mount root", "--cgroup-root-dir"),
    Setting("paths.procRootDir", "paths.proc_root", ("--proc-root-dir",), _abs_path,
            "host /proc", "--proc-root-dir"),
    Setting("paths.sysRootDir", "paths.sys_root", ("--sys-root-dir",), _abs_path, "host /sys",
            "--sys-root-dir"),
    Setting("paths.varLibKubeletDir", "paths.kubelet_root", ("--var-lib-kubelet-dir",),
            _abs_path, "the kubelet's root directory (pod volumes)", "--var-lib-kubelet-dir"),
    Setting("cgroup.version", "cgroup.version", ("--cgroup-version",),
            _choice("auto", "v1", "v2"), "auto, v1 or v2"),
    Setting("cgroup.driver", "cgroup.driver", ("--cgroup-driver",),
            _choice("auto", "systemd", "cgroupfs"), "auto, systemd or cgroupfs"),
    Setting("cgroup.kubeDir", "cgroup.kube_path", ("--cgroup-kube-dir", "--cgroup-kube-path"),
            _kube_dir, "kubepods directory below the roots", "--cgroup-kube-dir"),
    Setting("collect.resUsedInterval", "collect.res_used_interval",
            ("--collect-res-used-interval-seconds", "--collect-res-used-interval"),
            _positive_duration, "resource usage collection interval",
            "--collect-res-used-interval-seconds"),
    Setting("collect.nodeCPUInfoInterval", "collect.node_cpu_info_interval",
            ("--collect-node-cpu-info-interval-seconds", "--collect-node-cpu-info-interval"),
            _positive_duration, "node CPU info collection interval",
            "--collect-node-cpu-info-interval-seconds"),
    Setting("collect.nodeStorageInfoInterval", "collect.node_storage_info_interval",
            ("--collect-node-storage-info-interval",), _positive_duration,
            "block devices and pod volumes collection interval",
            "--collect-node-storage-info-interval"),
    Setting("collect.psiInterval", "collect.psi_interval",
            ("--psi-collector-interval-seconds", "--psi-collector-interval"),
            _positive_duration, "PSI collection interval", "--psi-collector-interval-seconds"),
    Setting("collect.cpiInterval", "collect.cpi_interval",
            ("--cpi-collector-interval", "--cpi-collector-interval-seconds"),
            _positive_duration, "CPI collection interval", "--cpi-collector-interval"),
    Setting("collect.cpiTimeWindow", "collect.cpi_window",
            ("--collect-cpi-timewindow", "--collect-cpi-timewindow-seconds"),
            _positive_duration, "CPI counting window", "--collect-cpi-timewindow"),
    Setting("collect.coldPageInterval", "collect.cold_page_interval",
            ("--coldpage-collector-interval",), _positive_duration,
            "cold page collection interval", "--coldpage-collector-interval"),
    Setting("collect.enableResctrlCollector", "collect.enable_resctrl_collector",
            ("--enable-resctrl-collector",), _bool, "collect resctrl LLC and bandwidth",
            "--enable-resctrl-collector", is_bool=True),
    Setting("collect.resctrlInterval", "collect.resctrl_interval",
            ("--resctrl-collector-interval",), _positive_duration,
            "resctrl collection interval", "--resctrl-collector-interval"),
    Setting("server.addr", "server.addr", ("--addr",), _addr, "HTTP listen address", "--addr"),
    Setting("server.debugAllowRemote", "server.debug_allow_remote", ("--debug-allow-remote",),
            _bool, "serve /debug/ to non-loopback clients", is_bool=True),
    Setting("server.maxRequestsInFlight", "server.max_requests_in_flight",
            ("--server-max-requests-in-flight",), _requests_in_flight,
            "/metrics and /debug/ requests admitted at once"),
    Setting("server.cpuShare", "server.cpu_share", ("--server-cpu-share",), _cpu_share,
            "fraction of one core /metrics and /debug/ requests may use"),
    Setting("qos.dryRun", "qos.dry_run", ("--dry-run",), _bool,
            "QoS strategies compute and audit but change nothing", is_bool=True),
    Setting("qos.dryRunStrategies", "qos.dry_run_strategies", ("--qos-dry-run-strategies",),
            _strategy_names, "these QoS strategies (comma-separated) only compute and audit"),
    Setting("qos.reconcileInterval", "qos.reconcile_interval",
            ("--reconcile-interval-seconds",), _positive_duration,
            "cgroup reconcile and CPU burst interval", "--reconcile-interval-seconds"),
    Setting("qos.cpuSuppressInterval", "qos.cpu_suppress_interval",
            ("--cpu-suppress-interval-seconds",), _positive_duration, "CPU suppress interval",
            "--cpu-suppress-interval-seconds"),
    Setting("qos.cpuEvictInterval", "qos.cpu_evict_interval", ("--cpu-evict-interval-seconds",),
            _positive_duration, "CPU eviction interval", "--cpu-evict-interval-seconds"),
    Setting("qos.memoryEvictInterval", "qos.memory_evict_interval",
            ("--memory-evict-interval-seconds",), _positive_duration, "memory eviction interval",
            "--memory-evict-interval-seconds"),
    Setting("qos.memoryEvictCoolTime", "qos.memory_evict_cool_time",
            ("--memory-evict-cool-time-seconds",), _positive_duration,
            "pause after a memory eviction", "--memory-evict-cool-time-seconds"),
    Setting("qos.cpuEvictCoolTime", "qos.cpu_evict_cool_time",
            ("--cpu-evict-cool-time-seconds",), _positive_duration,
            "pause after a CPU eviction", "--cpu-evict-cool-time-seconds"),
    Setting("qos.evictMaxPerRound", "qos.evict_max_per_round", ("--qos-evict-max-per-round",),
            _evictions, "evictions per strategy round at most (0: no cap)"),
    Setting("qos.evictDedupeWindow", "qos.evict_dedupe_window",
            ("--qos-evict-dedupe-window-seconds",), _positive_duration,
            "seconds before a pod may be evicted again"),
    Setting("qos.memoryDistressPSIFullPercent", "qos.memory_distress_psi_full_on",
            ("--memory-distress-psi-full-percent",), _percent,
            "evict BE pods at this memory PSI full percent over the window (0: off)"),
    Setting("qos.memoryDistressPSIFullOffPercent", "qos.memory_distress_psi_full_off",
            ("--memory-distress-psi-full-off-percent",), _percent,
            "the PSI distress signal turns off below this percent (0: half of the on one)"),
    Setting("qos.memoryDistressReclaimPagesPerSecond", "qos.memory_distress_reclaim_on",
            ("--memory-distress-reclaim-pages-per-second",), _non_negative,
            "evict BE pods at this reclaim scan rate, pages/s (0: off)"),
    Setting("qos.memoryDistressReclaimOffPagesPerSecond", "qos.memory_distress_reclaim_off",
            ("--memory-distress-reclaim-off-pages-per-second",), _non_negative,
            "the reclaim distress signal turns off below this rate (0: half of the on rate)"),
    Setting("qos.memoryDistressWindow", "qos.memory_distress_window",
            ("--memory-distress-window",), _positive_duration,
            "window of the memory distress rates"),
    Setting("qos.memoryDistressSustain", "qos.memory_distress_sustain",
            ("--memory-distress-sustain",), _duration_or_zero,
            "a distress signal must hold this long before it turns on"),
    Setting("qos.memoryDistressInterval", "qos.memory_distress_interval",
            ("--memory-distress-interval",), _positive_duration,
            "seconds between two readings of the distress counters"),
    Setting("qos.beEvictionConditionCoolDown", "qos.be_eviction_condition_cool_down",
            ("--be-eviction-condition-cool-down",), _positive_duration,
            "lift the BE eviction Node condition this long after the last eviction"),
    Setting("qos.onlyEvictByAPI", "qos.only_evict_by_api", ("--only-evict-by-api",), _bool,
            "cluster mode: never kill when the Eviction API fails", "--only-evict-by-api",
            is_bool=True),
    Setting("kube.kubeconfig", "kube.kubeconfig", ("--kubeconfig",), _optional_file,
            "kubeconfig file ('' for $KUBECONFIG, else in-cluster)", "--kubeconfig"),
    Setting("kube.syncTimeout", "kube.sync_timeout", ("--kube-sync-timeout",),
            _positive_duration, "wait for the first API sync before protect-only mode"),
    Setting("kube.requestTimeout", "kube.request_timeout", ("--kube-request-timeout",),
            _positive_duration, "time one API request may take"),
    Setting("kube.enableNodeMetricReport", "kube.enable_node_metric_report",
            ("--enable-node-metric-report",), _bool, "write the NodeMetric status",
            "--enable-node-metric-report", is_bool=True),
    Setting("kube.kubeletConfigFile", "kube.kubelet_config_file", ("--kubelet-config-file",),
            _optional_file, "kubelet config file (topology policy, reserved resources)"),
    Setting("kube.kubeletTopologyPolicy", "kube.kubelet_topology_policy",
            ("--kubelet-topology-manager-policy",),
            _choice("", "none", "best-effort", "restricted", "single-numa-node"),
            "kubelet topology manager policy when its config file does not say"),
    Setting("kube.kubeletTopologyScope", "kube.kubelet_topology_scope",
            ("--kubelet-topology-manager-scope",), _choice("", "container", "pod"),
            "kubelet topology manager scope when its config file does not say"),
    Setting("kube.podsSource", "kube.pods_source", ("--pods-source",),
            _choice("apiserver", "kubelet", "both"), "cluster mode: apiserver, kubelet or both"),
    Setting("kube.kubeletAddress", "kube.kubelet_address", ("--kubelet-address",),
            _optional_host, "kubelet host name or IP ('' for the Node's address)"),
    Setting("kube.kubeletPreferredAddressType", "kube.kubelet_preferred_address_type",
            ("--kubelet-preferred-address-type",), _nonempty,
            "Node address type to reach the kubelet", "--kubelet-preferred-address-type"),
    Setting("kube.kubeletPort", "kube.kubelet_port", ("--kubelet-port",), _port(True),
            "kubelet HTTPS port (0 for the Node's)"),
    Setting("kube.kubeletInsecureTLS", "kube.kubelet_insecure_tls", ("--kubelet-insecure-tls",),
            _bool, "HTTP to the kubelet's read-only port", "--kubelet-insecure-tls", is_bool=True),
    Setting("kube.kubeletReadOnlyPort", "kube.kubelet_read_only_port",
            ("--kubelet-read-only-port",), _port(False), "kubelet read-only port",
            "--kubelet-read-only-port"),
    Setting("kube.kubeletTokenFile", "kube.kubelet_token_file", ("--kubelet-token-file",),
            _optional_file, "bearer token file for the kubelet ('' for none)"),
    Setting("kube.kubeletCAFile", "kube.kubelet_ca_file", ("--kubelet-ca-file",),
            _optional_file, "CA of the kubelet's certificate ('' to skip verification)"),
    Setting("kube.kubeletSyncInterval", "kube.kubelet_sync_interval",
            ("--kubelet-sync-interval",), _positive_duration, "interval between kubelet polls",
            "--kubelet-sync-interval"),
    Setting("kube.kubeletSyncTimeout", "kube.kubelet_sync_timeout", ("--kubelet-sync-timeout",),
            _positive_duration, "time one kubelet request may take", "--kubelet-sync-timeout"),
    Setting("runtimeHooks.addr", "runtime_hooks.addr", ("--runtime-hooks-addr",),
            _optional_socket, "hook server unix socket ('' disables it)", "--runtime-hooks-addr"),
    Setting("runtimeHooks.hostEndpoint", "runtime_hooks.host_endpoint",
            ("--runtime-hooks-host-endpoint",), _abs_path,
            "the hook socket as the host sees it (for koord-runtime-proxy)",
            "--runtime-hooks-host-endpoint"),
    Setting("runtimeHooks.configPath", "runtime_hooks.config_path",
            ("--runtime-hooks-config-path",), _abs_path,
            "folder of koord-runtime-proxy's hook-server files", "--runtime-hooks-config-path"),
    Setting("runtimeHooks.disableStages", "runtime_hooks.disable_stages",
            ("--runtime-hooks-disable-stages",), _hook_stages,
            "runtime hook stages where no hook runs", "--runtime-hooks-disable-stages"),
    Setting("runtimeHooks.timeout", "runtime_hooks.timeout", ("--runtime-hooks-timeout",),
            _positive_duration, "time one request's hooks may take before it goes on unchanged"),
    Setting("runtimeHooks.reconcileInterval", "runtime_hooks.reconcile_interval",
            ("--runtime-hooks-reconcile-interval",), _positive_duration,
            "interval of the reconciler applying the hooks to running pods' cgroups",
            "--runtime-hooks-reconcile-interval"),
    Setting("runtimeHooks.nri", "runtime_hooks.nri", ("--enable-nri-runtime-hook",), _bool,
            "register as an NRI plugin with the runtime", "--enable-nri-runtime-hook",
            is_bool=True),
    Setting("runtimeHooks.varRunRootDir", "runtime_hooks.var_run_root", ("--var-run-root-dir",),
            _abs_path, "the host's /var/run", "--var-run-root-dir"),
    Setting("runtimeHooks.nriSocketPath", "runtime_hooks.nri_socket_path",
            ("--runtime-hooks-nri-socket-path",), _nonempty,
            "NRI socket (relative to --var-run-root-dir)", "--runtime-hooks-nri-socket-path"),
    Setting("runtimeHooks.nriPluginName", "runtime_hooks.nri_plugin_name",
            ("--runtime-hooks-nri-plugin-name",), _plugin_name, "NRI plugin name",
            "--runtime-hooks-nri-plugin-name"),
    Setting("runtimeHooks.nriPluginIndex", "runtime_hooks.nri_plugin_index",
            ("--runtime-hooks-nri-plugin-index",), _plugin_index, "NRI plugin index",
            "--runtime-hooks-nri-plugin-index"),
    Setting("runtimeHooks.nriConnectTimeout", "runtime_hooks.nri_connect_timeout",
            ("--runtime-hooks-nri-connect-timeout",), _positive_duration,
            "time to connect and register with NRI", "--runtime-hooks-nri-connect-timeout"),
    Setting("runtimeHooks.nriBackoffDuration", "runtime_hooks.nri_backoff_duration",
            ("--runtime-hooks-nri-backoff-duration",), _positive_duration,
            "first NRI reconnect delay", "--runtime-hooks-nri-backoff-duration"),
    Setting("runtimeHooks.nriBackoffFactor", "runtime_hooks.nri_backoff_factor",
            ("--runtime-hooks-nri-backoff-factor",), _factor, "NRI reconnect delay multiplier",
            "--runtime-hooks-nri-backoff-factor"),
    Setting("runtimeHooks.nriBackoffCap", "runtime_hooks.nri_backoff_cap",
            ("--runtime-hooks-nri-backoff-cap",), _positive_duration,
            "longest NRI reconnect delay", "--runtime-hooks-nri-backoff-cap"),
    Setting("runtimeHooks.terwayQoSDir", "runtime_hooks.terway_qos_dir",
            ("--runtime-hooks-terway-qos-dir",), _abs_path,
            "terway-qos's folder, for the TerwayQoS hook's files"),
    Setting("audit.logDir", "audit.log_dir", ("--audit-log-dir",), _optional_abs_path,
            "audit log directory ('' for <state-dir>/audit)", "--audit-log-dir"),
    Setting("audit.maxDiskSpaceMB", "audit.max_disk_space_mb", ("--audit-max-disk-space-mb",),
            _disk_mb, "MiB the audit log may take on disk", "--audit-max-disk-space-mb"),
)
# fmt: on
"""Every setting but the feature gates (``featureGates`` / ``--feature-gates``), which merge gate
by gate instead of replacing each other."""
FEATURE_GATES_KEY = "featureGates"
"""The YAML key of the feature gates: a mapping of gate → bool, or a ``--feature-gates`` string."""

_BY_KEY = {s.key: s for s in SETTINGS}
_SECTIONS = ("paths", "cgroup", "collect", "server", "qos", "audit", "kube", "runtimeHooks")
_LONG_FLAGS = {f[2:] for s in SETTINGS for f in s.flags}
_LONG_FLAGS |= {"config", "feature-gates", "version", "help"}
_METAVARS: Mapping[Callable[[object], Any], str] = {
    _positive_duration: "DURATION",
    _duration_or_zero: "DURATION",
    _percent: "PERCENT",
    _non_negative: "NUMBER",
    _abs_path: "DIR",
    _addr: "HOST:PORT",
    _optional_path: "FILE",
    _optional_host: "HOST",
    _optional_file: "FILE",
    _optional_abs_path: "DIR",
    _strategy_names: "A,B",
    _disk_mb: "MIB",
    _hook_stages: "A,B",
    _optional_socket: "SOCKET",
}
_DEFAULT_TEXT = {
    "nodeName": "$NODE_NAME, else the host name",
    "nodesloFile": f"{DEFAULT_NODESLO_FILE} if it exists",
    "qos.dryRunStrategies": "none",
    "audit.logDir": "<state-dir>/audit",
}


class _Parser(SuggestingParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(suggestion(self, message), source="command line")


def _attr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _default_text(setting: Setting) -> str:
    if setting.key in _DEFAULT_TEXT:
        return _DEFAULT_TEXT[setting.key]
    value = _attr(KoordletConfig(node_name="-"), setting.attr)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}s"
    return str(value)


def build_parser(commands: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The command-line parser; ``--help`` lists every flag with its default and Koordinator's
    name for it, then the feature gates, then ``commands`` (name → one line), the subcommands
    the entry point takes instead of flags."""
    epilog = "feature gates (--feature-gates):\n  " + "\n  ".join(help_lines())
    usage = None
    if commands:
        width = max(len(name) for name in commands)
        epilog += "\n\ncommands (koordlet COMMAND --help for their options):\n" + "\n".join(
            f"  {name:<{width}}  {text}" for name, text in commands.items()
        )
        usage = "koordlet [FLAGS]\n       koordlet {" + ",".join(commands) + "} ..."
    parser = _Parser(
        prog="koordlet",
        usage=usage,
        description="koordinator-py's koordlet: Koordinator's node agent, in Python.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=VERSION_TEXT)
    parser.add_argument(
        "-v",
        "--verbose",
        nargs="?",
        const="4",
        metavar="N",
        default=argparse.SUPPRESS,
        help="debug logging, tracebacks of start-up failures included (as --log-level debug); "
        "a klog verbosity N below 4 keeps info (default: off; Koordinator: -v)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="YAML file with these settings; flags override it (default: none)",
    )
    parser.add_argument(
        FEATURE_GATES_FLAG,
        dest=FEATURE_GATES_KEY,
        action="append",
        metavar="A=true,B=false",
        default=argparse.SUPPRESS,
        help="feature gates, listed below; repeatable (default: Koordinator's defaults; "
        "Koordinator: --feature-gates)",
    )
    for s in SETTINGS:
        mirror = f"; Koordinator: {s.koordinator}" if s.koordinator else ""
        text = f"{s.help} (default: {_default_text(s)}{mirror})"
        if s.is_bool:
            parser.add_argument(
                *s.flags, dest=s.key, nargs="?", const="true", metavar="BOOL", help=text,
                default=argparse.SUPPRESS,
            )  # fmt: skip
        else:
            metavar = _METAVARS.get(s.convert, "VALUE")
            parser.add_argument(
                *s.flags, dest=s.key, metavar=metavar, help=text, default=argparse.SUPPRESS
            )
    return parser


def _go_style(argv: Sequence[str]) -> list[str]:
    """Go's flag package also takes ``-name``: rewrite ``-addr=:9316`` as ``--addr=:9316``."""
    out = []
    for arg in argv:
        if arg[:1] == "-" and arg[:2] != "--" and arg[1:].partition("=")[0] in _LONG_FLAGS:
            arg = "-" + arg
        out.append(arg)
    return out


def _convert(setting: Setting, raw: object, source: str, field: str = "") -> Any:
    try:
        return setting.convert(raw)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err), source=source, field=field) from err


def _config_error(err: SchemaError) -> ConfigError:
    return ConfigError(err.message, source=err.source, field=err.field)


def _unknown_key(key: str, path: str) -> ConfigError:
    import difflib  # only for a misspelt key: not worth its import on every start

    known = [*_BY_KEY, FEATURE_GATES_KEY, *_SECTIONS]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown setting{hint}; see docs/configuration.md", source=path, field=key)


def _file_entries(doc: Mapping[Any, Any], path: str) -> list[tuple[str, Any]]:
    """(key path, value) pairs of a config document; sections are flattened."""
    entries: list[tuple[str, Any]] = []
    for key, value in doc.items():
        if key not in _SECTIONS:
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
            overrides[str(name)] = _bool(raw)
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
        elif key not in _BY_KEY:
            raise _unknown_key(key, path)
        elif value is not None:  # null: leave the default
            values[key] = _convert(_BY_KEY[key], value, path, key)
            sources[key] = (path, key)
    return gates


def _checked_node_name(environ: Mapping[str, str]) -> str:
    source = "NODE_NAME" if environ.get("NODE_NAME", "").strip() else "host name"
    name: str = _convert(_BY_KEY["nodeName"], default_node_name(environ), source)
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
    args = vars(build_parser(commands).parse_args(_go_style(argv)))
    values: dict[str, Any] = {}
    sources: dict[str, tuple[str, str]] = {}
    config_file: str | None = args.pop("config", None)
    verbose = args.pop("verbose", None)
    gates = FeatureGates() if config_file is None else _read_file(config_file, values, sources)
    for text in args.pop(FEATURE_GATES_KEY, []):
        overrides = parse_overrides(text, source=FEATURE_GATES_FLAG)
        gates = gates.merged(overrides, source=FEATURE_GATES_FLAG)
    for key, raw in args.items():
        flag = _BY_KEY[key].flags[0]
        values[key] = _convert(_BY_KEY[key], raw, flag)
        sources[key] = (flag, "")
    if verbose is not None:
        values["logLevel"] = _verbosity(verbose)

    top: dict[str, Any] = {}
    # keyed by KoordletConfig attribute (the YAML section names but runtimeHooks)
    sections: dict[str, dict[str, Any]] = {name: {} for name in (*_SECTIONS, "runtime_hooks")}
    for key, value in values.items():
        section, _, attr = _BY_KEY[key].attr.rpartition(".")
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
        value = _attr(cfg, s.attr)
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

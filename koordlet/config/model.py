"""The koordlet's configuration as frozen dataclasses: one per YAML section, and
:class:`KoordletConfig` holding them all. Every field's docstring gives its unit, default and the
Koordinator flag or field it mirrors; docs/configuration.md lists them for users.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import field
from typing import Literal

from apis.kubernetes_keys import SERVICE_ACCOUNT_TOKEN_PATH
from apis.records import frozen
from apis.terway import TERWAY_QOS_DIR
from koordlet.features import FeatureGates
from koordlet.system.paths import HostPaths

DEFAULT_NODESLO_FILE = "/etc/koordinator/nodeslo.yaml"
"""The NodeSLO file standalone mode reads when ``--nodeslo-file`` is not given, if it exists."""

CgroupVersionSetting = Literal["auto", "v1", "v2"]
CgroupDriverSetting = Literal["auto", "systemd", "cgroupfs"]
LogLevel = Literal["debug", "info", "warning", "error"]


@frozen
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


@frozen
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
    """Cold memory from kidled or DAMON (gate ``ColdPageCollector``); Koordinator's
    ``--coldpage-collector-interval`` (default 5 s)."""
    cold_page_age: float = 300.0
    """Seconds without access that make a page cold for the DAMON source (kidled keeps its own
    scan-count boundary); default 300, what Koordinator's kidled boundary means at its 5 s scan
    period (60 scans, ``defaultKidledColdBoundary``); ``--cold-page-age``, ours."""
    enable_resctrl_collector: bool = False
    """Collect LLC occupancy and memory bandwidth from resctrl monitoring; Koordinator's
    ``--enable-resctrl-collector`` (default false)."""
    resctrl_interval: float = 1.0
    """resctrl monitoring collection; Koordinator's ``--resctrl-collector-interval`` (default
    1 s)."""


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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

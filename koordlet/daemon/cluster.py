"""The daemon's cluster mode (without ``--standalone``): the API server connection and the
informers, the kubelet's ``/pods``, the reporters (NodeMetric, NodeResourceTopology, Device) and
the BE eviction Node condition. Each function wires one part into the daemon
(:class:`koordlet.daemon.Daemon`) at its stage; what they import (the Kubernetes client layer,
the reporters) is imported when called, so a standalone daemon never loads it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from apis.errors import FieldError
from koordlet.errors import ConfigError

if TYPE_CHECKING:
    from koordlet.daemon import Daemon
    from koordlet.qos.evictor import Evictor
    from koordlet.statesinformer.kube import KubeStatesSource
    from koordlet.statesinformer.kubelet import KubeletPodsSource
    from koordlet.statesinformer.sources import PodSource
    from koordlet.supervisor import Supervisor

logger = logging.getLogger(__name__)

ACCELERATORS_GATE = "Accelerators"
"""The gate of the GPU collector (its row in the collector table) and of the Device report."""


async def start_kube_states(daemon: Daemon) -> KubeStatesSource:
    """Cluster mode: connect, follow this node's Node, pods, NodeSLO and NodeMetric, and wait
    a bounded time for the first sync; without it, protect on the persisted NodeSLO."""
    from koordlet.statesinformer.kube import KubeStatesSource
    from kubeclient.client import KubeClient
    from kubeclient.errors import ConfigError as KubeConfigError

    kube_cfg = daemon.cfg.kube
    try:
        kube = await KubeClient.connect(
            kube_cfg.kubeconfig or None, request_timeout=kube_cfg.request_timeout
        )
    except KubeConfigError as err:
        raise kubeconfig_error(kube_cfg.kubeconfig, err) from err
    daemon.kube = kube
    daemon.on_stop("states", lambda _t: kube.close())
    states = KubeStatesSource(
        kube, daemon.cfg.node_name, lambda: daemon.need(daemon.host).layout, daemon.cfg.state_dir
    )
    daemon.kube_states = states
    persisted = await asyncio.to_thread(states.load_persisted)
    daemon.supervisor_for("states").spawn("kube-states", states.run, component="statesinformer")
    if not await states.wait_synced(kube_cfg.sync_timeout):
        logger.warning(
            "API server not synced within %gs: protect-only mode on the %s NodeSLO; "
            "retrying in the background",
            kube_cfg.sync_timeout,
            "persisted" if persisted else "default",
        )
    return states


async def start_kubelet_pods(daemon: Daemon, states: KubeStatesSource) -> KubeletPodsSource:
    """``--pods-source=kubelet|both``: poll the kubelet's ``/pods`` (address and port from
    the Node unless configured), with a bounded wait for the first answer."""
    from koordlet.statesinformer.kubelet import KubeletPodsSource, KubeletSourceConfig

    k = daemon.cfg.kube
    source = KubeletPodsSource(
        KubeletSourceConfig(
            address=k.kubelet_address,
            preferred_address_type=k.kubelet_preferred_address_type,
            port=k.kubelet_port,
            insecure_tls=k.kubelet_insecure_tls,
            read_only_port=k.kubelet_read_only_port,
            token_file=k.kubelet_token_file,
            ca_file=k.kubelet_ca_file,
            sync_interval=k.kubelet_sync_interval,
            sync_timeout=k.kubelet_sync_timeout,
        ),
        daemon.cfg.node_name,
        lambda: daemon.need(daemon.host).layout,
        node=states.node,
    )
    daemon.kubelet_pods = source
    daemon.on_stop("states", lambda _t: source.close())
    daemon.supervisor_for("states").spawn_loop(
        "kubelet-pods",
        source.poll,
        k.kubelet_sync_interval,
        component="statesinformer",
        step_timeout=k.kubelet_sync_timeout + 5.0,
    )
    if not await source.wait_synced(k.sync_timeout):
        logger.warning(
            "kubelet /pods not answered within %gs; retrying in the background",
            k.sync_timeout,
        )
    return source


async def start_reporters(daemon: Daemon, supervisor: Supervisor, states: KubeStatesSource) -> None:
    """Cluster mode: the peak predictor and the NodeMetric status (``--enable-node-metric-
    report``), the NodeResourceTopology (gate ``NodeTopologyReport``) and the Device (gate
    ``Accelerators``)."""
    from koordlet.reporter.nodemetric import NodeMetricReporter
    from koordlet.reporter.predictor import PeakPredictor, PredictorConfig
    from koordlet.reporter.topology import KubeletTopology, TopologyReporter

    kube, cache, kube_cfg = daemon.need(daemon.kube), daemon.need(daemon.cache), daemon.cfg.kube
    pod_source: PodSource = states
    if daemon.kubelet_pods is not None and daemon.cfg.kube.pods_source == "kubelet":
        pod_source = daemon.kubelet_pods
    pods = lambda: pod_source.list_pods().values()  # noqa: E731 (a view, read at each round)
    if kube_cfg.enable_node_metric_report:
        predictor = PeakPredictor(
            PredictorConfig(state_dir=daemon.cfg.state_dir), cache, pods, states.node
        )
        supervisor.spawn("prediction", predictor.run, component="reporter")
        reporter = NodeMetricReporter(kube, states, cache, predictor=predictor)
        daemon.reporter = reporter
        supervisor.spawn("nodemetric-report", reporter.run, component="reporter")
    if daemon.cfg.feature_gates.enabled("NodeTopologyReport"):
        kubelet = await asyncio.to_thread(
            KubeletTopology.load,
            kube_cfg.kubelet_config_file or None,
            policy=kube_cfg.kubelet_topology_policy or None,
            scope=kube_cfg.kubelet_topology_scope or None,
        )
        topology = TopologyReporter(kube, cache, states.node, pods, kubelet)
        daemon.kubelet_topology = kubelet
        supervisor.spawn("nrt-report", topology.run, component="reporter")
    if daemon.cfg.feature_gates.enabled(ACCELERATORS_GATE):
        from koordlet.reporter.device import DeviceReporter

        devices = DeviceReporter(kube, cache, states.node)
        supervisor.spawn("device-report", devices.run, component="reporter")


def start_eviction_condition(
    daemon: Daemon, supervisor: Supervisor, evictor: Evictor, states: KubeStatesSource
) -> None:
    """Cluster mode: the Node condition ``koordinator.sh/BEEvictionPressure`` while evicting
    BE pods (gate ``BEEvictionCondition``); with the gate off, only a stale one is lifted."""
    from koordlet.reporter.evictioncondition import FEATURE_GATE, EvictionCondition

    condition = EvictionCondition(
        daemon.need(daemon.kube),
        daemon.cfg.node_name,
        states.node,
        enabled=daemon.cfg.feature_gates.enabled(FEATURE_GATE),
        cool_down=daemon.cfg.qos.be_eviction_condition_cool_down,
    )
    daemon.eviction_condition = condition
    evictor.add_listener(condition.on_evictions)
    supervisor.spawn("be-eviction-condition", condition.run, component="reporter")


def kubeconfig_error(given: str, err: FieldError) -> ConfigError:
    """A one-line start-up error for an API server the koordlet cannot reach a configuration
    for: a kubeconfig that does not load names the file; none at all (and not in a pod) says to
    pass one, or ``--standalone``."""
    path = given or os.environ.get("KUBECONFIG", "")
    if path:
        reason = err.message if os.path.exists(path) else "no such file"
        source = "--kubeconfig" if given else "$KUBECONFIG"
        return ConfigError(reason, source=source, field=path)
    return ConfigError(
        "not given, $KUBECONFIG unset and not running in a cluster (no service account); "
        "pass --kubeconfig FILE, or --standalone to run without Kubernetes",
        source="--kubeconfig",
    )

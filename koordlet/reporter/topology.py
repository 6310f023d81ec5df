"""NodeResourceTopology: the node's NUMA zones and CPU layout, written only when they change.

Koordinator's koordlet keeps one ``topology.node.k8s.io/v1alpha1`` NodeResourceTopology per node
(named after it, labelled ``app.kubernetes.io/managed-by: Koordinator``, owned by the Node) that
the scheduler's NUMA-aware plugins read. :func:`build_nrt` derives the desired object from the
``node_info`` value the node-info collector stores in the metric cache:

- ``topologyPolicies``: one value from the kubelet's ``topologyManagerPolicy`` and
  ``topologyManagerScope`` (:func:`topology_policy`: ``none`` → ``None``, ``best-effort`` →
  ``BestEffort<Scope>Level``, ``restricted`` → ``Restricted<Scope>Level``, ``single-numa-node``
  → ``SingleNUMANode<Scope>Level``; scope ``container`` (the kubelet's default) or ``pod``);
- ``zones``: per NUMA node ``node-<id>`` of type ``Node`` with ``cpu`` (the count of its online
  CPUs) and ``memory`` (its ``MemTotal``, else the collector's ``numa_memory_total``), each with
  ``capacity``, ``allocatable`` (capacity less the kubelet's ``reservedSystemCPUs`` on that node
  and its ``reservedMemory`` for it) and ``available`` (= allocatable, as upstream);
- annotation ``node.koordinator.sh/cpu-topology``: ``{"detail": [{"id", "core", "socket",
  "node"}...]}`` by CPU id;
- annotation ``node.koordinator.sh/cpu-shared-pools``: ``[{"socket", "node", "cpuset"}...]`` per
  NUMA node, the CPUs left once the kubelet's reserved CPUs, the CPUs the Node's reservation
  annotation reserves, the exclusive SYSTEM QoS CPUs and the cpusets of LSE and LSR pods
  (``scheduling.koordinator.sh/resource-status``) are taken out;
- annotation ``node.koordinator.sh/be-cpu-shared-pools``: the same for BE, which may also use the
  CPUs of LSR pods (only LSE pods' cpusets are taken out);
- annotation ``node.koordinator.sh/cpu-basic-info``: the CPU model, hyper-threading, turbo, vendor
  and L3 CAT mask (``apis.nodetopo.CPUBasicInfo``, written as Go marshals it), what koord-manager's
  CPU normalization keys its ratio on;
- annotation ``node.koordinator.sh/reservation``: ``{"reservedCPUs": "0-1"}``, the CPUs the Node's
  ``node.koordinator.sh/reservation`` reserves (a CPU count is turned into CPUs by topology,
  ``koordlet.statesinformer.nodetopo``), ``{}`` when none;
- annotation ``node.koordinator.sh/system-qos-resource``: the Node's annotation of that name as
  read (``{}`` when absent).

:class:`TopologyReporter` compares the desired content (those labels, annotations, owner
reference, policies, and the zones' names, types and ``cpu`` and ``memory``; never
``resourceVersion`` or fields others own) with the last one it wrote or read, and writes only on
a difference: a create when the object does not exist, else a PUT of the current object with our
parts replaced (compare-and-swap on ``resourceVersion``; a 409 is retried on the next round).
Zones merge as upstream's ``MergeZoneList(TrimDifferentZone(...))`` (:func:`merge_zones`): a zone
the koordlet no longer reports goes, ``cpu`` and ``memory`` are the koordlet's, and any other
resource of a zone (koord-manager's NUMA-level ``kubernetes.io/batch-cpu`` and ``batch-memory``)
stays as its writer left it. It re-reads the object every ``resync`` seconds so that an
edit by someone else is repaired. Upstream's Go agent rewrites the object every few seconds; this
one writes once per real change.

The kubelet's policy comes from :class:`KubeletTopology`: flags (``--kubelet-topology-policy``
and scope) win, else the kubelet config file (``topologyManagerPolicy``,
``topologyManagerScope``, ``reservedSystemCPUs``, ``reservedMemory``), else ``None``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from apis.cpulist import format_cpulist, parse_cpulist
from apis.extension import ANNOTATION_CPU_SHARED_POOLS as ANNOTATION_CPU_SHARED_POOLS
from apis.extension import ANNOTATION_CPU_TOPOLOGY as ANNOTATION_CPU_TOPOLOGY
from apis.extension import (
    ANNOTATION_NODE_BE_CPU_SHARED_POOLS,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    ANNOTATION_RESOURCE_STATUS,
    LABEL_MANAGED_BY,
    QoSClass,
)
from apis.kubernetes_keys import RESOURCE_CPU, RESOURCE_MEMORY
from apis.nodetopo import ANNOTATION_CPU_BASIC_INFO, ANNOTATION_NODE_RESERVATION, reservation_json
from apis.quantity import format_bytes, int_value
from apis.records import frozen
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.statesinformer.model import PodInfo
from koordlet.statesinformer.nodetopo import (
    cpu_basic_info,
    cpus_of_node_info,
    node_annotations,
    reserved_cpus,
    system_qos_resource,
)
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError, Conflict, NotFound
from kubeclient.resources import NODE_RESOURCE_TOPOLOGIES
from kubeclient.yamlchild import YamlError, load_yaml

logger = logging.getLogger(__name__)

NODE_INFO_KEY = "node_info"
"""Metric cache info key of the node-info collector."""
ZONE_TYPE = "Node"
"""The type of the koordlet's zones (one a NUMA node)."""
ZONE_RESOURCES = (RESOURCE_CPU, RESOURCE_MEMORY)
"""The resources the koordlet owns within a zone, as upstream's koordlet (``calTopologyZoneList``,
compared by ``isEqualNRTZones``); other resources of a zone belong to others (the manager's
``kubernetes.io/batch-cpu`` and ``batch-memory``) and are kept."""

_POLICY_NAMES = {
    "best-effort": "BestEffort",
    "restricted": "Restricted",
    "single-numa-node": "SingleNUMANode",
}
_SCOPES = {"container": "ContainerLevel", "pod": "PodLevel"}


def topology_policy(policy: str, scope: str = "container") -> str:
    """The NRT ``topologyPolicies`` value of the kubelet's topology manager policy and scope
    (``getTopologyPolicy`` upstream); anything unknown is ``None``."""
    name = _POLICY_NAMES.get(policy)
    level = _SCOPES.get(scope or "container")
    if name is None or level is None:
        return "None"
    return name + level


@frozen
class KubeletTopology:
    """What the koordlet knows of the kubelet's topology settings."""

    policy: str = "none"
    """``topologyManagerPolicy`` (``none``, ``best-effort``, ``restricted``,
    ``single-numa-node``)."""
    scope: str = "container"
    """``topologyManagerScope`` (``container`` or ``pod``)."""
    reserved_cpus: frozenset[int] = frozenset()
    """``reservedSystemCPUs``: taken out of the zones' allocatable CPUs and the shared pools."""
    reserved_memory: Mapping[int, int] | None = None
    """``reservedMemory``: bytes per NUMA node taken out of the zones' allocatable memory."""
    cpu_manager_policy: str | None = None
    """``cpuManagerPolicy`` (``none``, ``static``) when a kubelet config file was read (the
    kubelet's default ``none`` when it does not say); None when no file told it. The cpuset
    runtime hook gives pods without a Koordinator class the share pools only under ``none``."""

    @classmethod
    def load(
        cls, config_path: str | None, *, policy: str | None = None, scope: str | None = None
    ) -> KubeletTopology:
        """From the kubelet config file (None, missing or unreadable: defaults, logged), with
        ``policy`` and ``scope`` (flags) taking precedence."""
        doc: Mapping[str, Any] = {}
        cpu_policy: str | None = None
        if config_path:
            try:
                with open(config_path, encoding="utf-8") as f:
                    text = f.read()
            except FileNotFoundError:
                logger.info("kubelet config %s not found; topology policy None", config_path)
            except (OSError, UnicodeDecodeError) as err:
                logger.warning("kubelet config %s unreadable (%s); defaults used", config_path, err)
            else:
                try:
                    loaded = load_yaml(text)
                except YamlError as err:
                    logger.warning(
                        "kubelet config %s not YAML (%s); defaults used", config_path, err
                    )
                else:
                    doc = loaded if isinstance(loaded, dict) else {}
                    cpu_policy = str(doc.get("cpuManagerPolicy") or "none")
        reserved = frozenset[int]()
        raw_cpus = doc.get("reservedSystemCPUs")
        if isinstance(raw_cpus, str) and raw_cpus.strip():
            try:
                reserved = frozenset(parse_cpulist(raw_cpus))
            except ValueError as err:
                logger.warning("kubelet reservedSystemCPUs %r ignored: %s", raw_cpus, err)
        memory: dict[int, int] = {}
        for item in doc.get("reservedMemory") or []:
            try:
                memory[int(item["numaNode"])] = int_value(item["limits"]["memory"])
            except (KeyError, TypeError, ValueError):
                logger.warning("kubelet reservedMemory entry %r ignored", item)
        return cls(
            policy=policy or str(doc.get("topologyManagerPolicy") or "none"),
            scope=scope or str(doc.get("topologyManagerScope") or "container"),
            reserved_cpus=reserved,
            reserved_memory=memory or None,
            cpu_manager_policy=cpu_policy,
        )

    @property
    def nrt_policy(self) -> str:
        return topology_policy(self.policy, self.scope)


def _pod_cpus(pod: PodInfo) -> frozenset[int]:
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return frozenset()
    try:
        status = json.loads(raw)
        text = status.get("cpuset", "") if isinstance(status, dict) else ""
        return frozenset(parse_cpulist(text)) if isinstance(text, str) else frozenset()
    except ValueError:
        return frozenset()


def _resource(name: str, capacity: str, allocatable: str) -> Obj:
    return {
        "name": name,
        "capacity": capacity,
        "allocatable": allocatable,
        "available": allocatable,
    }


def build_nrt(
    node: Obj,
    info: Mapping[str, Any],
    kubelet: KubeletTopology,
    pods: Iterable[PodInfo] = (),
    numa_memory: Mapping[int, int] | None = None,
) -> Obj:
    """The desired NodeResourceTopology for ``node`` (module docstring). ``info`` is the
    ``node_info`` value; ``numa_memory`` fills a NUMA node's memory the info does not give."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    cpus = sorted(info.get("cpus") or [], key=lambda c: c["cpu_id"])
    exclusive: set[int] = set()
    lse: set[int] = set()
    for pod in pods:
        if pod.qos in (QoSClass.LSE, QoSClass.LSR):
            exclusive |= _pod_cpus(pod)
        if pod.qos is QoSClass.LSE:
            lse |= _pod_cpus(pod)
    annotations = node_annotations(node)
    node_reserved = reserved_cpus(annotations, cpus_of_node_info(info))
    system_qos = system_qos_resource(annotations)
    taken = node_reserved | system_qos.exclusive_cpus
    reserved = kubelet.reserved_cpus
    zones = []
    pools = []
    be_pools = []
    numa = info.get("numa") or {}
    for key in sorted(numa, key=int):
        node_id = int(key)
        ids = [c["cpu_id"] for c in cpus if c["numa_node"] == node_id]
        mem = numa[key].get("memory_total_bytes")
        if mem is None:
            mem = (numa_memory or {}).get(node_id, 0)
        mem_reserved = (kubelet.reserved_memory or {}).get(node_id, 0)
        free = [c for c in ids if c not in reserved]
        zones.append(
            {
                "name": f"node-{node_id}",
                "type": ZONE_TYPE,
                "resources": [
                    _resource(RESOURCE_CPU, str(len(ids)), str(len(free))),
                    _resource(
                        RESOURCE_MEMORY,
                        format_bytes(mem),
                        format_bytes(max(mem - mem_reserved, 0)),
                    ),
                ],
            }
        )
        shared = [c for c in free if c not in exclusive and c not in taken]
        if shared:
            socket = next(c["socket_id"] for c in cpus if c["cpu_id"] == shared[0])
            pools.append({"socket": socket, "node": node_id, "cpuset": format_cpulist(shared)})
        be_shared = [c for c in free if c not in lse and c not in taken]
        if be_shared:
            socket = next(c["socket_id"] for c in cpus if c["cpu_id"] == be_shared[0])
            be_pools.append(
                {"socket": socket, "node": node_id, "cpuset": format_cpulist(be_shared)}
            )
    detail = [
        {"id": c["cpu_id"], "core": c["core_id"], "socket": c["socket_id"], "node": c["numa_node"]}
        for c in cpus
    ]
    owner: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": name,
        "uid": str(meta.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": NODE_RESOURCE_TOPOLOGIES.api_version,
        "kind": NODE_RESOURCE_TOPOLOGIES.kind,
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED_BY: "Koordinator"},
            "annotations": {
                ANNOTATION_CPU_TOPOLOGY: json.dumps({"detail": detail}, separators=(",", ":")),
                ANNOTATION_CPU_SHARED_POOLS: json.dumps(pools, separators=(",", ":")),
                ANNOTATION_NODE_BE_CPU_SHARED_POOLS: json.dumps(be_pools, separators=(",", ":")),
                ANNOTATION_CPU_BASIC_INFO: cpu_basic_info(info).to_json(),
                ANNOTATION_NODE_RESERVATION: reservation_json(node_reserved),
                ANNOTATION_NODE_SYSTEM_QOS_RESOURCE: system_qos.to_json(),
            },
            "ownerReferences": [owner],
        },
        "topologyPolicies": [kubelet.nrt_policy],
        "zones": zones,
    }


def _owned_zones(zones: object) -> dict[str, Obj]:
    """Zone name → its type and the resources the koordlet owns in it (whole entries)."""
    out: dict[str, Obj] = {}
    for zone in zones if isinstance(zones, list) else ():
        if not isinstance(zone, Mapping):
            continue
        owned = {
            str(r.get("name")): dict(r)
            for r in zone.get("resources") or ()
            if isinstance(r, Mapping) and r.get("name") in ZONE_RESOURCES
        }
        out[str(zone.get("name"))] = {"type": zone.get("type"), "resources": owned}
    return out


def merge_zones(current: object, desired: list[Obj]) -> list[Obj]:
    """Upstream's ``MergeZoneList(TrimDifferentZone(current, desired), desired)``: the zones of
    ``desired`` (a zone the koordlet no longer reports is dropped), each with the koordlet's
    resources replacing the same-named ones of the current zone and every other resource of it
    kept (the manager's ``kubernetes.io/batch-cpu``...), resources in name order. Zones keep the
    koordlet's order (by NUMA node, the index the manager's zone calculation goes by)."""
    have = {
        str(z.get("name")): z
        for z in (current if isinstance(current, list) else ())
        if isinstance(z, Mapping)
    }
    out = []
    for want in desired:
        old = have.get(want["name"]) or {}
        resources = {
            str(r.get("name")): copy.deepcopy(dict(r))
            for r in old.get("resources") or ()
            if isinstance(r, Mapping)
        }
        for r in want["resources"]:
            resources[r["name"]] = copy.deepcopy(r)
        out.append(
            {
                "name": want["name"],
                "type": want["type"],
                "resources": [resources[k] for k in sorted(resources)],
            }
        )
    return out


def owned_view(obj: Mapping[str, Any], desired: Mapping[str, Any]) -> Obj:
    """The parts of ``obj`` that ``desired`` sets (its labels and annotations by key, owner
    references, policies, the zones' names and types and the koordlet's resources in them, as
    upstream's ``isEqualNRTZones`` compares ``cpu`` and ``memory``): what decides whether a
    write is needed. Resources others own in the zones do not count."""
    meta = obj.get("metadata") or {}
    want = desired["metadata"]
    return {
        "labels": {k: (meta.get("labels") or {}).get(k) for k in want["labels"]},
        "annotations": {k: (meta.get("annotations") or {}).get(k) for k in want["annotations"]},
        "ownerReferences": meta.get("ownerReferences") or [],
        "topologyPolicies": obj.get("topologyPolicies") or [],
        "zones": _owned_zones(obj.get("zones")),
    }


def merged(current: Obj, desired: Obj) -> Obj:
    """``current`` with the desired parts replaced; other labels and annotations kept, and the
    zones merged (:func:`merge_zones`)."""
    out = copy.deepcopy(current)
    meta = out.setdefault("metadata", {})
    want = desired["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **want["labels"]}
    meta["annotations"] = {**(meta.get("annotations") or {}), **want["annotations"]}
    meta["ownerReferences"] = want["ownerReferences"]
    out["topologyPolicies"] = desired["topologyPolicies"]
    out["zones"] = merge_zones(current.get("zones"), desired["zones"])
    return out


@dataclass
class TopologyStats:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    """Rounds that found nothing to write."""
    waiting: int = 0
    """Rounds without the Node or the node info yet."""
    failed: int = 0


class TopologyReporter:
    """Keeps the node's NodeResourceTopology equal to :func:`build_nrt`'s, writing on change.

    :param node: the Node object (its name and UID), or None while unknown.
    :param pods: the pods on this node now (LSE/LSR cpusets).
    :param interval: seconds between comparisons (cheap: no request unless something changed).
    :param resync: seconds after which the object is read again to catch edits by others.
    """

    def __init__(
        self,
        client: KubeClient,
        cache: MetricCache,
        node: Callable[[], Obj | None],
        pods: Callable[[], Iterable[PodInfo]],
        kubelet: KubeletTopology,
        *,
        interval: float = 10.0,
        resync: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._cache = cache
        self._node = node
        self._pods = pods
        self.kubelet = kubelet
        self.interval = interval
        self.resync = resync
        self._clock = clock
        self._sleep = sleep
        self._known: Obj | None = None
        """The owned view last written or read; None: read before deciding."""
        self._known_at = 0.0
        self.stats = TopologyStats()

    def desired(self) -> Obj | None:
        node = self._node()
        info = self._cache.get_info(NODE_INFO_KEY)
        if node is None or not isinstance(info, Mapping):
            return None
        numa_memory: dict[int, int] = {}
        for entity in self._cache.entities(s.NUMA_MEMORY_TOTAL):
            value = self._cache.last(s.NUMA_MEMORY_TOTAL, entity)
            node_id = entity.rpartition("/")[2]
            if value is not None and node_id.isdigit():
                numa_memory[int(node_id)] = int(value)
        return build_nrt(node, info, self.kubelet, self._pods(), numa_memory)

    async def sync_once(self) -> bool:
        """One comparison; whether a write was made. Never raises an API error (logged)."""
        desired = self.desired()
        if desired is None:
            self.stats.waiting += 1
            return False
        name = desired["metadata"]["name"]
        want = owned_view(desired, desired)
        now = self._clock()
        if self._known == want and now - self._known_at < self.resync:
            self.stats.unchanged += 1
            return False
        try:
            try:
                current = await self._client.get(NODE_RESOURCE_TOPOLOGIES, name)
            except NotFound:
                await self._client.create(NODE_RESOURCE_TOPOLOGIES, desired)
                self.stats.created += 1
                logger.info("NodeResourceTopology %s created", name)
            else:
                if owned_view(current, desired) == want:
                    self.stats.unchanged += 1
                else:
                    await self._client.replace(NODE_RESOURCE_TOPOLOGIES, merged(current, desired))
                    self.stats.updated += 1
                    logger.info("NodeResourceTopology %s updated", name)
                    self._remember(want, now)
                    return True
                self._remember(want, now)
                return False
        except Conflict:
            self._known = None
            logger.info("NodeResourceTopology %s changed meanwhile; retried next round", name)
            return False
        except ApiError as err:
            self._known = None
            self.stats.failed += 1
            logger.warning("NodeResourceTopology %s not written: %s", name, err)
            return False
        self._remember(want, now)
        return True

    def _remember(self, view: Obj, now: float) -> None:
        self._known = view
        self._known_at = now

    async def run(self) -> NoReturn:
        """Compare every ``interval`` seconds until cancelled."""
        while True:
            try:
                await self.sync_once()
            except Exception:
                logger.exception("NodeResourceTopology report failed")
            await self._sleep(self.interval)

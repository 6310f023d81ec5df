"""The kube-scheduler extender: the same plugins behind the stock kube-scheduler, over HTTP.

Verbs (``POST``, JSON, the types of ``k8s.io/kube-scheduler/extender/v1``):

- ``/filter``: ``ExtenderArgs`` (``pod`` plus ``nodes.items`` or, with ``nodeCacheCapable``,
  ``nodenames``) → ``ExtenderFilterResult`` (``nodes`` or ``nodenames`` that pass,
  ``failedNodes`` name → reasons joined by ``"; "``, ``error``).
- ``/prioritize``: ``ExtenderArgs`` → ``HostPriorityList`` ``[{"host", "score"}]``. The
  extender scale is 0..10 (``MaxExtenderPriority``): the framework's 0..100 total divided by 10;
  kube-scheduler multiplies it by the extender's ``weight`` and by 10.
- ``/bind``: ``ExtenderBindingArgs`` (``podName``, ``podNamespace``, ``podUID``, ``node``) →
  ``ExtenderBindingResult`` (``error``). Reserves in the plugins (NodeNUMAResource's cpuset),
  assumes the pod in the snapshot and, with ``--bind``, patches the reserve annotations on the
  pod and creates its ``binding`` subresource through the API server. Configure ``bindVerb`` only
  with ``--bind``: without it nothing reaches the API server.
- ``/preempt``: ``ExtenderPreemptionArgs`` → ``ExtenderPreemptionResult``: of the candidate
  nodes, those where the pod passes every filter once its victims are gone, victims as
  ``nodeNameToMetaVictims`` (``pods[].uid``, ``numPDBViolations``).
- ``GET /healthz``.

The snapshot is read from ``--snapshot`` and re-read (in a worker thread) when the file's
mtime or size changes, or, without ``--snapshot``, kept current by informers
(``informed.py``); nodes that the request carries in full but the snapshot lacks are added
from the request. Filter results are kept per pod UID and snapshot generation so that
prioritize and bind reuse the cycle (estimates, cpuset placements), as ``CycleState`` does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from kubeclient.errors import KubeError
from kubeclient.resources import PODS
from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import ERR_NODE_NOT_FOUND, Cycle, Framework, ReserveError
from scheduler_plugins.snapshot import (
    NodeInfo,
    PodInfo,
    Snapshot,
    load_snapshot,
    parse_node,
    parse_pod,
)
from scheduler_plugins.table import EXTENDER_PLUGINS

logger = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
"""``extenderv1.MaxExtenderPriority``."""
GC_GEN0_THRESHOLD = 50_000
"""Allocations between young-generation collections in the extender process (CPython's
default is 700)."""
CYCLE_CACHE_SIZE = 512
"""Pods whose filter cycle is kept for prioritize and bind."""


class Binder(Protocol):
    """Writes a placement to the cluster."""

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        """Patch ``annotations`` on the pod, then bind it to ``node``. Raises
        :class:`~kubeclient.errors.KubeError` (or ``OSError``) on failure."""


class KubeBinder:
    """A :class:`Binder` through the API server (the ``binding`` subresource)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        if annotations:
            await self.client.patch(
                PODS, pod.name, {"metadata": {"annotations": dict(annotations)}}, pod.namespace
            )
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.client.request("POST", PODS.path(pod.namespace, pod.name, "binding"), body=body)


@dataclass(slots=True)
class _Cached:
    generation: int
    pod: PodInfo
    cycle: Cycle
    passing: list[str] | None = None
    """Node names the filter passed (what kube-scheduler then sends to prioritize)."""
    passing_nodes: list[NodeInfo] | None = None


class SnapshotFile:
    """The snapshot file and when it was last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamp: tuple[float, int] | None = None

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_mtime, st.st_size) != self.stamp

    def load(self) -> Snapshot:
        st = os.stat(self.path)
        snapshot = load_snapshot(self.path)
        self.stamp = (st.st_mtime, st.st_size)
        return snapshot


class Extender:
    """The verbs, over a framework and a snapshot."""

    def __init__(
        self,
        framework: Framework,
        snapshot: Snapshot,
        *,
        source: SnapshotFile | None = None,
        binder: Binder | None = None,
        tune_gc: bool = False,
    ) -> None:
        self.tune_gc = tune_gc
        """Freeze the heap and collect less often after each (re)load: for the server process
        only (it changes the interpreter's global collector settings)."""
        self.framework = framework
        self.snapshot = snapshot
        self.source = source
        self.binder = binder
        self._cycles: OrderedDict[str, _Cached] = OrderedDict()
        self.warm()

    def warm(self) -> None:
        """Precompute per-node plugin state, then move the snapshot out of the collector's
        sight (``gc.freeze``) and collect the young generation less often: a request allocates
        thousands of short-lived objects, and a full collection over a 5,000-node snapshot is
        what the p99 would otherwise pay."""
        cycle = self.framework.new_cycle(self.snapshot)
        for plugin in self.framework.plugins:
            warm = getattr(plugin, "warm", None)
            if warm is not None:
                warm(cycle)
        if not self.tune_gc:
            return
        gc.collect()
        gc.freeze()
        gen0, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)

    async def refresh(self) -> None:
        """Re-read the snapshot file when it changed (a bad file keeps the last good one)."""
        if self.source is None or not self.source.changed():
            return
        try:
            snapshot = await asyncio.to_thread(self.source.load)
        except InputError as err:
            logger.warning("snapshot not reloaded, keeping the last good one: %s", err)
            return
        self.snapshot = snapshot
        self._cycles.clear()
        self.warm()
        logger.info("snapshot reloaded: %d nodes", len(snapshot.nodes))

    # -- helpers --------------------------------------------------------------------------

    def _pod_and_nodes(self, body: Mapping[str, Any]) -> tuple[PodInfo, list[str], bool]:
        raw_pod = body.get("pod")
        if not isinstance(raw_pod, Mapping):
            raise InputError("request", "pod", "missing")
        pod = parse_pod(raw_pod, "request", "pod")
        full = False
        names: list[str] = []
        nodes = body.get("nodes")
        if isinstance(nodes, Mapping) and nodes.get("items") is not None:
            full = True
            for i, obj in enumerate(nodes.get("items") or []):
                info = parse_node(obj, "request", f"nodes.items[{i}]")
                if info.name not in self.snapshot.nodes:
                    self.snapshot.upsert_node(info)
                names.append(info.name)
        else:
            raw_names = body.get("nodenames") or []
            if not isinstance(raw_names, list):
                raise InputError("request", "nodenames", "must be a list")
            names = raw_names
        return pod, names, full

    def _cycle(self, pod: PodInfo) -> _Cached:
        """The pod's cycle: the one its filter used while the snapshot is unchanged."""
        cached = self._cycles.get(pod.uid)
        if cached is not None and cached.generation == self.snapshot.generation:
            self._cycles.move_to_end(pod.uid)
            return cached
        cached = _Cached(self.snapshot.generation, pod, self.framework.new_cycle(self.snapshot))
        self._cycles[pod.uid] = cached
        while len(self._cycles) > CYCLE_CACHE_SIZE:
            self._cycles.popitem(last=False)
        return cached

    # -- verbs ----------------------------------------------------------------------------

    def filter(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``ExtenderFilterResult`` for ``ExtenderArgs``."""
        try:
            pod, names, full = self._pod_and_nodes(body)
        except InputError as err:
            return {"error": str(err)}
        cached = self._cycle(pod)
        nodes, missing = self.framework.resolve(self.snapshot, names)
        feasible, failures = self.framework.filter_nodes(cached.cycle, pod, nodes)
        failed = {
            name: f[0][1] if len(f) == 1 else "; ".join(r for _, r in f)
            for name, f in failures.items()
        }
        for name in missing:
            failed[name] = ERR_NODE_NOT_FOUND
        result: dict[str, Any] = {"failedNodes": failed, "error": ""}
        if full:
            keep = {n.name for n in feasible}
            result["nodes"] = {
                "items": [
                    o
                    for o in body["nodes"]["items"]
                    if (o.get("metadata") or {}).get("name") in keep
                ]
            }
        passing = [n.name for n in feasible]
        if not full:
            result["nodenames"] = passing
        cached.passing = passing
        cached.passing_nodes = feasible
        return result

    def prioritize(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``HostPriorityList`` for ``ExtenderArgs`` (0..10)."""
        try:
            pod, names, _ = self._pod_and_nodes(body)
        except InputError as err:
            logger.warning("prioritize: %s", err)
            return []
        cached = self._cycle(pod)
        if (
            cached.passing is not None
            and cached.passing_nodes is not None
            and names == cached.passing
        ):
            nodes = cached.passing_nodes
        else:
            nodes, _ = self.framework.resolve(self.snapshot, names)
        _, totals = self.framework.score_nodes(cached.cycle, pod, nodes)
        get = totals.get
        return [{"host": n, "score": get(n, 0) // MAX_EXTENDER_PRIORITY} for n in names]

    async def bind(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``ExtenderBindingResult`` for ``ExtenderBindingArgs``."""
        uid = str(body.get("podUID") or "")
        node = str(body.get("node") or "")
        cached = self._cycles.get(uid)
        if cached is None:
            key = f"{body.get('podNamespace') or 'default'}/{body.get('podName') or ''}"
            cached = next((c for c in self._cycles.values() if c.pod.key == key), None)
        if cached is None:
            pod_key = f"{body.get('podNamespace')}/{body.get('podName')}"
            return {"error": f"pod {pod_key} was not filtered here"}
        if node not in self.snapshot.nodes:
            return {"error": f"node {node!r} is not in the snapshot"}
        cycle = cached.cycle
        if cached.generation != self.snapshot.generation:
            cycle = self.framework.new_cycle(self.snapshot)
        try:
            annotations = self.framework.reserve(cycle, cached.pod, node)
        except ReserveError as err:
            return {"error": str(err)}
        if self.binder is not None:
            try:
                await self.binder.bind(cached.pod, node, annotations)
            except (KubeError, OSError) as err:  # the API said no: undo the reservation
                self.framework.unreserve(cycle, cached.pod, node)
                return {"error": f"bind {cached.pod.key} to {node}: {err}"}
        self._cycles.pop(cached.pod.uid, None)
        logger.info("bound %s to %s %s", cached.pod.key, node, annotations or "")
        return {"error": ""}

    def preempt(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``ExtenderPreemptionResult`` for ``ExtenderPreemptionArgs``."""
        raw_pod = body.get("pod")
        if not isinstance(raw_pod, Mapping):
            return {"nodeNameToMetaVictims": {}}
        try:
            pod = parse_pod(raw_pod, "request", "pod")
        except InputError as err:
            logger.warning("preempt: %s", err)
            return {"nodeNameToMetaVictims": {}}
        candidates: dict[str, tuple[list[str], int]] = {}
        for name, v in (body.get("nodeNameToMetaVictims") or {}).items():
            uids = [str(p.get("uid") or "") for p in (v or {}).get("pods") or []]
            candidates[name] = (uids, int((v or {}).get("numPDBViolations") or 0))
        for name, v in (body.get("nodeNameToVictims") or {}).items():
            uids = [
                str(((p or {}).get("metadata") or {}).get("uid") or "")
                for p in (v or {}).get("pods") or []
            ]
            candidates.setdefault(name, (uids, int((v or {}).get("numPDBViolations") or 0)))
        out: dict[str, Any] = {}
        for name, (uids, pdb) in candidates.items():
            node = self.snapshot.nodes.get(name)
            if node is None:
                continue
            removed = [p for p in (node.remove_pod(u) for u in uids) if p is not None]
            self.snapshot.touch(name)  # plugins re-index the node without its victims
            try:
                cycle = self.framework.new_cycle(self.snapshot)
                verdict = self.framework.filter(cycle, pod, [node])
            finally:
                for p in removed:
                    node.add_pod(p)
                self.snapshot.touch(name)
            if verdict[name].feasible:
                out[name] = {"pods": [{"uid": u} for u in uids], "numPDBViolations": pdb}
        return {"nodeNameToMetaVictims": out}


EXTENDER_KEY = web.AppKey("extender", Extender)


async def _json(request: web.Request) -> Mapping[str, Any]:
    try:
        body = json.loads(await request.read())
    except ValueError as err:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"bad JSON: {err}"})) from err
    if not isinstance(body, Mapping):
        raise web.HTTPBadRequest(text=json.dumps({"error": "body must be an object"}))
    return body


def _dump(obj: Any) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")), content_type="application/json"
    )


async def _filter(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    await ext.refresh()
    return _dump(ext.filter(await _json(request)))


async def _prioritize(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    await ext.refresh()
    return _dump(ext.prioritize(await _json(request)))


async def _bind(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    return _dump(await ext.bind(await _json(request)))


async def _preempt(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    await ext.refresh()
    return _dump(ext.preempt(await _json(request)))


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(extender: Extender) -> web.Application:
    """The aiohttp application serving ``extender``."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[EXTENDER_KEY] = extender
    app.router.add_post("/filter", _filter)
    app.router.add_post("/prioritize", _prioritize)
    app.router.add_post("/bind", _bind)
    app.router.add_post("/preempt", _preempt)
    app.router.add_get("/healthz", _healthz)
    return app


async def serve(
    snapshot_path: Path | None,
    cfg: SchedulerConfig,
    host: str,
    port: int,
    *,
    bind: bool = False,
    kubeconfig: str | None = None,
    sync_timeout: float = 60.0,
) -> int:
    """Serve until SIGTERM or SIGINT; 0 on a clean stop, 1 when the informers never synced.
    ``snapshot_path`` None: the snapshot comes from informers through ``kubeconfig``."""
    client = None
    informed = None
    informer_task: asyncio.Task[None] | None = None
    try:
        if bind or snapshot_path is None:
            from kubeclient.client import KubeClient

            client = await KubeClient.connect(kubeconfig)
        source: SnapshotFile | None = None
        if snapshot_path is not None:
            source = SnapshotFile(snapshot_path)
            snapshot = await asyncio.to_thread(source.load)
        else:
            from scheduler_plugins.informed import InformedSnapshot

            assert client is not None
            informed = InformedSnapshot(client)
            informer_task = asyncio.create_task(informed.run(), name="scheduler-informers")
            if not await informed.wait_synced(sync_timeout):
                logger.error("nodes and pods not listed within %.0fs; giving up", sync_timeout)
                return 1
            snapshot = informed.snapshot
        binder: Binder | None = KubeBinder(client) if bind else None
        extender = Extender(
            cfg.framework(EXTENDER_PLUGINS), snapshot, source=source, binder=binder, tune_gc=True
        )
        runner = web.AppRunner(make_app(extender), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            logger.info("extender serving on %s:%d, %d nodes", host, port, len(snapshot.nodes))
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()
        return 0
    finally:
        if informer_task is not None:
            informer_task.cancel()
            await asyncio.gather(informer_task, return_exceptions=True)
        if client is not None:
            await client.close()

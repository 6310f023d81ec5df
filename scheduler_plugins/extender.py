"""The kube-scheduler extender: the same plugins behind the stock kube-scheduler, over HTTP.

Verbs (``POST``, JSON; the wire types of ``k8s.io/kube-scheduler/extender/v1``, Go-cased keys,
are read and written by ``extenderapi.py``):

- ``/filter``: ``ExtenderArgs`` (``Pod`` plus ``NodeNames`` with ``nodeCacheCapable``, else
  ``Nodes``, a NodeList) → ``ExtenderFilterResult``: the passing nodes in the form they came
  (``NodeNames``, or the request's own Node objects in ``Nodes``), ``FailedNodes`` name →
  reasons joined by ``"; "``, ``FailedAndUnresolvableNodes`` (names the snapshot does not know),
  ``Error`` (a bad request, or informers not synced yet).
- ``/prioritize``: ``ExtenderArgs`` → ``HostPriorityList`` ``[{"Host", "Score"}]``. The
  extender scale is 0..10 (``MaxExtenderPriority``): the framework's 0..100 total divided by 10;
  kube-scheduler multiplies it by the extender's ``weight`` and by 10.
- ``/bind``: ``ExtenderBindingArgs`` (``PodName``, ``PodNamespace``, ``PodUID``, ``Node``) →
  ``ExtenderBindingResult`` (``Error``). Reserves in the plugins (NodeNUMAResource's cpuset),
  assumes the pod in the snapshot and, with ``--bind``, patches the reserve annotations on the
  pod and creates its ``binding`` subresource through the API server. Configure ``bindVerb`` only
  with ``--bind``: without it nothing reaches the API server. A pod whose filter this process did
  not see (another replica, a restart) is filtered again on the node if the informers know it.
- ``/preempt``: ``ExtenderPreemptionArgs`` → ``ExtenderPreemptionResult``: of the candidate
  nodes, those where the pod passes every filter once its victims are gone, victims as
  ``NodeNameToMetaVictims`` (UIDs) whichever form the request used.
- ``GET /healthz`` (alive), ``GET /readyz`` (503 naming the informers not synced or relisting).

A request the types do not describe gets a clear error: ``Error`` in the answer of ``/filter`` and
``/bind``, HTTP 400 with ``{"Error": ...}`` for ``/prioritize`` and ``/preempt`` (their answer
types have no error field), and for a body that is not JSON. Before every informer has listed
(and while one relists after a 410) every verb answers "not ready: waiting for ..." (503 for
prioritize and preempt).

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
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubeclient.errors import KubeError
from kubeclient.signals import StopSignals
from scheduler_plugins.binding import Binder, KubeBinder
from scheduler_plugins.config import GC_GEN0_THRESHOLD, SchedulerConfig
from scheduler_plugins.errors import InputError, NotReady
from scheduler_plugins.extenderapi import (
    EXTENDER_ARGS,
    MAX_EXTENDER_PRIORITY,
    PREEMPTION_ARGS,
    BindingArgs,
    ExtenderArgs,
    Victims,
    binding_result,
    error_body,
    filter_result,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
    preemption_result,
)
from scheduler_plugins.framework import (
    ERR_NODE_NOT_FOUND,
    MAX_NODE_SCORE,
    Cycle,
    Framework,
    ReserveError,
)
from scheduler_plugins.loading import load_snapshot
from scheduler_plugins.reservationstatus import OwnerSync
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot, parse_node, parse_pod
from scheduler_plugins.table import EXTENDER_PLUGINS

if TYPE_CHECKING:
    from scheduler_plugins.informed import InformedSnapshot

logger = logging.getLogger(__name__)

CYCLE_CACHE_SIZE = 512
"""Pods whose filter cycle is kept for prioritize and bind."""


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
        gate: Callable[[], list[str]] | None = None,
    ) -> None:
        self.tune_gc = tune_gc
        """Freeze the heap and collect less often after each (re)load: for the server process
        only (it changes the interpreter's global collector settings)."""
        self.framework = framework
        self.snapshot = snapshot
        self.source = source
        self.binder = binder
        self.gate = gate
        """What a decision still waits for (informers not synced, a watch relisting after
        410), as :meth:`InformedSnapshot.not_ready` says it; ``None``: nothing (a file)."""
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

    def not_ready(self) -> str:
        """Why no decision can be made now (informers not synced, a watch relisting), or
        ``""``."""
        if self.gate is None:
            return ""
        missing = self.gate()
        return f"not ready: waiting for {', '.join(missing)}" if missing else ""

    def _pod_and_nodes(self, args: ExtenderArgs) -> tuple[PodInfo, list[str]]:
        """The pod, and the candidate names; nodes sent in full that the snapshot lacks are
        added to it."""
        pod = self._known_pod(args.pod) or parse_pod(args.pod, EXTENDER_ARGS, "Pod")
        if args.nodes is None:
            return pod, args.names
        names: list[str] = []
        for i, obj in enumerate(args.nodes):
            info = parse_node(obj, EXTENDER_ARGS, f"Nodes.items[{i}]")
            if info.name not in self.snapshot.nodes:
                self.snapshot.upsert_node(info)
            names.append(info.name)
        return pod, names

    def _known_pod(self, raw: Mapping[str, Any]) -> PodInfo | None:
        """The pod this request's filter parsed (prioritize after filter), when the request
        carries the same object and nothing changed since: one parse a pod, not one a verb.
        The objects are compared whole (in C), so a changed pod is parsed again."""
        meta = raw.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        cached = self._cycles.get(uid) if isinstance(uid, str) and uid else None
        if (
            cached is not None
            and cached.generation == self.snapshot.generation
            and cached.pod.uid == uid
            and cached.pod.raw == raw
        ):
            return cached.pod
        return None

    def _cycle(self, pod: PodInfo) -> _Cached:
        """The pod's cycle: the one its filter used while the snapshot and the pod are unchanged
        (``pod`` is the cached object exactly when :meth:`_known_pod` found the request's pod
        equal to it; a pod re-sent with other requests or labels gets a fresh cycle)."""
        cached = self._cycles.get(pod.uid)
        if (
            cached is not None
            and cached.generation == self.snapshot.generation
            and cached.pod is pod
        ):
            self._cycles.move_to_end(pod.uid)
            return cached
        cached = _Cached(self.snapshot.generation, pod, self.framework.new_cycle(self.snapshot))
        self._cycles[pod.uid] = cached
        while len(self._cycles) > CYCLE_CACHE_SIZE:
            self._cycles.popitem(last=False)
        return cached

    # -- verbs ----------------------------------------------------------------------------

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderFilterResult`` for ``ExtenderArgs`` (a bad request: its ``Error``)."""
        args: ExtenderArgs | None = None
        try:
            args = parse_extender_args(body)
            pod, names = self._pod_and_nodes(args)
        except InputError as err:
            logger.warning("filter: %s", err)
            return filter_result(args, [], {}, {}, str(err))
        waiting = self.not_ready()
        if waiting:
            return filter_result(args, [], {}, {}, waiting)
        cached = self._cycle(pod)
        nodes, missing = self.framework.resolve(self.snapshot, names)
        if not missing:  # the request's names are the nodes' names: no need to read them
            cached.cycle.know_names(nodes, names)
        feasible, failures = self.framework.filter_nodes(cached.cycle, pod, nodes)
        failed = {
            name: f[0][1] if len(f) == 1 else "; ".join(r for _, r in f)
            for name, f in failures.items()
        }
        # a node the snapshot does not know: preempting there cannot help
        unresolvable = dict.fromkeys(missing, ERR_NODE_NOT_FOUND)
        passing = list(cached.cycle.names_only(feasible))
        cached.passing = passing
        cached.passing_nodes = feasible
        return filter_result(args, passing, failed, unresolvable)

    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        """``HostPriorityList`` for ``ExtenderArgs`` (0..10). Raises :class:`InputError` for a
        bad request, :class:`NotReady` before the informers are synced."""
        args = parse_extender_args(body)
        pod, names = self._pod_and_nodes(args)
        waiting = self.not_ready()
        if waiting:
            raise NotReady(waiting)
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
        # the framework's 0..100 on the extender's 0..10 (MaxExtenderPriority)
        return host_priority_list(names, totals, MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)

    def _find(self, args: BindingArgs) -> _Cached | None:
        """The cycle the pod's filter ran in; else, for a pending pod the informers know (its
        filter ran in another replica, or before a restart), a fresh one."""
        cached = self._cycles.get(args.pod_uid)
        if cached is None:
            cached = next((c for c in self._cycles.values() if c.pod.key == args.key), None)
        if cached is not None:
            return cached
        pod = self.snapshot.pending_pods.get(args.pod_uid)
        if pod is None:
            return None
        return _Cached(self.snapshot.generation, pod, self.framework.new_cycle(self.snapshot))

    async def bind(self, body: Any) -> dict[str, Any]:
        """``ExtenderBindingResult`` for ``ExtenderBindingArgs``."""
        try:
            args = parse_binding_args(body)
        except InputError as err:
            logger.warning("bind: %s", err)
            return binding_result(str(err))
        waiting = self.not_ready()
        if waiting:
            return binding_result(waiting)
        node = args.node
        cached = self._find(args)
        if cached is None:
            return binding_result(f"pod {args.key} was not filtered here")
        if node not in self.snapshot.nodes:
            return binding_result(f"node {node!r} is not in the snapshot")
        cycle = cached.cycle
        if cached.generation != self.snapshot.generation:
            # the cluster changed since the filter: check the node again before reserving
            cycle = self.framework.new_cycle(self.snapshot)
            verdict = self.framework.filter(cycle, cached.pod, [self.snapshot.nodes[node]])
            if not verdict[node].feasible:
                reasons = "; ".join(verdict[node].reasons)
                return binding_result(f"pod {args.key} no longer fits {node}: {reasons}")
        try:
            annotations = self.framework.reserve(cycle, cached.pod, node)
        except ReserveError as err:
            return binding_result(str(err))
        if self.binder is not None:
            try:
                await self.binder.bind(cached.pod, node, annotations)
            except (KubeError, OSError) as err:  # the API said no: undo the reservation
                self.framework.unreserve(cycle, cached.pod, node)
                return binding_result(f"bind {cached.pod.key} to {node}: {err}")
        self._cycles.pop(cached.pod.uid, None)
        logger.info("bound %s to %s %s", cached.pod.key, node, annotations or "")
        return binding_result()

    def preempt(self, body: Any) -> dict[str, Any]:
        """``ExtenderPreemptionResult`` for ``ExtenderPreemptionArgs``: of the candidate nodes,
        those where the pod passes every filter once its victims are gone, with the same
        victims. Raises :class:`InputError` for a bad request, :class:`NotReady`."""
        args = parse_preemption_args(body)
        pod = parse_pod(args.pod, PREEMPTION_ARGS, "Pod")
        waiting = self.not_ready()
        if waiting:
            raise NotReady(waiting)
        out: dict[str, Victims] = {}
        for name, victims in args.victims.items():
            node = self.snapshot.nodes.get(name)
            if node is None:
                continue
            removed = [p for p in (node.remove_pod(u) for u in victims.uids) if p is not None]
            self.snapshot.touch(name)  # plugins re-index the node without its victims
            try:
                cycle = self.framework.new_cycle(self.snapshot)
                verdict = self.framework.filter(cycle, pod, [node])
            finally:
                for p in removed:
                    node.add_pod(p)
                self.snapshot.touch(name)
            if verdict[name].feasible:
                out[name] = victims
        return preemption_result(out)


EXTENDER_KEY = web.AppKey("extender", Extender)


async def _json(request: web.Request) -> Any:
    """The decoded body; a body that is not JSON is a 400 with an ``Error``."""
    try:
        return json.loads(await request.read())
    except ValueError as err:
        raise web.HTTPBadRequest(
            text=json.dumps(error_body(f"body is not JSON: {err}")),
            content_type="application/json",
        ) from err


def _dump(obj: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )


async def _filter(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    await ext.refresh()
    return _dump(ext.filter(await _json(request)))


async def _prioritize(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    await ext.refresh()
    body = await _json(request)
    try:
        return _dump(ext.prioritize(body))
    except InputError as err:
        logger.warning("prioritize: %s", err)
        return _dump(error_body(str(err)), 400)
    except NotReady as err:
        return _dump(error_body(str(err)), 503)


async def _bind(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    return _dump(await ext.bind(await _json(request)))


async def _preempt(request: web.Request) -> web.Response:
    ext = request.app[EXTENDER_KEY]
    await ext.refresh()
    body = await _json(request)
    try:
        return _dump(ext.preempt(body))
    except InputError as err:
        logger.warning("preempt: %s", err)
        return _dump(error_body(str(err)), 400)
    except NotReady as err:
        return _dump(error_body(str(err)), 503)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    waiting = request.app[EXTENDER_KEY].not_ready()
    if waiting:
        return web.Response(status=503, text=waiting)
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
    app.router.add_get("/readyz", _readyz)
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
    """Serve until SIGTERM or SIGINT; 0 on a clean stop, 1 when the informers did not all
    list within ``sync_timeout`` seconds. ``snapshot_path`` None: the snapshot comes from
    informers through ``kubeconfig``; the server answers at once, every verb with a "not
    ready" error (``/readyz`` 503 naming the kinds) until they have."""
    client = None
    try:
        if bind or snapshot_path is None:
            from kubeclient.client import KubeClient

            client = await KubeClient.connect(kubeconfig)
        source: SnapshotFile | None = None
        informed: InformedSnapshot | None = None
        if snapshot_path is not None:
            source = SnapshotFile(snapshot_path)
            snapshot = await asyncio.to_thread(source.load)
        else:
            from scheduler_plugins.informed import InformedSnapshot

            assert client is not None
            informed = InformedSnapshot(client)
            snapshot = informed.snapshot
        binder: Binder | None = KubeBinder(client) if bind else None
        extender = Extender(
            cfg.framework(EXTENDER_PLUGINS),
            snapshot,
            source=source,
            binder=binder,
            tune_gc=True,
            gate=informed.not_ready if informed is not None else None,
        )
        runner = web.AppRunner(make_app(extender), access_log=None)
        await runner.setup()
        try:
            with StopSignals() as signals:  # SIGTERM or SIGINT; a second one exits at once
                await web.TCPSite(runner, host, port).start()
                logger.info("extender serving on %s:%d", host, port)
                if informed is None:
                    await signals.stop.wait()
                    return 0
                sync = OwnerSync(client, informed.snapshot) if bind else None
                return await _serve_informed(informed, extender, signals.stop, sync_timeout, sync)
        finally:
            await runner.cleanup()
    finally:
        if client is not None:
            await client.close()


async def _serve_informed(
    informed: InformedSnapshot,
    extender: Extender,
    stop: asyncio.Event,
    sync_timeout: float,
    owner_sync: OwnerSync | None,
) -> int:
    """Run the informers under ``extender`` (and the Reservations' owner sync, with
    ``--bind``) until ``stop``; 1 when they do not all list in time."""
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(informed.run(), name="scheduler-informers")]
        if owner_sync is not None:
            informed.watch_owners(owner_sync)
            tasks.append(
                group.create_task(
                    owner_sync.run(informed.not_ready), name="scheduler-reservation-owners"
                )
            )
        try:
            if not await informed.wait_synced(sync_timeout):
                logger.error(
                    "informers not synced within %.0fs, giving up: waiting for %s",
                    sync_timeout,
                    ", ".join(informed.not_ready()),
                )
                return 1
            extender.warm()  # index and freeze what the lists brought
            logger.info("informers synced: %d nodes", len(informed.snapshot.nodes))
            await stop.wait()
            return 0
        finally:
            for task in tasks:
                task.cancel()

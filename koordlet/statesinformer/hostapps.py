"""The local NodeSLO file (standalone mode): the NodeSLO in force and its host applications.

:class:`NodeSLOFileSource` is a :class:`~koordlet.statesinformer.sources.HostAppSource` and holds
the :class:`~apis.slo_inforce.NodeSLOInForce` the strategies read. It reads the file once at start
(:meth:`~NodeSLOFileSource.load`, where any bad value is a configuration error) and afterwards
whenever the file's modification time, size or inode changes, or a reload is requested (SIGHUP).
On a reload each section is taken or rejected on its own (``apis.slo_inforce``): a rejected
section keeps its last good value while the good ones apply; a file that cannot be read, or is not
a NodeSLO, keeps everything. Either is logged once per change with the file and field and
reported to ``on_error``.

A changed file is read only once it has *settled*: its modification time lies at least
``settle_seconds`` (0.5 s) in the past. Editors and ``echo >`` truncate before they write, so a
file read the moment it changed can be empty or half written, and an empty file is a valid (empty)
spec: without the settle time a reload could replace every host application with nothing. A
requested reload waits for the settle time too, and is kept until it happens.

Each declared application's cgroup directory is resolved as Koordinator resolves it
(``GetHostAppCgroupRelativePath`` in ``pkg/koordlet/util``): ``cgroupPath.base`` picks a point of
the hierarchy, whose directory depends on the cgroup driver, and ``parentDir`` and
``relativePath`` are joined below it::

    base                 cgroupfs                systemd
    CgroupRoot (empty)   ""                      ""
    Kubepods             kubepods                kubepods.slice
    KubepodsBurstable    kubepods/burstable      kubepods.slice/kubepods-burstable.slice
    KubepodsBesteffort   kubepods/besteffort     kubepods.slice/kubepods-besteffort.slice

Without ``cgroupPath`` the default sits under the root: ``host-latency-sensitive/<name>`` for
LSE, LSR and LS, ``host-best-effort/<name>`` for BE and ``<name>`` otherwise (``apis.slo`` fills
that default in while parsing). An application whose cgroup exists in none of the walked
controllers is reported with ``present=False``: declared, not an error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from apis.errors import FieldError
from apis.extension import KubeQOS
from apis.slo import CgroupBaseType, HostApplication, SchemaError
from apis.slo_inforce import NodeSLOInForce, read_node_slo_file
from koordlet.config import load_node_slo
from koordlet.errors import ConfigError
from koordlet.statesinformer.kubepods import V1_WALK_CONTROLLERS
from koordlet.statesinformer.model import HostAppInfo
from koordlet.system.cgroups import CgroupLayout, CgroupVersion
from koordlet.system.host import Host

logger = logging.getLogger(__name__)

_BASE_QOS: dict[CgroupBaseType, KubeQOS] = {
    CgroupBaseType.KUBEPODS: KubeQOS.GUARANTEED,
    CgroupBaseType.KUBEPODS_BURSTABLE: KubeQOS.BURSTABLE,
    CgroupBaseType.KUBEPODS_BESTEFFORT: KubeQOS.BESTEFFORT,
}
"""Base types below the kubepods root, as the QoS level whose folder they name (Guaranteed pods
live in the kubepods root itself)."""

_Signature = tuple[int, int, int]
"""``(st_mtime_ns, st_size, st_ino)``: what says a file changed."""


def host_app_cgroup_dir(app: HostApplication, layout: CgroupLayout) -> str:
    """The application's cgroup, relative to a controller root (v1) or the unified root (v2)."""
    qos = _BASE_QOS.get(app.cgroup_path.base)
    base_dir = "" if qos is None else layout.qos_dir(qos)
    return app.cgroup_path.under(base_dir)


def host_app_info(app: HostApplication, layout: CgroupLayout) -> HostAppInfo:
    """A declared application as the inventory lists it: its cgroup and whether it exists."""
    rel = host_app_cgroup_dir(app, layout)
    return HostAppInfo(
        name=app.name,
        qos=app.qos,
        cgroup_dir=rel,
        priority_class=app.priority.value,
        present=cgroup_present(layout, rel),
    )


def cgroup_present(layout: CgroupLayout, rel: str) -> bool:
    """Whether cgroup ``rel`` exists in any controller the inventory walks."""
    if layout.version is CgroupVersion.V2:
        return os.path.isdir(layout.abs_dir("cpu", rel))
    return any(os.path.isdir(layout.abs_dir(c, rel)) for c in V1_WALK_CONTROLLERS)


class NodeSLOFileSource:
    """The local NodeSLO file: the NodeSLO in force in standalone mode and its host
    applications; see the module docstring.

    :param path: the NodeSLO file (YAML, or JSON when it ends in ``.json``).
    :param host: paths and cgroup layout the cgroup directories resolve through. The daemon
        replaces it when the cgroup driver is detected late.
    :param on_error: called with each reload error (the daemon counts them): a file that cannot
        be read or is not a NodeSLO, or the first newly rejected section of a reload.
    :param settle_seconds: how long a changed file must stay unwritten before it is read.
    :param clock: wall-clock seconds, compared with the file's modification time.
    """

    def __init__(
        self,
        path: str,
        host: Host,
        *,
        on_error: Callable[[ConfigError], None] | None = None,
        name: str = "nodeslo-file",
        settle_seconds: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.path = path
        self.host = host
        self._on_error = on_error
        self._settle_ns = int(settle_seconds * 1e9)
        self._clock = clock
        self._in_force: NodeSLOInForce | None = None
        self._signature: _Signature | None = None
        self._failed: _Signature | None = None
        """Signature of the bad version already reported (a file that stays bad is logged
        once); ``(0, 0, 0)`` stands for an unreadable file."""
        self._reload_requested = threading.Event()

    @property
    def in_force(self) -> NodeSLOInForce:
        """The NodeSLO in force: each section's last good value (the defaults before the first
        load)."""
        return self._in_force if self._in_force is not None else NodeSLOInForce()

    def load(self) -> NodeSLOInForce:
        """Read and parse the file now, every section, and put it in force.

        Raises :class:`~koordlet.errors.ConfigError` naming the file and the field of the first
        bad value; at start that is a configuration error.
        """
        signature = self._stat()
        in_force = load_node_slo(self.path)
        self._install(in_force, signature)
        return in_force

    def request_reload(self) -> None:
        """Re-read the file at the next :meth:`list_host_apps` even if it looks unchanged."""
        self._reload_requested.set()

    def list_host_apps(self) -> tuple[HostAppInfo, ...]:
        """The declared applications with their cgroups, re-reading the file when it changed.

        Raises ConfigError only when no version of the file was ever good.
        """
        if self._in_force is None:
            self.load()
        else:
            self._maybe_reload()
        layout = self.host.layout
        return tuple(host_app_info(app, layout) for app in self.in_force.host_applications)

    # Internals ---------------------------------------------------------------------------------

    def _stat(self) -> _Signature | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _install(self, in_force: NodeSLOInForce, signature: _Signature | None) -> None:
        self._in_force = in_force
        self._signature = signature
        self._failed = None

    def _settled(self, signature: _Signature) -> bool:
        """Whether the file was last written at least the settle time ago (a modification
        time in the future, from a skewed clock, counts as settled rather than never)."""
        age_ns = int(self._clock() * 1e9) - signature[0]
        return not 0 <= age_ns < self._settle_ns

    def _maybe_reload(self) -> None:
        forced = self._reload_requested.is_set()
        signature = self._stat()
        if not forced and signature == self._signature:
            return
        if signature is not None and not self._settled(signature):
            return  # still being written, perhaps: read it at a later call
        self._reload_requested.clear()
        bad = signature if signature is not None else (0, 0, 0)
        if not forced and bad == self._failed:
            return  # the same bad version, already reported
        before = self.in_force
        try:
            in_force = read_node_slo_file(self.path, now=self._clock(), previous=before)
        except SchemaError as err:
            self._failed = bad
            # A bad file is the operator's, not a bug: the message names file and field, no trace.
            logger.error(  # noqa: TRY400
                "NodeSLO file reload failed; keeping the last good version (%d host "
                "applications): %s",
                len(before.host_applications),
                err,
            )
            self._report(err)
            return
        self._install(in_force, signature)
        rejected = in_force.newly_rejected(before)
        if rejected:
            logger.error(
                "NodeSLO file %s reloaded; rejected sections keep their last good value: %s",
                self.path,
                "; ".join(str(r.error) for r in rejected.values()),
            )
            self._report(next(iter(rejected.values())).error)
        elif in_force.generation != before.generation:
            logger.info(
                "NodeSLO file %s reloaded: %d host applications%s",
                self.path,
                len(in_force.host_applications),
                f"; still rejected: {', '.join(in_force.rejected)}" if in_force.rejected else "",
            )

    def _report(self, err: FieldError) -> None:
        if self._on_error is not None:
            self._on_error(ConfigError(err.message, source=err.source, field=err.field))

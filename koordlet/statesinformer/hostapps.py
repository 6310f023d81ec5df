"""Host applications from a local NodeSLO file (standalone mode's ``spec.hostApplications``).

:class:`NodeSLOFileSource` is a :class:`~koordlet.statesinformer.sources.HostAppSource`. It reads
the file once at start (:meth:`~NodeSLOFileSource.load`, where a bad file is a configuration
error) and afterwards whenever the file's modification time, size or inode changes, or a reload is
requested (SIGHUP). A file that turns bad, or disappears, on a reload is logged once with the file
and field, reported to ``on_error`` and otherwise ignored: the last good spec stays in force.

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

from apis.extension import KubeQOS
from apis.slo import CgroupBaseType, HostApplication, NodeSLOSpec
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


def cgroup_present(layout: CgroupLayout, rel: str) -> bool:
    """Whether cgroup ``rel`` exists in any controller the inventory walks."""
    if layout.version is CgroupVersion.V2:
        return os.path.isdir(layout.abs_dir("cpu", rel))
    return any(os.path.isdir(layout.abs_dir(c, rel)) for c in V1_WALK_CONTROLLERS)


class NodeSLOFileSource:
    """Host applications declared in a local NodeSLO file; see the module docstring.

    :param path: the NodeSLO file (YAML, or JSON when it ends in ``.json``).
    :param host: paths and cgroup layout the cgroup directories resolve through. The daemon
        replaces it when the cgroup driver is detected late.
    :param on_error: called with each reload error (the daemon counts them).
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
        self._spec: NodeSLOSpec | None = None
        self._signature: _Signature | None = None
        self._failed: _Signature | None = None
        """Signature of the bad version already reported (a file that stays bad is logged
        once); ``(0, 0, 0)`` stands for an unreadable file."""
        self._reload_requested = threading.Event()

    @property
    def spec(self) -> NodeSLOSpec:
        """The last good spec (empty before the first load)."""
        return self._spec if self._spec is not None else NodeSLOSpec()

    def load(self) -> NodeSLOSpec:
        """Read and parse the file now and keep it as the last good spec.

        Raises :class:`~koordlet.errors.ConfigError` naming the file and field; at start that
        is a configuration error.
        """
        signature = self._stat()
        spec = load_node_slo(self.path)
        self._install(spec, signature)
        return spec

    def request_reload(self) -> None:
        """Re-read the file at the next :meth:`list_host_apps` even if it looks unchanged."""
        self._reload_requested.set()

    def list_host_apps(self) -> tuple[HostAppInfo, ...]:
        """The declared applications with their cgroups, re-reading the file when it changed.

        Raises ConfigError only when no version of the file was ever good.
        """
        if self._spec is None:
            self.load()
        else:
            self._maybe_reload()
        layout = self.host.layout
        apps = []
        for app in self.spec.host_applications:
            rel = host_app_cgroup_dir(app, layout)
            apps.append(
                HostAppInfo(
                    name=app.name,
                    qos=app.qos,
                    cgroup_dir=rel,
                    priority_class=app.priority.value,
                    present=cgroup_present(layout, rel),
                )
            )
        return tuple(apps)

    # Internals ---------------------------------------------------------------------------------

    def _stat(self) -> _Signature | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _install(self, spec: NodeSLOSpec, signature: _Signature | None) -> None:
        self._spec = spec
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
        try:
            spec = load_node_slo(self.path)
        except ConfigError as err:
            self._failed = bad
            # A bad file is the operator's, not a bug: the message names file and field, no trace.
            logger.error(  # noqa: TRY400
                "NodeSLO file reload failed; keeping the last good version (%d host "
                "applications): %s",
                len(self.spec.host_applications),
                err,
            )
            if self._on_error is not None:
                self._on_error(err)
            return
        if spec != self._spec:
            logger.info(
                "NodeSLO file %s reloaded: %d host applications",
                self.path,
                len(spec.host_applications),
            )
        self._install(spec, signature)

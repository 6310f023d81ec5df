"""The cgroup layout of this node: version, driver, and how pods and containers are named.

Everything here is synchronous and pure except the two detectors, which look at the host once
at start-up.

**Version** (:func:`detect_version`), decided in this order:

1. ``statfs(2)`` on ``cgroup_root`` reports ``CGROUP2_SUPER_MAGIC``: cgroup v2. Only the kernel's
   cgroup2 file system has that magic and nobody can create regular files in it, so no fake tree
   can produce it; it holds for the mount point and for any directory inside a unified hierarchy.
2. ``cgroup_root`` is a mount point of type ``tmpfs`` holding at least one v1 controller folder
   (``cpu``, ``cpuacct``, ``memory``): cgroup v1 (legacy or hybrid; a hybrid host's
   ``unified`` folder is ignored, as Koordinator ignores it).
3. Otherwise the root is not a real cgroup mount (a fake tree in tests sits on ext4, overlay or a
   tmpfs ``/tmp`` without being its mount point), so the content decides: a ``cgroup.controllers``
   file at the root means v2, a ``cpu``/``cpuacct``/``memory`` folder means v1.
4. Nothing matched: :class:`~koordlet.errors.UnsupportedError` with the reason.

**Driver** (:func:`detect_driver`), as Koordinator guesses it from the cgroup names: a
``kubepods.slice`` folder (under the ``cpu`` controller on v1, under the root on v2) means
systemd, a ``kubepods`` folder means cgroupfs. When both exist the one holding pod or QoS folders
wins; when that does not decide, or neither exists yet, the kubelet's own default (cgroupfs) is
assumed and logged. Callers that know better pass ``driver=`` explicitly.

**Names** (kubelet's conventions, both drivers)::

    cgroupfs  kubepods/burstable/pod<uid>/<id>                      (cri-o: crio-<id>)
    systemd   kubepods.slice/kubepods-burstable.slice/
                kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
                                        (cri-o: crio-<id>.scope, docker: docker-<id>.scope)

Guaranteed pods sit directly under the kubepods root (``kubepods-pod<uid_>.slice`` on systemd).
Relative directories are relative to a controller's root on v1 and to the unified root on v2.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from enum import StrEnum

from apis.extension import KubeQOS
from apis.records import frozen
from koordlet.errors import ConfigError, HostError, InvalidValueError, UnsupportedError
from koordlet.system import libc
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

CGROUP2_SUPER_MAGIC = 0x63677270
"""``f_type`` of a cgroup2 file system (``include/uapi/linux/magic.h``)."""
TMPFS_MAGIC = 0x01021994
"""``f_type`` of tmpfs, the conventional mount at a v1 (or hybrid) cgroup root."""

V1_CONTROLLERS = frozenset(
    {"cpu", "cpuacct", "cpuset", "memory", "blkio", "pids", "freezer", "perf_event", "net_cls"}
)
"""Controllers a layout can address; on v1 each is a folder under the cgroup root."""
_V1_MARKERS = ("cpu", "cpuacct", "memory")
"""v1 controller folders whose presence marks a v1 root."""

KUBEPODS = "kubepods"
"""Leaf name of the kubepods root for the cgroupfs driver."""
KUBEPODS_SLICE = "kubepods.slice"
"""Leaf name of the kubepods root for the systemd driver."""

RUNTIME_CONTAINERD = "containerd"
RUNTIME_CRIO = "cri-o"
RUNTIME_DOCKER = "docker"
RUNTIME_UNKNOWN = "unknown"
"""A bare 64-hex folder on cgroupfs: containerd or docker, the name cannot tell which."""


class CgroupVersion(StrEnum):
    V1 = "v1"
    V2 = "v2"


class CgroupDriver(StrEnum):
    SYSTEMD = "systemd"
    CGROUPFS = "cgroupfs"


_QOS_TOKEN: dict[KubeQOS, str] = {
    KubeQOS.BURSTABLE: "burstable",
    KubeQOS.BESTEFFORT: "besteffort",
}
_QOS_OF_DIR: dict[str, KubeQOS] = {
    **{token: qos for qos, token in _QOS_TOKEN.items()},
    **{f"kubepods-{token}.slice": qos for qos, token in _QOS_TOKEN.items()},
}
_SYSTEMD_POD_PREFIXES = (*(f"kubepods-{t}-pod" for t in _QOS_TOKEN.values()), "kubepods-pod")
_SCOPE_PREFIXES = (
    ("cri-containerd-", RUNTIME_CONTAINERD),
    ("crio-", RUNTIME_CRIO),
    ("docker-", RUNTIME_DOCKER),
)
_SYSTEMD_SCOPE_PREFIX = {rt: prefix for prefix, rt in _SCOPE_PREFIXES}
_CRIO_CONMON_PREFIX = "crio-conmon-"

_UID_RE = re.compile(r"[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*")
"""A pod UID: a UUID, or the 32-hex hash the kubelet gives static pods."""
_SCOPE_ID_RE = re.compile(r"[0-9a-zA-Z]+")
_BARE_ID_RE = re.compile(r"[0-9a-f]{64}")
_SAFE_ID_RE = re.compile(r"[0-9a-zA-Z][0-9a-zA-Z_.-]*")


# Version ---------------------------------------------------------------------------------------


class _Statfs(ctypes.Structure):
    # Only f_type is read. It is the first member of struct statfs on every Linux ABI; its width
    # is __fsword_t: a long, except on s390 where it is an unsigned int. The padding covers the
    # rest of the struct (120 bytes on 64-bit ABIs) with room to spare.
    _fields_ = [
        ("f_type", ctypes.c_uint if libc.machine().startswith("s390") else ctypes.c_long),
        ("_rest", ctypes.c_byte * 256),
    ]


def _libc() -> ctypes.CDLL | None:
    return libc.libc()


def fs_magic(path: str) -> int | None:
    """The file system magic (``statfs(2)`` ``f_type``) of ``path``; None without a libc.

    Raises ``FileNotFoundError`` (a subclass of ``OSError``) when the path does not exist and
    ``OSError`` for other failures.
    """
    lib = _libc()
    if lib is None:
        return None
    buf = _Statfs()
    if lib.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(buf.f_type) & 0xFFFFFFFF


def fd_fs_magic(fd: int) -> int | None:
    """The file system magic (``fstatfs(2)`` ``f_type``) of an open file; None without a
    libc. Raises ``OSError``."""
    lib = _libc()
    if lib is None:
        return None
    buf = _Statfs()
    if lib.fstatfs(fd, ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(buf.f_type) & 0xFFFFFFFF


def _has_v1_controllers(root: str) -> bool:
    return any(os.path.isdir(os.path.join(root, c)) for c in _V1_MARKERS)


def detect_version(paths: HostPaths) -> CgroupVersion:
    """The cgroup version of ``paths.cgroup_root``; the rule is in the module docstring."""
    root = paths.cgroup_root
    try:
        magic = fs_magic(root)
    except FileNotFoundError as err:
        raise UnsupportedError("cgroup", f"cgroup root {root} does not exist") from err
    except OSError as err:
        raise HostError(f"statfs {root}: {err.strerror}") from err
    if magic == CGROUP2_SUPER_MAGIC:
        return CgroupVersion.V2
    if magic == TMPFS_MAGIC and os.path.ismount(root) and _has_v1_controllers(root):
        return CgroupVersion.V1
    if os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return CgroupVersion.V2
    if _has_v1_controllers(root):
        return CgroupVersion.V1
    kind = "unknown" if magic is None else f"0x{magic:08x}"
    raise UnsupportedError(
        "cgroup",
        f"{root} (file system magic {kind}) is neither a cgroup2 mount nor holds "
        "cgroup.controllers or a cpu/cpuacct/memory controller folder",
    )


# Driver ----------------------------------------------------------------------------------------


def kube_root_for(kube_path: str, driver: CgroupDriver) -> str:
    """The kubepods root for Koordinator's ``--cgroup-kube-path`` under ``driver``.

    ``"kubepods/"`` (the default) gives ``kubepods`` or ``kubepods.slice``; a prefix is kept
    (``"kpytest-ab12/kubepods/"`` → ``kpytest-ab12/kubepods.slice`` for systemd). The leaf must
    be ``kubepods`` or ``kubepods.slice``: the kubelet names nothing else, and the QoS and pod
    names below it are fixed.
    """
    parts = [p for p in kube_path.strip().split("/") if p]
    if not parts:
        raise ConfigError("must name the kubepods folder", field="cgroup-kube-path")
    if any(p in (".", "..") for p in parts):
        raise ConfigError(f"{kube_path!r} must not contain . or ..", field="cgroup-kube-path")
    if parts[-1] not in (KUBEPODS, KUBEPODS_SLICE):
        raise ConfigError(
            f"{kube_path!r} must end in {KUBEPODS}/ or {KUBEPODS_SLICE}/",
            field="cgroup-kube-path",
        )
    parts[-1] = KUBEPODS_SLICE if driver is CgroupDriver.SYSTEMD else KUBEPODS
    return "/".join(parts)


def _kube_children(path: str) -> int:
    """How many children of ``path`` are QoS or pod folders; 0 when it cannot be listed."""
    try:
        with os.scandir(path) as it:
            return sum(
                1
                for e in it
                if e.is_dir(follow_symlinks=False)
                and (e.name in _QOS_OF_DIR or parse_pod_dir_name(e.name) is not None)
            )
    except OSError:
        return 0


def detect_driver(
    paths: HostPaths, version: CgroupVersion, kube_dir_name_hint: str = "kubepods/"
) -> CgroupDriver:
    """Guess the kubelet's cgroup driver from the kubepods folder names (module docstring).

    ``kube_dir_name_hint`` is ``--cgroup-kube-path``; its prefix, if any, is honoured.
    """
    base = paths.cgroup_root if version is CgroupVersion.V2 else paths.cgroup("cpu")
    systemd_dir = os.path.join(base, kube_root_for(kube_dir_name_hint, CgroupDriver.SYSTEMD))
    cgroupfs_dir = os.path.join(base, kube_root_for(kube_dir_name_hint, CgroupDriver.CGROUPFS))
    has_systemd, has_cgroupfs = os.path.isdir(systemd_dir), os.path.isdir(cgroupfs_dir)
    if has_systemd and not has_cgroupfs:
        return CgroupDriver.SYSTEMD
    if has_cgroupfs and not has_systemd:
        return CgroupDriver.CGROUPFS
    if has_systemd and has_cgroupfs:
        in_systemd, in_cgroupfs = _kube_children(systemd_dir), _kube_children(cgroupfs_dir)
        if in_systemd != in_cgroupfs:
            driver = CgroupDriver.SYSTEMD if in_systemd > in_cgroupfs else CgroupDriver.CGROUPFS
            logger.warning(
                "both %s and %s exist; using %s, whose folder holds more pods",
                systemd_dir,
                cgroupfs_dir,
                driver,
            )
            return driver
        logger.warning(
            "both %s and %s exist and neither holds more pods; assuming the kubelet default %s "
            "(set the cgroup driver explicitly to override)",
            systemd_dir,
            cgroupfs_dir,
            CgroupDriver.CGROUPFS,
        )
        return CgroupDriver.CGROUPFS
    logger.info(
        "neither %s nor %s exists yet; assuming the kubelet default cgroup driver %s "
        "(set the cgroup driver explicitly to override)",
        systemd_dir,
        cgroupfs_dir,
        CgroupDriver.CGROUPFS,
    )
    return CgroupDriver.CGROUPFS


# Names -----------------------------------------------------------------------------------------


def _check_uid(uid: str) -> None:
    if not _UID_RE.fullmatch(uid):
        raise InvalidValueError(f"pod uid {uid!r} is not a UUID or hex hash")


def parse_pod_dir_name(name: str) -> str | None:
    """The pod UID (with dashes) named by a pod folder, either driver; None for anything else."""
    if name.endswith(".slice"):
        stem = name[: -len(".slice")]
        for prefix in _SYSTEMD_POD_PREFIXES:
            if stem.startswith(prefix):
                uid = stem[len(prefix) :].replace("_", "-")
                return uid if _UID_RE.fullmatch(uid) else None
        return None
    if name.startswith("pod"):
        uid = name[len("pod") :]
        return uid if _UID_RE.fullmatch(uid) else None
    return None


def parse_container_dir_name(name: str) -> tuple[str, str] | None:
    """``(runtime, container_id)`` named by a container folder; None for anything else.

    cri-o's ``crio-conmon-<id>.scope`` (the monitor process, not the container) is skipped. A
    bare 64-hex folder (cgroupfs, containerd or docker) gives runtime ``"unknown"``.
    """
    if name.startswith(_CRIO_CONMON_PREFIX):
        return None
    if name.endswith(".scope"):
        stem = name[: -len(".scope")]
        for prefix, runtime in _SCOPE_PREFIXES:
            if stem.startswith(prefix):
                cid = stem[len(prefix) :]
                return (runtime, cid) if _SCOPE_ID_RE.fullmatch(cid) else None
        return None
    if name.startswith("crio-"):
        cid = name[len("crio-") :]
        return (RUNTIME_CRIO, cid) if _SCOPE_ID_RE.fullmatch(cid) else None
    if _BARE_ID_RE.fullmatch(name):
        return (RUNTIME_UNKNOWN, name)
    return None


def kube_qos_of_dir(name: str) -> KubeQOS | None:
    """The Kubernetes QoS class of a QoS-level folder name (``burstable``,
    ``kubepods-besteffort.slice``…); None otherwise. Guaranteed has no folder of its own."""
    return _QOS_OF_DIR.get(name)


# Layout ----------------------------------------------------------------------------------------


@frozen
class CgroupLayout:
    """Where this node's cgroups are, and how the kubelet names them."""

    paths: HostPaths
    """Host roots; ``paths.cgroup_root`` is the cgroup mount root."""
    version: CgroupVersion
    """v1: one hierarchy per controller; v2: the unified hierarchy."""
    driver: CgroupDriver
    """The kubelet's cgroup driver (names of QoS, pod and container folders)."""
    kube_root: str
    """Relative folder of the kubepods root (``kubepods`` or ``kubepods.slice``, possibly under
    a prefix); from Koordinator's ``--cgroup-kube-path`` (default ``kubepods/``)."""

    def abs_dir(self, controller: str, rel: str) -> str:
        """Absolute folder of relative cgroup ``rel`` in ``controller`` (ignored on v2)."""
        if controller not in V1_CONTROLLERS:
            raise InvalidValueError(f"unknown cgroup controller {controller!r}")
        rel = rel.strip("/")
        if self.version is CgroupVersion.V2:
            return os.path.join(self.paths.cgroup_root, rel) if rel else self.paths.cgroup_root
        base = os.path.join(self.paths.cgroup_root, controller)
        return os.path.join(base, rel) if rel else base

    def file(self, controller: str, rel: str, filename: str) -> str:
        """Absolute path of ``filename`` in cgroup ``rel`` of ``controller``."""
        return os.path.join(self.abs_dir(controller, rel), filename)

    def qos_dir(self, kube_qos: KubeQOS) -> str:
        """Relative folder of a Kubernetes QoS level (Guaranteed: the kubepods root itself)."""
        token = _QOS_TOKEN.get(kube_qos)
        if token is None:
            return self.kube_root
        if self.driver is CgroupDriver.SYSTEMD:
            return f"{self.kube_root}/kubepods-{token}.slice"
        return f"{self.kube_root}/{token}"

    def pod_dir(self, kube_qos: KubeQOS, uid: str) -> str:
        """Relative folder of the pod with ``uid`` (with dashes) in QoS level ``kube_qos``."""
        _check_uid(uid)
        if self.driver is CgroupDriver.CGROUPFS:
            name = f"pod{uid}"
        else:
            token = _QOS_TOKEN.get(kube_qos)
            middle = f"{token}-" if token else ""
            name = f"kubepods-{middle}pod{uid.replace('-', '_')}.slice"
        return f"{self.qos_dir(kube_qos)}/{name}"

    def container_dir(self, pod_dir: str, runtime: str, container_id: str) -> str:
        """Relative folder of a container of runtime ``containerd``, ``cri-o`` or ``docker``.

        On cgroupfs the runtime ``unknown`` (a bare id) is accepted too, so that what
        :func:`parse_container_dir_name` returns always maps back.
        """
        if not _SAFE_ID_RE.fullmatch(container_id):
            raise InvalidValueError(f"container id {container_id!r} is not a runtime id")
        pod_dir = pod_dir.rstrip("/")
        if self.driver is CgroupDriver.SYSTEMD:
            prefix = _SYSTEMD_SCOPE_PREFIX.get(runtime)
            if prefix is None:
                raise UnsupportedError(
                    f"container runtime {runtime!r}",
                    "the systemd driver names only containerd, cri-o and docker scopes",
                )
            return f"{pod_dir}/{prefix}{container_id}.scope"
        if runtime == RUNTIME_CRIO:
            return f"{pod_dir}/crio-{container_id}"
        if runtime in (RUNTIME_CONTAINERD, RUNTIME_DOCKER, RUNTIME_UNKNOWN):
            return f"{pod_dir}/{container_id}"
        raise UnsupportedError(
            f"container runtime {runtime!r}",
            "the cgroupfs driver names only containerd, cri-o and docker folders",
        )


def detect_layout(
    paths: HostPaths,
    *,
    version: CgroupVersion | None = None,
    driver: CgroupDriver | None = None,
    kube_path: str = "kubepods/",
) -> CgroupLayout:
    """The node's layout; ``version`` and ``driver`` are detected when None.

    With both given, nothing on the host is read (fake trees and forced configuration).
    """
    if version is None:
        version = detect_version(paths)
    if driver is None:
        driver = detect_driver(paths, version, kube_path)
    layout = CgroupLayout(
        paths=paths, version=version, driver=driver, kube_root=kube_root_for(kube_path, driver)
    )
    logger.info(
        "cgroup layout: %s, driver %s, kubepods root %s under %s",
        version,
        driver,
        layout.kube_root,
        paths.cgroup_root,
    )
    return layout


__all__ = [
    "CGROUP2_SUPER_MAGIC",
    "KUBEPODS",
    "KUBEPODS_SLICE",
    "RUNTIME_CONTAINERD",
    "RUNTIME_CRIO",
    "RUNTIME_DOCKER",
    "RUNTIME_UNKNOWN",
    "TMPFS_MAGIC",
    "V1_CONTROLLERS",
    "CgroupDriver",
    "CgroupLayout",
    "CgroupVersion",
    "detect_driver",
    "detect_layout",
    "detect_version",
    "fd_fs_magic",
    "fs_magic",
    "kube_qos_of_dir",
    "kube_root_for",
    "parse_container_dir_name",
    "parse_pod_dir_name",
]

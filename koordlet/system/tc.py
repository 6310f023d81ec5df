"""Traffic control on this network namespace's interfaces through rtnetlink (pyroute2): read and
change an HTB tree, and the classifier that puts a socket in the class its cgroup's
``net_cls.classid`` names.

**The classifier.** Koordinator adds tc's ``cgroup`` classifier (``cls_cgroup``), which reads
the sending socket's ``net_cls.classid``. Kernels built without ``CONFIG_NET_CLS_CGROUP`` (this
project's CI kernel among them) have no such classifier, while ``cls_bpf`` with the helper
``bpf_get_cgroup_classid`` (Linux >= 4.3, ``CONFIG_CGROUP_NET_CLASSID``) makes the same
decision: the two-instruction program below returns the classid of the socket's cgroup, and
``cls_bpf`` (not in direct-action mode) takes a non-zero return as the class id, zero as "no
match" (``net/sched/cls_bpf.c``: ``cls_bpf_classify``), so unclassified traffic falls to the
qdisc's default class exactly as with ``cls_cgroup``. The program is loaded with ``bpf(2)``
(``BPF_PROG_LOAD``, type ``BPF_PROG_TYPE_SCHED_CLS``) and attached by its file descriptor.

**What is read back.** A class's rate and ceil in bytes per second (the kernel's unit;
``TCA_HTB_RATE64``/``CEIL64`` above 4 GiB/s), its parent and priority; the root qdisc's kind,
handle and default class; the filters at a parent with their kind and name. Sockets are opened
per call and closed; every function runs on the caller's thread (the executor's writer).
pyroute2 is imported on the first socket (:func:`rtnl`), not with this module: the start-up probe
imports this module on every node, and pyroute2 holds about 11 MiB resident.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from apis.records import frozen
from koordlet.errors import HostError, UnsupportedError
from koordlet.system import libc
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

TC_H_ROOT = 0xFFFFFFFF
"""The parent of a root qdisc or a root class."""
BPF_PROG_NAME = "koord_classid"
"""Name of the classifier program and of its filter: the koordlet's signature on a tree."""
_NR_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_SCHED_CLS = 3
_BPF_FUNC_GET_CGROUP_CLASSID = 17
_CALL, _EXIT = 0x85, 0x95  # BPF_JMP | BPF_CALL, BPF_JMP | BPF_EXIT
CLASSID_PROGRAM = struct.pack("<BBhi", _CALL, 0, 0, _BPF_FUNC_GET_CGROUP_CLASSID) + struct.pack(
    "<BBhi", _EXIT, 0, 0, 0
)
"""``r0 = bpf_get_cgroup_classid(skb); return r0`` (r1 already holds the skb)."""


class TCError(HostError):
    """A netlink request the kernel refused (the message names it and the errno)."""


@frozen
class Qdisc:
    """The root qdisc of an interface."""

    kind: str
    handle: int
    default: int | None = None
    """HTB's default class minor; None for other kinds."""


@frozen
class HTBClass:
    """An HTB class as the kernel holds it (rates in bytes per second)."""

    handle: int
    parent: int
    rate: int
    ceil: int
    prio: int


@frozen
class Filter:
    """A filter at a qdisc."""

    kind: str
    prio: int
    name: str


@frozen
class Link:
    """An interface of this network namespace."""

    index: int
    name: str


def _libc() -> ctypes.CDLL:
    return libc.libc()


def load_classid_program() -> int:
    """Load :data:`CLASSID_PROGRAM`; its file descriptor (the caller closes it).

    Raises :class:`~koordlet.errors.UnsupportedError` with the kernel's answer when it refuses
    (no ``CONFIG_BPF_SYSCALL``, ``EPERM`` without ``CAP_BPF``, an unknown helper)."""
    nr = _NR_BPF.get(os.uname().machine)
    if nr is None:
        raise UnsupportedError("tc classifier", f"bpf(2) number unknown on {os.uname().machine}")
    insns = ctypes.create_string_buffer(CLASSID_PROGRAM, len(CLASSID_PROGRAM))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = struct.pack(
        "<IIQQIIQII16s",
        _BPF_PROG_TYPE_SCHED_CLS,
        len(CLASSID_PROGRAM) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1,
        len(log),
        ctypes.addressof(log),
        0,
        0,
        BPF_PROG_NAME.encode(),
    )
    buf = ctypes.create_string_buffer(attr, 128)
    lib = _libc()
    fd = int(lib.syscall(nr, _BPF_PROG_LOAD, buf, len(buf)))
    if fd < 0:
        code = ctypes.get_errno()
        verifier = log.value.decode(errors="replace").strip()
        reason = f"bpf(BPF_PROG_LOAD) failed: {errno.errorcode.get(code, code)}"
        if verifier:
            reason += f" ({verifier.splitlines()[-1]})"
        raise UnsupportedError("tc classifier", reason + "; needs CONFIG_BPF_SYSCALL and CAP_BPF")
    return fd


def probe_classifier() -> tuple[bool, str]:
    """Whether the classid classifier loads here: ``(supported, reason)``."""
    try:
        fd = load_classid_program()
    except UnsupportedError as err:
        return False, err.reason
    os.close(fd)
    return True, "bpf_get_cgroup_classid program loads (cls_bpf classifies by net_cls.classid)"


def link_speed_bps(paths: HostPaths, name: str) -> int | None:
    """The link speed of interface ``name`` in bit/s from ``<sys>/class/net/<name>/speed``
    (Mbit/s); None when the file is absent, unreadable (a link that is down) or not positive."""
    try:
        with open(paths.sys("class", "net", name, "speed"), encoding="ascii") as f:
            mbps = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return mbps * 1_000_000 if mbps > 0 else None


def _netlink_error() -> Any:
    """pyroute2's ``NetlinkError`` (its errno in ``code``); the ``except`` clauses below call
    this only when an exception reaches them, after :func:`rtnl` has imported pyroute2."""
    from pyroute2.netlink.exceptions import NetlinkError

    return NetlinkError


@contextmanager
def rtnl() -> Iterator[Any]:
    """An rtnetlink socket of this network namespace, closed on exit."""
    from pyroute2 import IPRoute

    ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def _fail(what: str, err: Any) -> TCError:
    code = err.code
    return TCError(f"{what}: {errno.errorcode.get(code, code)} ({os.strerror(code)})")


def default_route_link(ipr: Any) -> Link | None:
    """The interface of this namespace's IPv4 default route (lowest metric), as upstream's
    ``GetLinkInfoByDefaultRoute``; None when there is none."""
    routes = [r for r in ipr.get_default_routes(family=socket.AF_INET) if r.get_attr("RTA_OIF")]
    if not routes:
        return None
    best = min(routes, key=lambda r: r.get_attr("RTA_PRIORITY") or 0)
    index = int(best.get_attr("RTA_OIF"))
    return Link(index, link_name(ipr, index))


def link_by_name(ipr: Any, name: str) -> Link | None:
    """The interface called ``name`` in this namespace; None when there is none."""
    found = ipr.link_lookup(ifname=name)
    return Link(int(found[0]), name) if found else None


def link_name(ipr: Any, index: int) -> str:
    """The name of interface ``index``."""
    links = ipr.get_links(index)
    return str(links[0].get_attr("IFLA_IFNAME")) if links else f"if{index}"


def root_qdisc(ipr: Any, index: int) -> Qdisc | None:
    """The root qdisc of interface ``index``; None when it has none listed."""
    for msg in ipr.get_qdiscs(index):
        if msg["parent"] != TC_H_ROOT:
            continue
        kind = str(msg.get_attr("TCA_KIND"))
        default = None
        if kind == "htb":
            opts = msg.get_attr("TCA_OPTIONS")
            init = opts.get_attr("TCA_HTB_INIT") if opts is not None else None
            default = int(init["defcls"]) if init is not None else None
        return Qdisc(kind, int(msg["handle"]), default)
    return None


def htb_classes(ipr: Any, index: int) -> dict[int, HTBClass]:
    """The HTB classes of interface ``index`` by handle."""
    out: dict[int, HTBClass] = {}
    for msg in ipr.get_classes(index):
        if msg.get_attr("TCA_KIND") != "htb":
            continue
        opts = msg.get_attr("TCA_OPTIONS")
        parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
        if parms is None:
            continue
        rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
        ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
        handle = int(msg["handle"])
        out[handle] = HTBClass(handle, int(msg["parent"]), int(rate), int(ceil), int(parms["prio"]))
    return out


def filters(ipr: Any, index: int, parent: int) -> list[Filter]:
    """The filters at qdisc ``parent`` of interface ``index`` (one entry per filter)."""
    out: list[Filter] = []
    for msg in ipr.get_filters(index, parent=parent):
        opts = msg.get_attr("TCA_OPTIONS")
        if opts is None:  # the chain's header message, without options
            continue
        name = opts.get_attr("TCA_BPF_NAME") or ""
        out.append(Filter(str(msg.get_attr("TCA_KIND")), int(msg["info"]) >> 16, str(name)))
    return out


def replace_root_htb(ipr: Any, index: int, handle: int, default_minor: int) -> None:
    """Make an HTB qdisc ``handle`` with default class ``default_minor`` the root."""
    try:
        ipr.tc("replace", "htb", index, handle, default=default_minor)
    except _netlink_error() as err:
        raise _fail(f"replace the root qdisc of if{index} with htb", err) from err


def delete_root(ipr: Any, index: int) -> None:
    """Delete the root qdisc of interface ``index`` (the kernel restores its default one)."""
    try:
        ipr.tc("del", index=index, parent=TC_H_ROOT)
    except _netlink_error() as err:
        if err.code in (errno.ENOENT, errno.EINVAL):
            return
        raise _fail(f"delete the root qdisc of if{index}", err) from err


def set_class(ipr: Any, index: int, cls: HTBClass, *, exists: bool) -> None:
    """Add or change HTB class ``cls`` (rates in bytes per second)."""
    command = "change-class" if exists else "add-class"
    try:
        ipr.tc(
            command, "htb", index, cls.handle, parent=cls.parent, rate=cls.rate, ceil=cls.ceil,
            prio=cls.prio,
        )  # fmt: skip
    except _netlink_error() as err:
        raise _fail(f"{command} {cls.handle:#x} on if{index}", err) from err


def delete_class(ipr: Any, index: int, handle: int) -> None:
    """Delete HTB class ``handle`` of interface ``index`` (gone already: nothing to do)."""
    try:
        ipr.tc("del-class", index=index, handle=handle)
    except _netlink_error() as err:
        if err.code == errno.ENOENT:
            return
        raise _fail(f"del-class {handle:#x} on if{index}", err) from err


def add_classid_filter(ipr: Any, index: int, parent: int, prio: int) -> None:
    """Attach the classid classifier at qdisc ``parent`` with priority ``prio``."""
    fd = load_classid_program()
    try:
        ipr.tc(
            "add-filter", "bpf", index, ":1", fd=fd, name=BPF_PROG_NAME, parent=parent, prio=prio,
            protocol=0x0003,  # ETH_P_ALL: every protocol, as the cgroup classifier
        )  # fmt: skip
    except _netlink_error() as err:
        raise _fail(f"add the classid filter on if{index}", err) from err
    finally:
        os.close(fd)

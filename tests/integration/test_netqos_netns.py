"""Real tc shaping, driven by the real koordlet from a NodeSLO file in standalone mode, inside a
network namespace of the test's own (never the host's interfaces).

The test makes two namespaces joined by a veth pair (``a``, the "node", routes by default over
its end to ``b``), a cgroup root of its own (symlinks to this machine's v1 hierarchies plus a
private mount of ``net_cls``) with a BestEffort and a Burstable pod, and starts the koordlet inside
``a`` (``nsenter --net``) with the gate ``TCNetworkQoS`` and a NodeSLO of 100 Mbit/s in total,
LS requesting 60 % (limit 100 %) and BE 10 % (limit 20 %). The koordlet must build the HTB tree on
``a``'s veth (root 100M; SYSTEM 30M, LS 60M, BE 10M/20M), classify by ``net_cls.classid`` (it
writes 1:4 and 1:3 into the pods' cgroups), and then a BE sender alone is held near 20 Mbit/s,
and with an LS sender beside it LS gets at least its 60 Mbit/s while BE stays held. Disabling the
classes in the NodeSLO removes the tree. Namespaces, mount, cgroups and processes are always
removed (``iotree.Undo``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.extension import KubeQOS
from apis.netqos import POD_CLASS_MINORS, NetQoSClass, class_id_of
from apis.terway import GlobalBpsConfig, net_cls_dir, parse_pod_config
from koordlet.executor import restore
from koordlet.executor.originals import Original
from koordlet.executor.tc import ClassPlan, TCWriter, TreePlan, TreeResult
from koordlet.executor.writer import WriteResult
from koordlet.system import tc
from koordlet.system.cgroups import detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from tests.daemon import free_port
from tests.daemon.test_daemon_process import REPO, Proc
from tests.integration.iotree import (
    PodTree,
    Undo,
    VethPair,
    cgroup_root_with_net_cls,
    go,
    in_netns,
    tools_missing,
    veth_namespaces,
)

PATHS = HostPaths()
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "net_cls")
TOTAL = 100_000_000
PORT = 5201
M = 1_000_000

RECEIVER = """
import json, socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(8)
counts, lock = {}, threading.Lock()
def serve(conn):
    tag = conn.recv(3).decode().strip()
    with lock:
        counts.setdefault(tag, 0)
    while True:
        data = conn.recv(1 << 16)
        if not data:
            return
        with lock:
            counts[tag] += len(data)
def accept():
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
print("listening", flush=True)
for _ in sys.stdin:
    with lock:
        print(json.dumps(counts), flush=True)
"""
SENDER = """
import socket, sys, time
sys.stdin.readline()
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
conn.sendall(sys.argv[3].encode())
block = b"x" * 65536
end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:
    conn.sendall(block)
conn.close()
"""


def _skip_reason() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces, mounts and cgroups"
    missing = tools_missing("ip", "nsenter", "mount", "umount")
    if missing:
        return missing
    if not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in CONTROLLERS[:-1]):
        return "needs the cgroup v1 cpu, cpuacct, cpuset and memory hierarchies"
    if "net_cls" not in Path("/proc/cgroups").read_text():
        return "the kernel has no net_cls controller (CONFIG_CGROUP_NET_CLASSID)"
    supported, why = tc.probe_classifier()
    return "" if supported else f"the classid classifier does not load: {why}"


pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.daemon,
    pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "-"),
]


class NetnsProc(Proc):
    """A koordlet inside network namespace ``ns``: its HTTP server is reached from a thread that
    joins that namespace."""

    ns: str = ""

    def get(self, path: str) -> tuple[int, str]:
        return in_netns(self.ns, lambda: Proc.get(self, path))


@contextlib.contextmanager
def koordlet_in(ns: str, args: list[str], tmp_path: Path) -> Iterator[NetnsProc]:
    port = free_port()
    log = tmp_path / f"koordlet-{port}.log"
    cmd = ["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-m", "koordlet"]
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [*cmd, "--addr", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc = NetnsProc(popen, f"http://127.0.0.1:{port}", log)
    proc.ns = ns
    try:
        proc.until("ready", lambda: proc.get("/readyz")[0] == 200)
        yield proc
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=10)


@pytest.fixture
def undo() -> Iterator[Undo]:
    steps = Undo()
    try:
        yield steps
    finally:
        failed = steps.run()
        assert not failed, f"cleanup failed: {failed}"


def _nodeslo(path: Path, enable: bool, policy: str = "tc") -> None:
    qos = {
        "policies": {"netQOSPolicy": policy},
        "lsClass": {"networkQOS": {"enable": enable, "egressRequest": 60, "egressLimit": 100}},
        "beClass": {"networkQOS": {"enable": enable, "egressRequest": 10, "egressLimit": 20}},
    }
    doc = {
        "spec": {"resourceQOSStrategy": qos, "systemStrategy": {"totalNetworkBandwidth": "100M"}}
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)


def _tree(pair: VethPair) -> tuple[tc.Qdisc | None, dict[int, tc.HTBClass]]:
    def read() -> tuple[tc.Qdisc | None, dict[int, tc.HTBClass]]:
        with tc.rtnl() as ipr:
            index = ipr.link_lookup(ifname=pair.a_if)[0]
            return tc.root_qdisc(ipr, index), tc.htb_classes(ipr, index)

    return in_netns(pair.a, read)


class Receiver:
    def __init__(self, pair: VethPair, undo: Undo) -> None:
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{pair.b}", sys.executable, "-c", RECEIVER, pair.b_ip,
             str(PORT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        undo.add("kill the receiver", self.stop)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "listening"

    def counts(self) -> tuple[float, dict[str, int]]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        got: dict[str, int] = json.loads(self.proc.stdout.readline())
        return time.monotonic(), got

    def rates(self, seconds: float) -> dict[str, float]:
        """Bit/s of each sender over the next ``seconds``."""
        t0, before = self.counts()
        time.sleep(seconds)
        t1, after = self.counts()
        return {tag: (after[tag] - before.get(tag, 0)) * 8 / (t1 - t0) for tag in after}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def test_be_egress_is_held_at_its_limit_while_ls_gets_its_request(
    undo: Undo, tmp_path: Path
) -> None:
    pair = veth_namespaces(undo)
    paths = cgroup_root_with_net_cls(tmp_path, undo, PATHS)
    tree = PodTree.create(paths, CONTROLLERS, undo)
    _, _, be_container = tree.add_pod(KubeQOS.BESTEFFORT)
    _, _, ls_container = tree.add_pod(KubeQOS.BURSTABLE)
    slo = tmp_path / "nodeslo.yaml"
    _nodeslo(slo, True)
    args = [
        "--standalone",
        "--nodeslo-file",
        str(slo),
        "--cgroup-root-dir",
        paths.cgroup_root,
        "--cgroup-kube-dir",
        f"{tree.prefix}/kubepods/",
        "--feature-gates",
        "TCNetworkQoS=true",
    ]
    with koordlet_in(pair.a, args, tmp_path) as k:

        def classified() -> bool:
            qdisc, classes = _tree(pair)
            ids = (
                tree.read("net_cls", be_container, "net_cls.classid").strip(),
                tree.read("net_cls", ls_container, "net_cls.classid").strip(),
            )
            be = classes.get(class_id_of(NetQoSClass.BE))
            return (
                qdisc is not None
                and qdisc.kind == "htb"
                and be is not None
                and be.ceil == 20 * M // 8
                and ids == (str(class_id_of(NetQoSClass.BE)), str(class_id_of(NetQoSClass.LS)))
            )

        k.until("the HTB tree and the pods' class ids", classified, timeout=30)
        _, classes = _tree(pair)
        assert {h: (c.rate * 8, c.ceil * 8, c.prio) for h, c in classes.items()} == {
            0x10001: (TOTAL, TOTAL, 0),
            0x10002: (30 * M, TOTAL, 1),
            0x10003: (60 * M, TOTAL, 2),
            0x10004: (10 * M, 20 * M, 3),
        }

        receiver = Receiver(pair, undo)
        prefix = ["nsenter", f"--net=/run/netns/{pair.a}"]
        be = tree.start(be_container, SENDER, pair.b_ip, str(PORT), "BE\n", "9", prefix=prefix)
        go(be)
        time.sleep(1.0)  # past TCP's ramp
        alone = receiver.rates(2.5)
        ls = tree.start(ls_container, SENDER, pair.b_ip, str(PORT), "LS\n", "5", prefix=prefix)
        go(ls)
        time.sleep(1.0)
        both = receiver.rates(2.5)

        assert 0.5 * 20 * M <= alone["BE"] <= 1.3 * 20 * M, f"BE alone: {alone}"
        assert both["LS"] >= 0.8 * 60 * M, f"LS beside BE: {both}"
        assert both["BE"] <= 1.3 * 20 * M, f"BE beside LS: {both}"

        report = k.json("/debug/qos")["strategies"]["netqos"]["last_round"]
        assert report["inputs"]["interface"] == pair.a_if
        assert report["inputs"]["bandwidth"] == {
            "bps": TOTAL,
            "source": "systemStrategy.totalNetworkBandwidth",
        }
        audit = k.json("/debug/audit?strategy=netqos")["entries"]
        paths_written = {e["path"] for e in audit}
        assert f"tc:{pair.a_if}/class 1:4 (be_class)" in paths_written
        assert any(p.endswith("net_cls.classid") for p in paths_written)

        _nodeslo(slo, False)

        def removed() -> bool:
            qdisc, _ = _tree(pair)
            return qdisc is None or qdisc.kind != "htb"

        k.until("the tree removed", removed, timeout=20)
        last: Any = k.json("/debug/qos")["strategies"]["netqos"]["last_round"]
        assert last["decision"] == "network QoS off: no koordlet tree"


def test_with_terway_qos_the_tree_goes_and_terway_qos_gets_its_files(
    undo: Undo, tmp_path: Path
) -> None:
    """netQOSPolicy terway-qos, gates TCNetworkQoS and TerwayQoS, the real koordlet: the tree
    of the tc policy goes, the TerwayQoS hook writes terway-qos's files for the pods of the
    cgroup inventory, the network QoS round says who writes them; back to tc, the files go and
    the tree comes back."""
    pair = veth_namespaces(undo)
    paths = cgroup_root_with_net_cls(tmp_path, undo, PATHS)
    tree = PodTree.create(paths, CONTROLLERS, undo)
    be_uid, be_pod, _ = tree.add_pod(KubeQOS.BESTEFFORT)
    ls_uid, ls_pod, _ = tree.add_pod(KubeQOS.BURSTABLE)
    slo = tmp_path / "nodeslo.yaml"
    _nodeslo(slo, True)
    folder = tmp_path / "terway" / "qos"
    args = [
        "--standalone", "--nodeslo-file", str(slo), "--cgroup-root-dir", paths.cgroup_root,
        "--cgroup-kube-dir", f"{tree.prefix}/kubepods/",
        "--feature-gates", "TCNetworkQoS=true,TerwayQoS=true",
        "--runtime-hooks-terway-qos-dir", str(folder), "--runtime-hooks-reconcile-interval", "1s",
        "--runtime-hooks-addr", "", "--enable-nri-runtime-hook=false",
    ]  # fmt: skip

    def htb() -> bool:
        qdisc, _ = _tree(pair)
        return qdisc is not None and qdisc.kind == "htb"

    with koordlet_in(pair.a, args, tmp_path) as k:
        k.until("the HTB tree", htb, timeout=30)
        assert not folder.exists()
        _nodeslo(slo, True, policy="terway-qos")
        k.until("terway-qos's files", lambda: (folder / "pod.json").exists(), timeout=20)
        k.until("the tree removed", lambda: not htb(), timeout=20)
        # 100 Mbit/s = 12_500_000 byte/s; LS 60 % / 100 %, BE 10 % / 20 % of it; the ingress
        # limits are the CRD's default 100 %
        got = GlobalBpsConfig.from_text((folder / "global_bps_config").read_text())
        assert got == GlobalBpsConfig(12_500_000, 12_500_000, 7_500_000, 12_500_000, 0,
                                      12_500_000, 1_250_000, 2_500_000, 0, 12_500_000)  # fmt: skip
        pods = parse_pod_config((folder / "pod.json").read_text())
        assert {uid: (p.prio, p.cgroup_dir) for uid, p in pods.items()} == {
            be_uid: (2, net_cls_dir(be_pod)),
            ls_uid: (1, net_cls_dir(ls_pod)),
        }
        notes = k.json("/debug/qos")["strategies"]["netqos"]["last_round"]["detail"]["notes"]
        assert notes[0].startswith("netQOSPolicy terway-qos: no tc tree; the TerwayQoS runtime")
        hooks = k.json("/debug/runtimehooks")["reconciler"]["node_files"]["TerwayQoS"]
        assert hooks["state"] == "netQOSPolicy terway-qos"
        assert hooks["pods"] == 2
        writes = k.json("/debug/audit?kind=write&limit=1000")["entries"]
        assert {e["knob"] for e in writes if e["strategy"] == "runtimehooks/TerwayQoS"} == {
            "TerwayQoS:global_bps_config",
            "TerwayQoS:pod.json",
        }

        _nodeslo(slo, True)
        k.until("the files removed", lambda: os.listdir(folder) == [], timeout=20)
        k.until("the HTB tree back", htb, timeout=20)


def test_the_tree_writer_takes_over_only_default_or_its_own_qdiscs(undo: Undo) -> None:
    pair = veth_namespaces(undo)
    audit: list[WriteResult] = []
    dry = {"on": False}
    writer = TCWriter(on_change=audit.append, is_dry_run=lambda strategy: dry["on"])

    def plan(be_ceil: int) -> TreePlan:
        link = in_netns(pair.a, writer.default_link)
        assert link is not None
        assert link.name == pair.a_if
        classes = (
            ClassPlan("root", 0x10001, 0x10000, TOTAL, TOTAL, 0),
            ClassPlan("system_class", 0x10002, 0x10001, 30 * M, TOTAL, 1),
            ClassPlan("ls_class", 0x10003, 0x10001, 60 * M, TOTAL, 2),
            ClassPlan("be_class", 0x10004, 0x10001, 10 * M, be_ceil, 3),
        )
        return TreePlan(link, classes, 2)

    def ensure(p: TreePlan) -> TreeResult:
        return in_netns(pair.a, lambda: writer.ensure(p, strategy="netqos", reason="test"))

    def qdisc() -> str:
        return subprocess.run(
            ["ip", "netns", "exec", pair.a, "tc", "qdisc", "show", "dev", pair.a_if],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    tc_cmd = ["ip", "netns", "exec", pair.a, "tc"]
    tbf = ["tbf", "rate", "1mbit", "burst", "32kbit", "latency", "400ms"]
    subprocess.run([*tc_cmd, "qdisc", "add", "dev", pair.a_if, "root", "handle", "8001:", *tbf],
                   check=True)  # fmt: skip
    refused = ensure(plan(20 * M))
    assert "root qdisc tbf 8001:0 on" in refused.refused
    assert "tbf" in qdisc()
    assert audit == []

    subprocess.run([*tc_cmd, "qdisc", "del", "dev", pair.a_if, "root"], check=True)
    dry["on"] = True
    planned = ensure(plan(20 * M))
    assert planned.dry_run
    assert len(planned.changes) == 6  # the qdisc, four classes, the filter
    assert "htb" not in qdisc()
    assert [r.dry_run for r in audit] == [True] * 6
    ensure(plan(20 * M))
    assert len(audit) == 6  # the same decision is audited once

    dry["on"] = False
    done = ensure(plan(20 * M))
    assert len(done.changes) == 6
    assert done.classes["1:4"] == {"rate_bps": 10 * M, "ceil_bps": 20 * M, "prio": 3}
    assert ensure(plan(20 * M)).changes == []
    changed = ensure(plan(40 * M))
    assert changed.changes == [
        "class 1:4 (be_class): rate 10000kbit ceil 20000kbit prio 3 -> "
        "rate 10000kbit ceil 40000kbit prio 3"
    ]
    assert audit[-1].path == f"tc:{pair.a_if}/class 1:4 (be_class)"

    link = plan(20 * M).link
    # Someone else's HTB 1: (no koord_classid filter, a class of its own): left alone.
    in_netns(pair.a, lambda: writer.remove(link, strategy="netqos", reason="test"))
    subprocess.run([*tc_cmd, "qdisc", "add", "dev", pair.a_if, "root", "handle", "1:", "htb"],
                   check=True)  # fmt: skip
    subprocess.run([*tc_cmd, "class", "add", "dev", pair.a_if, "parent", "1:", "classid", "1:9",
                    "htb", "rate", "1mbit"], check=True)  # fmt: skip
    assert "not installed by the koordlet" in ensure(plan(20 * M)).refused
    kept = in_netns(pair.a, lambda: writer.remove(link, strategy="netqos", reason="test"))
    assert "not ours" in kept.refused
    assert "htb 1:" in qdisc()


def test_a_pods_own_class_is_made_and_deleted_when_no_longer_planned(undo: Undo) -> None:
    pair = veth_namespaces(undo)
    audit: list[WriteResult] = []
    writer = TCWriter(on_change=audit.append)
    link = in_netns(pair.a, writer.default_link)
    assert link is not None
    base = (
        ClassPlan("root", 0x10001, 0x10000, TOTAL, TOTAL, 0),
        ClassPlan("system_class", 0x10002, 0x10001, 30 * M, TOTAL, 1),
        ClassPlan("ls_class", 0x10003, 0x10001, 60 * M, TOTAL, 2),
        ClassPlan("be_class", 0x10004, 0x10001, 10 * M, 20 * M, 3),
    )
    pod = ClassPlan("pod ns/a", 0x10000 | 0x1A2B, 0x10001, 0, 5 * M, 3)

    def ensure(*extra: ClassPlan) -> TreeResult:
        plan = TreePlan(link, (*base, *extra), 2, owned_minors=POD_CLASS_MINORS)
        return in_netns(pair.a, lambda: writer.ensure(plan, strategy="netqos", reason="test"))

    made = ensure(pod)
    assert made.classes["1:1a2b"] == {"rate_bps": 8000, "ceil_bps": 5 * M, "prio": 3}
    assert ensure(pod).changes == []
    gone = ensure()
    assert gone.changes == [
        "class 1:1a2b (a pod's, no longer wanted): rate 8kbit ceil 5000kbit prio 3 -> none"
    ]
    assert "1:1a2b" not in gone.classes
    assert set(gone.classes) == {"1:1", "1:2", "1:3", "1:4"}
    assert audit[-1].path == f"tc:{pair.a_if}/class 1:1a2b (a pod's, no longer wanted)"


def test_reset_takes_down_the_tree_the_koordlet_installed_and_only_that(undo: Undo) -> None:
    pair = veth_namespaces(undo)
    recorded: list[Original] = []
    audit: list[WriteResult] = []
    writer = TCWriter(record_original=recorded.append)
    link = in_netns(pair.a, writer.default_link)
    assert link is not None
    classes = (
        ClassPlan("root", 0x10001, 0x10000, TOTAL, TOTAL, 0),
        ClassPlan("be_class", 0x10004, 0x10001, 10 * M, 20 * M, 3),
    )
    in_netns(pair.a, lambda: writer.ensure(TreePlan(link, classes, 2), strategy="t", reason="t"))
    in_netns(pair.a, lambda: writer.ensure(TreePlan(link, classes, 2), strategy="t", reason="t"))
    # Recorded once, before the kernel's default root qdisc was first replaced.
    assert [(o.kind, o.path) for o in recorded] == [("tc_tree", f"tc:{pair.a_if}")]
    host = Host(HostPaths(), detect_layout(HostPaths()))
    steps = [s for s in restore.plan(host, recorded) if s.kind == "tc_tree"]
    assert [(s.path, s.target) for s in steps] == [(f"tc:{pair.a_if}", "remove")]

    dry = in_netns(pair.a, lambda: restore.remove_tree_step(steps[0], True, audit.append))
    assert dry.result is not None
    assert dry.result.dry_run
    assert "htb" in root_kind(pair.a, link.index)

    done = in_netns(pair.a, lambda: restore.remove_tree_step(steps[0], False, audit.append))
    assert done.result is not None
    assert done.result.changed
    assert audit[-1].path == f"tc:{pair.a_if}/qdisc root"
    assert "htb" not in root_kind(pair.a, link.index)
    again = in_netns(pair.a, lambda: restore.remove_tree_step(steps[0], False, audit.append))
    assert again.skipped == "no koordlet tree left"


def root_kind(ns: str, index: int) -> str:
    def read() -> str:
        with tc.rtnl() as ipr:
            root = tc.root_qdisc(ipr, index)
            return "none" if root is None else root.kind

    return in_netns(ns, read)

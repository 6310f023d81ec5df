"""One real node and its control plane: :class:`Cluster` brings up, in order, the bridge, etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, containerd and a kubelet, and waits for
the Node to be Ready; :meth:`Cluster.close` takes everything down in reverse, after deleting the
pods through the API so the kubelet tears them down itself (``../shared/k8s/README.md``).

A run killed before its ``close`` leaves a record (``<cache>/envtest-runs/<id>.json``: its
folder, bridge, chain, cgroup root and the PIDs it started with their executables); the next
:class:`Cluster` reaps such records whose owner is gone, killing only those PIDs whose executable
still matches.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envtest import assets as assetsmod
from envtest.containerd import Containerd
from envtest.controlplane import ADMIN, ControlPlane
from envtest.network import Network
from envtest.node import Kubelet, make_private, make_shared, unmount_under
from envtest.procs import Proc, StartError


def _runs_dir() -> Path:
    return assetsmod.cache_dir() / "envtest-runs"


Front = Callable[["Node", str], tuple[str, Proc]]
"""Something between a kubelet and its containerd (koord-runtime-proxy): called with the node
and containerd's socket path, it starts and returns the kubelet's CRI endpoint (``unix://...``)
and its process."""


@dataclass
class Node:
    """One kubelet with its own containerd (two kubelets on one containerd would remove each
    other's pods), cgroup root and, optionally, a CRI proxy between them."""

    name: str
    root: Path
    cgroup_root: str
    containerd: Containerd | None = None
    front: Proc | None = None
    kubelet: Kubelet | None = None

    @property
    def kubepods_dir(self) -> str:
        """The node's kubepods folder below each controller (the koordlet's
        ``--cgroup-kube-dir``)."""
        return f"{self.cgroup_root}/kubepods/"

    def cgroup(self, controller: str, *rel: str) -> Path:
        return Path("/sys/fs/cgroup", controller, self.cgroup_root, *rel)


@dataclass
class Cluster:
    """Start with :meth:`start`; :meth:`close` always."""

    root: Path = Path()
    """The run's folder (default ``/tmp/koordtest-<id>``)."""
    nodes: int = 1
    """Kubelets to start (0: the control plane alone, no bridge, containerd or kubelet)."""
    fronts: dict[int, Front] = field(default_factory=dict)
    """Node index -> what sits between that kubelet and its containerd."""
    kubelet_config: dict[int, str] = field(default_factory=dict)
    """Node index -> more KubeletConfiguration keys (YAML lines), e.g. ``kubeReserved``."""
    scheduler: bool = True
    controller_manager: bool = True
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    assets: assetsmod.Assets | None = None
    network: Network | None = None
    control: ControlPlane | None = None
    node_list: list[Node] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    shared_sys: bool = False
    """Whether :meth:`start` made ``/sys`` a shared mount (and :meth:`close` undoes it)."""

    def __post_init__(self) -> None:
        if self.root == Path():
            self.root = Path(f"/tmp/koordtest-{self.id}")

    def node_name(self, index: int = 0) -> str:
        return f"koordtest-{self.id}-{index}"

    @property
    def node(self) -> Node:
        """The first node."""
        return self.node_list[0]

    def kubeconfig(self, who: str = ADMIN) -> Path:
        assert self.control is not None
        return self.control.kubeconfig(who)

    # bring-up -----------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Everything, up to Ready Nodes (or the control plane alone with ``nodes=0``)."""
        t0 = time.monotonic()
        reap_stale()
        self.assets = assetsmod.unpack()
        self.root.mkdir(parents=True, exist_ok=True)
        self._record()
        address = "127.0.0.1"
        service_cidr, service_ip = "10.0.0.0/24", "10.0.0.1"
        if self.nodes:
            self.network = Network(self.root / "net", name=f"kt{self.id}")
            self.network.up()
            address = self.network.gateway
            service_cidr = self.network.service_cidr
            service_ip = self.network.kubernetes_service_ip
        self.control = ControlPlane(
            self.assets,
            self.root / "control",
            address=address,
            service_cidr=service_cidr,
            kubernetes_service_ip=service_ip,
            node_names=tuple(self.node_name(i) for i in range(self.nodes)),
        )
        self._record()
        self.control.start(controller_manager=self.controller_manager, scheduler=self.scheduler)
        self.timings["control_plane_s"] = time.monotonic() - t0
        self._record()
        if self.nodes:
            assert self.network is not None
            self.network.route_service(service_ip, 443, address, self.control.port)
            # as on a systemd host: pods may ask for Bidirectional propagation below /sys
            self.shared_sys = make_shared("/sys")
            self._record()
            for i in range(self.nodes):
                self.start_node(i)
        self.timings["ready_s"] = time.monotonic() - t0
        return self

    def start_node(self, index: int, timeout: float = 90.0) -> Node:
        assert self.assets is not None
        assert self.network is not None
        t0 = time.monotonic()
        name = self.node_name(index)
        node = Node(name, self.root / f"node-{index}", cgroup_root=name)
        self.node_list.append(node)
        node.containerd = Containerd(
            node.root / "containerd",
            cgroup_prefix=node.cgroup_root,
            snapshotter="overlayfs",
            cni_conf_dir=self.network.cni_conf_dir,
            cni_bin_dir=assetsmod.CNI_DIR,
            pause_binary=self.assets.path("pause"),
        )
        node.containerd.start()
        self._record()
        endpoint = f"unix://{node.containerd.socket}"
        if index in self.fronts:
            endpoint, node.front = self.fronts[index](node, node.containerd.socket)
            self._record()
        node.kubelet = Kubelet(
            self.assets,
            node.root / "kubelet",
            name=name,
            address=self.network.gateway,
            kubeconfig=self.kubeconfig(f"node:{name}"),
            runtime_endpoint=endpoint,
            cgroup_root=node.cgroup_root,
            extra_config=f"clusterDNS: [{self.network.gateway}]\nclusterDomain: cluster.local\n"
            + self.kubelet_config.get(index, ""),
        )
        node.kubelet.start()
        self._record()
        assert node.kubelet.proc is not None
        node.kubelet.proc.wait_until(lambda: self.node_ready(name), timeout, f"Node {name} Ready")
        self.timings[f"node{index}_ready_s"] = time.monotonic() - t0
        return node

    def node_ready(self, name: str) -> bool:
        node = self.get("node", name)
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )

    # using it -----------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """The real kubectl as the admin; stdout (CalledProcessError-like RuntimeError on
        failure with ``check``)."""
        assert self.assets is not None
        out = subprocess.run(
            [self.assets.path("kubectl"), f"--kubeconfig={self.kubeconfig()}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def get(self, kind: str, name: str = "", namespace: str = "") -> dict[str, Any]:
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        return dict(json.loads(self.kubectl(*args)))

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One API request as the admin, without a kubectl process (for timings): the decoded
        answer; RuntimeError with the API's message on an error status."""
        assert self.control is not None
        assert self.control.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.control.pki.ca_crt))
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.control.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.control.tokens[ADMIN]}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"{method} {path}: {err.code} {err.read()[:500]!r}") from err

    def apply(self, manifest: str) -> str:
        return self.kubectl("apply", "-f", "-", input=manifest)

    def wait_for(self, what: str, check: Any, timeout: float = 60.0, every: float = 0.2) -> Any:
        """Poll ``check()`` until it returns something truthy; that value. RuntimeError naming
        ``what`` at the deadline (with the last exception, if any)."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                value = check()
            except Exception as err:  # the check's own failures are retried until the deadline
                last = err
            else:
                if value:
                    return value
            time.sleep(every)
        raise RuntimeError(f"{what}: not within {timeout:.0f} s" + (f" ({last})" if last else ""))

    # tear-down ----------------------------------------------------------------------------

    def delete_pods(self, timeout: float = 60.0) -> None:
        """Delete every pod the node runs, through the API, and wait until the kubelet has
        torn them down (their cgroups gone)."""
        if self.control is None or not self.control.procs:
            return
        with contextlib.suppress(Exception):
            for ns in self.get("namespaces")["items"]:
                name = ns["metadata"]["name"]
                kinds = "daemonsets,deployments,replicasets,jobs,pods"
                self.kubectl("delete", kinds, "--all", "-n", name, "--wait=false",
                             "--grace-period=1", check=False)  # fmt: skip
        deadline = time.monotonic() + timeout
        for node in self.node_list:
            if node.kubelet is None or node.kubelet.proc is None or not node.kubelet.proc.running():
                continue
            kubepods = node.cgroup("cpu", "kubepods")
            while time.monotonic() < deadline:
                left = (
                    [p for p in kubepods.rglob("pod*") if p.is_dir()] if kubepods.is_dir() else []
                )
                if not left:
                    break
                time.sleep(0.2)

    def close(self) -> None:
        """Everything down in reverse order; never raises."""
        with contextlib.suppress(Exception):
            self.delete_pods()
        for node in reversed(self.node_list):
            if node.kubelet is not None:
                node.kubelet.stop()
            if node.front is not None:
                node.front.stop()
            if node.containerd is not None:
                node.containerd.close()
        if self.network is not None:
            self.network.down()
        if self.shared_sys:
            make_private("/sys")
        if self.control is not None:
            self.control.stop()
        unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            (_runs_dir() / f"{self.id}.json").unlink()

    def logs(self) -> dict[str, Path]:
        """Each part's log file, by its path under the run's folder without ``.log``
        (``node-2/containerd``: every node's, not one per name)."""
        found = {str(p.relative_to(self.root).with_suffix("")): p for p in self.root.rglob("*.log")}
        return dict(sorted(found.items()))

    # the record of a run ------------------------------------------------------------------

    def _procs(self) -> list[Proc]:
        out: list[Proc] = []
        if self.control is not None:
            out += self.control.procs
        for node in self.node_list:
            if node.front is not None:
                out.append(node.front)
            if node.kubelet is not None and node.kubelet.proc is not None:
                out.append(node.kubelet.proc)
        return out

    def _record(self) -> None:
        pids = {str(p.pid): p.argv[0] for p in self._procs() if p.popen is not None}
        for node in self.node_list:
            if node.containerd is not None and node.containerd.proc is not None:
                pids[str(node.containerd.proc.pid)] = "containerd"
        record = {
            "owner": os.getpid(),
            "root": str(self.root),
            "bridge": self.network.name if self.network else "",
            "nodes": [[str(n.root), n.cgroup_root] for n in self.node_list],
            "shared_sys": self.shared_sys,
            "pids": pids,
        }
        _runs_dir().mkdir(parents=True, exist_ok=True)
        (_runs_dir() / f"{self.id}.json").write_text(json.dumps(record))


def reap_stale() -> None:
    """Tear down what killed runs left (their owner process gone)."""
    runs = _runs_dir()
    if not runs.is_dir():
        return
    for path in runs.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{record.get('owner', 0)}").exists():
            continue
        for pid, exe in record.get("pids", {}).items():
            with contextlib.suppress(OSError):
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                if argv0 == exe:
                    os.kill(int(pid), 9)
        stale = Cluster(root=Path(record["root"]), id=path.stem)
        stale.shared_sys = bool(record.get("shared_sys"))
        if record.get("bridge"):
            stale.network = Network(stale.root / "net", name=record["bridge"])
        for root, cgroup_root in record.get("nodes", []):
            node = Node(cgroup_root, Path(root), cgroup_root)
            node.containerd = Containerd(node.root / "containerd", cgroup_prefix=cgroup_root)
            stale.node_list.append(node)
        with contextlib.suppress(Exception):
            stale.close()
        with contextlib.suppress(OSError):
            path.unlink()


__all__ = ["Cluster", "Front", "Node", "StartError", "reap_stale"]

"""Koordinator's components on the real cluster, as host processes (what a bare-metal or
systemd install runs) with the identities the manifests give them: each gets a kubeconfig with
a token of its ServiceAccount (``kubectl create token``), so RBAC is the shipped RBAC.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envtest.cluster import Cluster, Node
from envtest.procs import Proc, free_port

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "packaging" / "kubernetes"
NAMESPACE = "koordinator-system"


def binary(name: str) -> str:
    """A console script of this checkout's environment."""
    return str(Path(sys.executable).parent / name)


def hook_socket(node: Node) -> Path:
    return node.root / "koordlet-run" / "koordlet.sock"


def proxy_front(node: Node, containerd_socket: str) -> tuple[str, Proc]:
    """koord-runtime-proxy between the node's kubelet and containerd, calling the koordlet's
    hook socket (failing open while no koordlet listens)."""
    sock = node.root / "proxy" / "runtimeproxy.sock"
    sock.parent.mkdir(parents=True, exist_ok=True)
    hook_socket(node).parent.mkdir(parents=True, exist_ok=True)
    proc = Proc(
        "koord-runtime-proxy",
        [
            binary("koord-runtime-proxy"),
            f"--koord-runtimeproxy-endpoint={sock}",
            f"--remote-runtime-service-endpoint={containerd_socket}",
            f"--remote-image-service-endpoint={containerd_socket}",
            f"--runtime-hook-server-endpoint={hook_socket(node)}",
            f"--runtime-hooks-config-dir={node.root / 'hookserver.d'}",
        ],
        node.root / "koord-runtime-proxy.log",
    ).start()
    proc.wait_until(sock.exists, 30, "its socket")
    return f"unix://{sock}", proc


@dataclass
class Koordlet:
    """A koordlet host process for one node."""

    node: Node
    proc: Proc
    port: int
    state_dir: Path
    flags: list[str] = field(default_factory=list)
    """The extra flags it was started with."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            body = r.read()
        return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


QOS_KNOBS = (
    ("cpu", "cpu.cfs_quota_us"),
    ("cpu", "cpu.cfs_period_us"),
    ("cpu", "cpu.shares"),
    ("cpuset", "cpuset.cpus"),
    ("cpuset", "cpuset.mems"),
    ("memory", "memory.limit_in_bytes"),
)
"""What a koordlet may write on the node's kubepods and QoS cgroups."""


KUBELET_RECOMPUTED = "kubepods/burstable/cpu.shares"
"""The QoS knob the kubelet keeps recomputing from the pods it runs: the Burstable pods' CPU
requests as shares, at each pod's sync and once a minute (UpdateCgroups in Kubernetes'
pkg/kubelet/cm/qos_container_manager_linux.go). It moves whenever a Burstable pod comes or finishes
going (an earlier test's, a replaced koordlet pod), so it witnesses nothing of the koordlet's."""


def without_kubelets(snapshot: dict[str, str]) -> dict[str, str]:
    """``snapshot`` less :data:`KUBELET_RECOMPUTED`, to compare what the koordlet may write."""
    return {k: v for k, v in snapshot.items() if k != KUBELET_RECOMPUTED}


def qos_snapshot(node: Node) -> dict[str, str]:
    """The node's kubepods, burstable and besteffort cgroups' :data:`QOS_KNOBS`."""
    out = {}
    for rel in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
        for controller, knob in QOS_KNOBS:
            path = node.cgroup(controller, rel, knob)
            out[f"{rel}/{knob}"] = path.read_text().strip()
    return out


@dataclass
class HostProcs:
    """The components a bare-metal install runs, as host processes."""

    manager: Proc
    webhook: Proc
    koordlets: list[Koordlet]
    scheduler: Proc
    baseline: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node name -> :func:`qos_snapshot` before its koordlet first started."""

    def koordlet(self, node: Node) -> Koordlet:
        return next(k for k in self.koordlets if k.node is node)

    def exited(self) -> list[Proc]:
        """The components that are no longer running (none should be: nothing restarts them)."""
        procs = [self.manager, self.webhook, self.scheduler, *(k.proc for k in self.koordlets)]
        return [p for p in procs if not p.running()]


@dataclass
class Koordinator:
    cluster: Cluster
    procs: list[Proc] = field(default_factory=list)
    koordlets: dict[str, Koordlet] = field(default_factory=dict)
    hostprocs: HostProcs | None = None
    taken_over: bool = False
    """The host processes were stopped for the install as pods."""

    @property
    def root(self) -> Path:
        return self.cluster.root / "koordinator"

    def install_base(self) -> None:
        c = self.cluster
        c.kubectl("apply", "--server-side", "-f", str(MANIFESTS / "crds"))
        c.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        c.kubectl("apply", "-f", str(MANIFESTS / "koordlet" / "namespace.yaml"))
        for part in ("koordlet", "manager", "scheduler", "descheduler"):
            c.kubectl("apply", "-f", str(MANIFESTS / part / "rbac.yaml"))
        c.kubectl("apply", "-f", str(MANIFESTS / "manager" / "slo-controller-config.yaml"))
        pcs = MANIFESTS / "priorityclasses.yaml"
        if pcs.exists():
            c.kubectl("apply", "-f", str(pcs))
        else:  # FIXME(lead): until packaging ships them
            for name, value in (
                ("koord-prod", 9000),
                ("koord-mid", 7000),
                ("koord-batch", 5000),
                ("koord-free", 3000),
            ):
                c.apply(
                    json.dumps(
                        {
                            "apiVersion": "scheduling.k8s.io/v1",
                            "kind": "PriorityClass",
                            "metadata": {"name": name},
                            "value": value,
                        }
                    )
                )

    def kubeconfig_for(self, service_account: str) -> Path:
        """A kubeconfig with a token of ``koordinator-system/<service_account>`` (1 h)."""
        c = self.cluster
        path = self.root / "kubeconfigs" / f"{service_account}.yaml"
        if path.exists():
            return path
        token = c.kubectl(
            "create", "token", service_account, "-n", NAMESPACE, "--duration=3600s"
        ).strip()
        admin = c.kubeconfig().read_text()
        user = "admin"
        start = admin.index("users:")
        end = admin.index("contexts:")
        users = f"users:\n- name: {user}\n  user:\n    token: {token}\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(admin[:start] + users + admin[end:])
        return path

    def start(self, name: str, argv: list[str], log: str | None = None) -> Proc:
        proc = Proc(name, argv, self.root / (log or f"{name}.log")).start()
        self.procs.append(proc)
        return proc

    def start_koordlet(self, node: Node, *extra: str) -> Koordlet:
        """The koordlet for ``node`` in cluster mode (its ServiceAccount's identity), its hook
        server on the socket node 0's proxy calls; ready when ``/readyz`` answers 200."""
        state = self.root / f"koordlet-{node.name}" / "state"
        state.mkdir(parents=True, exist_ok=True)
        port = free_port()
        assert node.kubelet is not None
        proc = self.start(
            f"koordlet {node.name}",
            [binary("koordlet"), *self.koordlet_argv(node, port, *extra)],
            log=f"koordlet-{node.name}.log",
        )
        k = Koordlet(node, proc, port, state, list(extra))
        proc.wait_until(lambda: _ok(k.url + "/readyz"), 60, "/readyz 200")
        self.koordlets[node.name] = k
        return k

    def start_manager(self) -> Proc:
        """``koord-manager run`` (every controller, leader-elected as shipped)."""
        return self.start(
            "koord-manager",
            [
                binary("koord-manager"),
                "run",
                f"--kubeconfig={self.kubeconfig_for('koord-manager')}",
                "--enable-leader-election=true",
                f"--leader-election-namespace={NAMESPACE}",
                f"--config-namespace={NAMESPACE}",
                "--slo-config-name=slo-controller-config",
                "--sync-period=60",
            ],
        )

    def start_webhook(self) -> Proc:
        """``koord-manager webhook`` on the node's address, reached by the API server through
        the shipped Service (here without a selector: its Endpoints name this process) and
        webhook configurations; its certificate made and kept in the shipped Secret and its CA
        patched into the configurations' caBundle by the webhook itself, as installed."""
        c = self.cluster
        assert c.network is not None
        port = free_port(c.network.gateway)
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "koordinator-webhook-service", "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "webhook", "port": 443, "targetPort": port}]},
        }
        endpoints = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "koordinator-webhook-service", "namespace": NAMESPACE},
            "subsets": [
                {
                    "addresses": [{"ip": c.network.gateway}],
                    "ports": [{"name": "webhook", "port": port}],
                }
            ],
        }
        c.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, endpoints]}))
        for part in ("webhook-secret.yaml", "webhooks.yaml"):
            c.kubectl("apply", "-f", str(MANIFESTS / "manager" / part))
        proc = self.start(
            "koord-manager-webhook",
            [
                binary("koord-manager"),
                "webhook",
                f"--kubeconfig={self.kubeconfig_for('koord-manager')}",
                f"--webhook-host={c.network.gateway}",
                f"--webhook-port={port}",
                f"--webhook-cert-dir={self.root / 'webhook-certs'}",
                f"--webhook-service-namespace={NAMESPACE}",
            ],
        )
        proc.wait_until(lambda: _webhook_ready(c), 60, "caBundle injected")
        return proc

    def scheduler_config(self) -> Path:
        """The shipped koord-scheduler configuration (its ConfigMap's file) without LoadAware's
        usage thresholds (:func:`tier_scheduler_config`), written to a file."""
        path = self.root / "koord-scheduler-config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tier_scheduler_config())
        return path

    def start_scheduler(self) -> Proc:
        """``koord-scheduler run`` with :meth:`scheduler_config`."""
        return self.start(
            "koord-scheduler",
            [
                binary("koord-scheduler"),
                "run",
                f"--kubeconfig={self.kubeconfig_for('koord-scheduler')}",
                f"--config={self.scheduler_config()}",
                "--scheduler-name=koord-scheduler",
                "--leader-elect=true",
                "--leader-elect-resource-name=koord-scheduler",
                f"--leader-elect-resource-namespace={NAMESPACE}",
            ],
        )

    def start_extender(self) -> tuple[Proc, int]:
        """``koord-scheduler extender --bind`` on informers (the extender's ServiceAccount), on
        loopback; its port."""
        config = self.scheduler_config()
        port = free_port()
        proc = self.start(
            "koord-scheduler-extender",
            [
                binary("koord-scheduler"),
                "extender",
                f"--kubeconfig={self.kubeconfig_for('koord-scheduler-extender')}",
                f"--addr=127.0.0.1:{port}",
                f"--config={config}",
                "--bind",
            ],
        )
        proc.wait_until(lambda: _ok(f"http://127.0.0.1:{port}/readyz"), 60, "/readyz 200")
        return proc, port

    def start_kube_scheduler_with_extender(self, scheduler_name: str, port: int) -> Proc:
        """A stock kube-scheduler (``../shared/k8s``) with the shipped extender configuration
        (v1beta3: this kube-scheduler's newest), under profile ``scheduler_name``, calling the
        extender on ``port``."""
        c = self.cluster
        assert c.control is not None
        docs = yaml.safe_load_all((MANIFESTS / "scheduler" / "config.yaml").read_text())
        cm = next(d for d in docs if d["metadata"]["name"] == "kube-scheduler-extender-config")
        text = cm["data"]["kube-scheduler-config-v1beta3.yaml"]
        text = text.replace("/etc/kubernetes/scheduler.conf", "KUBECONFIG")
        text = text.replace(
            "http://koord-scheduler-extender.koordinator-system.svc:10262",
            f"http://127.0.0.1:{port}",
        )
        text += (
            "leaderElection:\n  leaderElect: false\n"
            f"profiles:\n  - schedulerName: {scheduler_name}\n"
        )
        proc = c.control.start_scheduler(f"kube-scheduler-{scheduler_name}", text)
        self.procs.append(proc)
        return proc

    def start_descheduler(self, tune: Callable[[dict[str, Any]], None]) -> Proc:
        """``koord-descheduler run`` with the shipped configuration as ``tune`` changes it
        (leader-elected as shipped)."""
        c = self.cluster
        c.kubectl("apply", "-f", str(MANIFESTS / "descheduler" / "config.yaml"))
        cm = c.get("configmap", "koord-descheduler-config", NAMESPACE)
        doc = yaml.safe_load(cm["data"]["koord-descheduler-config.yaml"])
        tune(doc)
        path = self.root / "koord-descheduler-config.yaml"
        path.write_text(yaml.safe_dump(doc))
        return self.start(
            "koord-descheduler",
            [
                binary("koord-descheduler"),
                "run",
                f"--kubeconfig={self.kubeconfig_for('koord-descheduler')}",
                f"--config={path}",
            ],
        )

    def koordlet_argv(self, node: Node, port: int, *extra: str) -> list[str]:
        assert node.kubelet is not None
        state = self.root / f"koordlet-{node.name}" / "state"
        return [
            f"--node-name={node.name}",
            f"--kubeconfig={self.kubeconfig_for('koordlet')}",
            f"--addr=127.0.0.1:{port}",
            f"--cgroup-kube-dir={node.kubepods_dir}",
            f"--state-dir={state}",
            f"--var-lib-kubelet-dir={node.kubelet.root / 'root'}",
            f"--kubelet-config-file={node.kubelet.root / 'kubelet.yaml'}",
            f"--runtime-hooks-addr={hook_socket(node)}",
            f"--runtime-hooks-host-endpoint={hook_socket(node)}",
            f"--runtime-hooks-config-path={node.root / 'hookserver.d'}",
            "--enable-nri-runtime-hook=false",
            *extra,
        ]

    def kill_koordlet(self, k: Koordlet) -> None:
        """SIGKILL, as a crash or an OOM kill does."""
        assert k.proc.popen is not None
        k.proc.popen.kill()
        k.proc.popen.wait(10)
        if k.proc in self.procs:
            self.procs.remove(k.proc)

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()


def tier_scheduler_config() -> str:
    """The shipped koord-scheduler configuration without LoadAware's usage thresholds: the nodes
    are one machine, so each node's usage is the whole test suite's, and the small node's memory
    usage is over its allocatable by design (LoadAware's own rules are the scheduler tests')."""
    docs = list(yaml.safe_load_all((MANIFESTS / "scheduler" / "config.yaml").read_text()))
    cm = next(d for d in docs if d["metadata"]["name"] == "koord-scheduler-config")
    doc = yaml.safe_load(cm["data"]["koord-scheduler-config.yaml"])
    for profile in doc["profiles"]:
        for plugin in profile.get("pluginConfig", []):
            if plugin["name"] == "LoadAwareScheduling":
                # 0: the threshold does not apply (upstream's filterNodeUsage skips it)
                plugin["args"]["usageThresholds"] = {"cpu": 0, "memory": 0}
    return str(yaml.safe_dump(doc))


def _webhook_ready(c: Cluster) -> bool:
    hooks = c.get("mutatingwebhookconfiguration", "koordinator-mutating-webhook-configuration")
    return all(h.get("clientConfig", {}).get("caBundle") for h in hooks["webhooks"])


def _ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as r:
        return bool(r.status == 200)


def wait(
    what: str,
    check: Any,
    timeout: float = 60.0,
    every: float = 0.2,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll ``check()`` until truthy (its value); AssertionError naming ``what`` at the deadline,
    with what ``explain()`` says of the state then (it is not allowed to raise)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as err:  # retried until the deadline
            last = err
        else:
            if value:
                return value
        time.sleep(every)
    message = f"{what}: not within {timeout:.0f} s" + (f" (last: {last!r})" if last else "")
    if explain is not None:
        try:
            message += "\n" + explain()
        except Exception as err:  # the failure is reported all the same
            message += f"\n(explaining failed: {err!r})"
    raise AssertionError(message)

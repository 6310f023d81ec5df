"""etcd, kube-apiserver and, when asked, kube-controller-manager and kube-scheduler: the control
plane of a test cluster, on ports of its own under one folder.

Authentication is a static token file (an admin in ``system:masters``, the scheduler, the
controller manager, and a kubelet identity per node name asked for); authorization is
``Node,RBAC``; ServiceAccount tokens are signed by a key of the run's, so pods run with their
ServiceAccounts as in a real cluster. ``--enable-aggregator-routing`` makes the API server dial a
webhook's Service through its endpoints (no kube-proxy is needed for admission webhooks), and
``--kubelet-preferred-address-types=InternalIP`` keeps ``logs`` and ``exec`` off DNS.
"""

from __future__ import annotations

import secrets
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from envtest import pki as pkimod
from envtest.assets import Assets
from envtest.procs import Proc, free_port, https_ok

ADMIN = "admin"
SCHEDULER = "scheduler"
CONTROLLER_MANAGER = "controller-manager"


@dataclass
class ControlPlane:
    """Start with :meth:`start`; :meth:`stop` always (reverse order)."""

    assets: Assets
    root: Path
    address: str = "127.0.0.1"
    """Where the API server serves (the node's bridge address when a node joins)."""
    service_cidr: str = "10.0.0.0/24"
    kubernetes_service_ip: str = "10.0.0.1"
    node_names: tuple[str, ...] = ()
    """Kubelet identities to issue tokens for (``system:node:<name>``)."""
    extra_apiserver_flags: tuple[str, ...] = ()
    port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    pki: pkimod.PKI | None = None

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    def kubeconfig(self, who: str = ADMIN) -> Path:
        """A kubeconfig file for ``who`` (``admin``, ``scheduler``, ``controller-manager`` or
        ``node:<name>``)."""
        path = self.root / "kubeconfigs" / f"{who.replace(':', '-')}.yaml"
        if not path.exists():
            assert self.pki is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                textwrap.dedent(f"""\
                apiVersion: v1
                kind: Config
                clusters:
                - name: koordtest
                  cluster:
                    server: {self.url}
                    certificate-authority: {self.pki.ca_crt}
                users:
                - name: {who}
                  user:
                    token: {self.tokens[who]}
                contexts:
                - name: koordtest
                  context: {{cluster: koordtest, user: {who}}}
                current-context: koordtest
                """)
            )
        return path

    def start(self, *, controller_manager: bool = False, scheduler: bool = False) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pki = pkimod.make(
            self.root / "pki",
            ips=[self.address, self.kubernetes_service_ip, "127.0.0.1"],
            dns=[
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ],
        )
        rows = {
            ADMIN: ("admin", "system:masters"),
            SCHEDULER: ("system:kube-scheduler", ""),
            CONTROLLER_MANAGER: ("system:kube-controller-manager", ""),
        }
        for node in self.node_names:
            rows[f"node:{node}"] = (f"system:node:{node}", "system:nodes")
        lines = []
        for who, (user, groups) in rows.items():
            self.tokens[who] = secrets.token_hex(16)
            lines.append(f'{self.tokens[who]},{user},{user},"{groups}"')
        tokens = self.root / "tokens.csv"
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)

        etcd_client, etcd_peer = free_port(), free_port()
        etcd = Proc(
            "etcd",
            [
                "etcd",
                "--name=koordtest",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=koordtest=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            self.root / "etcd.log",
        ).start()
        self.procs.append(etcd)
        self.port = self.port or free_port(self.address)
        p = self.pki
        apiserver = Proc(
            "kube-apiserver",
            [
                self.assets.path("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.port}",
                f"--tls-cert-file={p.apiserver_crt}",
                f"--tls-private-key-file={p.apiserver_key}",
                f"--client-ca-file={p.ca_crt}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--enable-aggregator-routing=true",
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.extra_apiserver_flags,
            ],
            self.root / "kube-apiserver.log",
        ).start()
        self.procs.append(apiserver)
        apiserver.wait_until(
            lambda: https_ok(f"{self.url}/readyz", p.ca_crt, self.tokens[ADMIN]), 60, "/readyz"
        )
        if controller_manager:
            cm = Proc(
                "kube-controller-manager",
                [
                    self.assets.path("kube-controller-manager"),
                    f"--kubeconfig={self.kubeconfig(CONTROLLER_MANAGER)}",
                    "--controllers=*",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={p.sa_key}",
                    f"--root-ca-file={p.ca_crt}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    "--profiling=false",
                    "--node-monitor-grace-period=20s",
                    "--v=1",
                ],
                self.root / "kube-controller-manager.log",
            ).start()
            self.procs.append(cm)
        if scheduler:
            self.procs.append(self.start_scheduler("kube-scheduler"))

    def restart_apiserver(self) -> None:
        """Stop the API server and start it again on the same port and etcd: its watch cache
        starts over at the current revision, so a watch from an older resourceVersion is
        answered 410 Gone, as after any API server restart."""
        old = next(p for p in self.procs if p.name == "kube-apiserver")
        old.stop()
        new = Proc(old.name, old.argv, old.log).start()
        self.procs[self.procs.index(old)] = new
        assert self.pki is not None
        ca, token = self.pki.ca_crt, self.tokens[ADMIN]
        new.wait_until(lambda: https_ok(f"{self.url}/readyz", ca, token), 60, "/readyz")

    def start_scheduler(self, name: str, config: str | None = None, *extra: str) -> Proc:
        """A kube-scheduler process (``config``: a KubeSchedulerConfiguration's YAML, for
        profiles or extenders); the caller stops it, or :meth:`stop` does."""
        argv = [
            self.assets.path("kube-scheduler"),
            f"--kubeconfig={self.kubeconfig(SCHEDULER)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--profiling=false",
            "--v=1",
            *extra,
        ]
        if config is not None:
            path = self.root / f"{name}.yaml"
            path.write_text(config.replace("KUBECONFIG", str(self.kubeconfig(SCHEDULER))))
            argv = [a for a in argv if not a.startswith(("--kubeconfig", "--leader-elect"))]
            argv.append(f"--config={path}")
        proc = Proc(name, argv, self.root / f"{name}.log").start()
        if proc not in self.procs:
            self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

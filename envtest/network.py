"""The node's network: a bridge of the run's own with the node's address, a CNI configuration
for containerd (bridge + host-local, routes to the pod and Service ranges only, no masquerade:
a pod has no default route), and the one Service rule pods need.

kube-proxy is not among ``../shared/k8s``'s binaries. Pods reach the API server as every
in-cluster client does, through the ``kubernetes`` Service's ClusterIP; :class:`Network` stands
in for kube-proxy with a DNAT rule from that ClusterIP to the API server (in a chain of its own,
jumped to from ``nat`` PREROUTING and OUTPUT), and routes the Service range to the bridge so a
packet for a Service never takes the host's default route. Admission webhooks need no rule: the
API server dials their Services' endpoints (``--enable-aggregator-routing``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out


def _free_second_octet() -> int:
    """A 10.N.0.0/16 that no address or route of this host overlaps."""
    used = (
        _run("ip", "-4", "route", "show", "table", "all").stdout + _run("ip", "-4", "addr").stdout
    )
    nets = []
    for word in used.split():
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(word, strict=False))
    for n in range(200, 250):
        cand = ipaddress.ip_network(f"10.{n}.0.0/16")
        if not any(cand.overlaps(net) for net in nets if net.prefixlen > 0):
            return n
    raise RuntimeError("no free 10.N.0.0/16 for the test cluster's bridge")


@dataclass
class Network:
    """:meth:`up`, then :meth:`down` (always)."""

    root: Path
    name: str = field(default_factory=lambda: f"kt{uuid.uuid4().hex[:8]}")
    octet: int = 0
    _rules: list[list[str]] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The node's address (the bridge's)."""
        return f"10.{self.octet}.0.1"

    @property
    def pod_cidr(self) -> str:
        return f"10.{self.octet}.0.0/17"

    @property
    def service_cidr(self) -> str:
        return f"10.{self.octet}.200.0/24"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"10.{self.octet}.200.1"

    @property
    def chain(self) -> str:
        return f"KOORDTEST-{self.name.upper()}"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "conf"

    def up(self) -> None:
        self.octet = self.octet or _free_second_octet()
        _run("ip", "link", "add", self.name, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/17", "dev", self.name)
        _run("ip", "link", "set", self.name, "up")
        _run("ip", "route", "add", self.service_cidr, "dev", self.name, "src", self.gateway)
        self.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "cniVersion": "0.4.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.name,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr, "gateway": self.gateway}]],
                        "routes": [{"dst": self.pod_cidr}, {"dst": self.service_cidr}],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                }
            ],
        }
        (self.cni_conf_dir / "10-koordtest.conflist").write_text(json.dumps(conf, indent=2))

    def route_service(self, cluster_ip: str, port: int, to_ip: str, to_port: int) -> None:
        """A ClusterIP:port answered by ``to_ip:to_port`` (kube-proxy's DNAT, for one endpoint)."""
        if not self._rules:
            _run("iptables", "-w", "-t", "nat", "-N", self.chain)
            for hook in ("PREROUTING", "OUTPUT"):
                _run("iptables", "-w", "-t", "nat", "-I", hook,
                     "-d", self.service_cidr, "-j", self.chain)  # fmt: skip
                self._rules.append([hook])
        _run(
            "iptables", "-w", "-t", "nat", "-A", self.chain, "-d", cluster_ip, "-p", "tcp",
            "--dport", str(port), "-j", "DNAT", "--to-destination", f"{to_ip}:{to_port}",
        )  # fmt: skip

    def down(self) -> None:
        """Remove the rules, the route and the bridge; never raises (also for a network of a
        killed run, known by its name only)."""
        rules = _run("iptables", "-w", "-t", "nat", "-S", check=False).stdout.splitlines()
        for rule in rules:
            words = rule.split()
            if rule.startswith("-A ") and words[-1] == self.chain and words[1] != self.chain:
                _run("iptables", "-w", "-t", "nat", "-D", *words[1:], check=False)
        if f"-N {self.chain}" in rules:
            _run("iptables", "-w", "-t", "nat", "-F", self.chain, check=False)
            _run("iptables", "-w", "-t", "nat", "-X", self.chain, check=False)
        self._rules.clear()
        # veths the bridge plugin left (a sandbox torn down without its CNI DEL)
        for line in _run(
            "ip", "-o", "link", "show", "master", self.name, check=False
        ).stdout.splitlines():
            dev = line.split(":")[1].strip().split("@")[0]
            _run("ip", "link", "del", dev, check=False)
        _run("ip", "route", "del", self.service_cidr, "dev", self.name, check=False)
        _run("ip", "link", "del", self.name, check=False)

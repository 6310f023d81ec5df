"""The real nodes themselves, before any of Koordinator: each kubelet Ready with its pods'
cgroups under its own cgroup root; a pod has routes to the pod and Service ranges only (no
default route: nothing it sends can leave the machine), the bridge as its DNS server, and
reaches the API server through the ``kubernetes`` Service's ClusterIP (the DNAT rule that
stands in for kube-proxy) with its ServiceAccount's token."""

from __future__ import annotations

import json

import pytest

from envtest.cluster import Cluster
from envtest.workloads import delete_pods, pod, wait_running

pytestmark = pytest.mark.timeout(180)

SCRIPT = (
    "ip route; echo ---; cat /etc/resolv.conf; echo ---; "
    "wget -q -O- --no-check-certificate "
    '--header "Authorization: Bearer $(cat /var/run/secrets/kubernetes.io/serviceaccount/token)" '
    "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version; echo; echo ---; "
    "sleep 3600"
)


def test_every_node_is_ready_with_its_own_cgroup_root(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.get("nodes")["items"]}
    assert set(nodes) == {n.name for n in cluster.node_list}
    for node in cluster.node_list:
        assert cluster.node_ready(node.name)
        for qos in ("", "burstable", "besteffort"):
            assert node.cgroup("cpu", "kubepods", qos).is_dir()


def test_a_pod_has_no_way_off_the_machine_and_reaches_the_api_server_through_its_service(
    cluster: Cluster,
) -> None:
    assert cluster.network is not None
    net = cluster.network
    cluster.kubectl("create", "namespace", "probe", check=False)
    cluster.apply(json.dumps(pod("probe", namespace="probe", command=SCRIPT)))
    try:
        wait_running(cluster, "probe", "probe")
        out = cluster.wait_for(
            "the probe's output",
            lambda: (o := cluster.kubectl("logs", "probe", "-n", "probe")).count("---") >= 3 and o,
            60,
        )
    finally:
        delete_pods(cluster, "probe", namespace="probe")
    routes, resolv, version, _ = out.split("---")
    assert "default" not in routes
    assert net.pod_cidr in routes
    assert net.service_cidr in routes
    assert f"nameserver {net.gateway}" in resolv
    assert json.loads(version)["gitVersion"] == "v1.25.0-alpha.2"

"""The node's ``network-bandwidth`` annotation in its NodeSLO.

The table is upstream's ``Test_getSystemConfigSpec``
(``pkg/slo-controller/nodeslo/resource_strategy_test.go``) and ``TestGetNodeTotalBandwidth``
(``apis/extension/node_qos_test.go``): the annotation, a quantity, takes precedence over the
cluster's and the node strategy's ``totalNetworkBandwidth``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from apis.configuration import SYSTEM_CONFIG_KEY
from apis.manager_keys import ANNOTATION_NODE_BANDWIDTH
from kubeclient.client import KubeClient
from manager.slo.config import node_bandwidth, parse_key, render
from manager.slo.controller import REASON_INVALID_BANDWIDTH, NodeSLOController
from tests.kubefake import FakeApiServer
from tests.manager.builders import config_map, node
from tests.manager.conftest import eventually

CLUSTER_ONLY = {"clusterStrategy": {"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "10G"}}
WITH_NODES = {
    "clusterStrategy": {"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "100M"},
    "nodeStrategies": [
        {
            "name": "xxx",
            "nodeSelector": {"matchLabels": {"xxx": "yyy"}},
            "minFreeKbytesFactor": 120,
            "totalNetworkBandwidth": "10M",
        },
        {
            "name": "zzz",
            "nodeSelector": {"matchLabels": {"zzz": "zzz"}},
            "minFreeKbytesFactor": 130,
            "totalNetworkBandwidth": "1000M",
        },
    ],
}


def system(cfg: dict[str, Any] | None, labels: dict[str, str], annotations: dict[str, str]) -> Any:
    keys = {}
    if cfg is not None:
        keys[SYSTEM_CONFIG_KEY] = parse_key(SYSTEM_CONFIG_KEY, json.dumps(cfg), "cm")
    rendered = render(keys, labels, annotations)
    return rendered.spec["systemStrategy"], rendered.bandwidth_error


@pytest.mark.parametrize(
    ("case", "cfg", "labels", "annotations", "factor", "bandwidth"),
    [
        ("node invalid, use cluster config (defaults)", None, {}, {}, None, "0"),
        ("get cluster config correctly", CLUSTER_ONLY, {}, {}, 150, "10G"),
        ("get node config correctly", WITH_NODES, {"zzz": "zzz"}, {}, 130, "1000M"),
        ("get firstly-matched node config", WITH_NODES, {"xxx": "yyy"}, {}, 120, "10M"),
        (
            "use node-wise bandwidth config while use cluster strategy",
            CLUSTER_ONLY,
            {},
            {ANNOTATION_NODE_BANDWIDTH: "99M"},
            150,
            "99M",
        ),
        (
            "use node-wise bandwidth config while use node strategy",
            WITH_NODES,
            {"zzz": "zzz"},
            {ANNOTATION_NODE_BANDWIDTH: "99M"},
            130,
            "99M",
        ),
    ],
)
def test_upstream_system_config_spec_table(
    case: str,
    cfg: dict[str, Any] | None,
    labels: dict[str, str],
    annotations: dict[str, str],
    factor: int | None,
    bandwidth: str,
) -> None:
    got, error = system(cfg, labels, annotations)
    assert got.get("minFreeKbytesFactor") == factor, case
    assert got["totalNetworkBandwidth"] == bandwidth, case
    assert error == ""


def test_the_annotation_reads_as_a_quantity_in_canonical_form() -> None:
    """``TestGetNodeTotalBandwidth``: "10M" is 10 x 10^6; none is None; "wrong-format" fails."""
    assert node_bandwidth({ANNOTATION_NODE_BANDWIDTH: "10M"}) == "10M"
    assert node_bandwidth({ANNOTATION_NODE_BANDWIDTH: "10000000"}) == "10M"
    assert node_bandwidth({}) is None
    with pytest.raises(ValueError, match=ANNOTATION_NODE_BANDWIDTH):
        node_bandwidth({ANNOTATION_NODE_BANDWIDTH: "wrong-format"})


def test_a_bad_annotation_keeps_the_configured_bandwidth_and_says_why() -> None:
    got, error = system(CLUSTER_ONLY, {}, {ANNOTATION_NODE_BANDWIDTH: "wrong-format"})
    assert got["totalNetworkBandwidth"] == "10G"
    assert ANNOTATION_NODE_BANDWIDTH in error
    assert "wrong-format" in error


async def test_the_controller_writes_the_annotated_bandwidth_and_reports_a_bad_one(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("n-fast", annotations={ANNOTATION_NODE_BANDWIDTH: "25G"}))
    kube_api.put("nodes", node("n-bad", annotations={ANNOTATION_NODE_BANDWIDTH: "fast"}))
    kube_api.put("nodes", node("n-plain"))
    kube_api.put("configmaps", config_map(system_config=CLUSTER_ONLY))
    ctrl = NodeSLOController(kube_client, resync_seconds=3600)
    task = asyncio.create_task(ctrl.run(sync_timeout=5), name="nodeslo")
    try:
        await eventually(
            lambda: all(kube_api.get("nodeslos", n) for n in ("n-fast", "n-bad", "n-plain"))
        )
        await eventually(lambda: bool(kube_api.writes("POST", "/events")))
        bandwidth = {
            n: kube_api.get("nodeslos", n)["spec"]["systemStrategy"]["totalNetworkBandwidth"]
            for n in ("n-fast", "n-bad", "n-plain")
        }
        assert bandwidth == {"n-fast": "25G", "n-bad": "10G", "n-plain": "10G"}
        # the annotation is fixed: the node's NodeSLO follows
        kube_api.put("nodes", node("n-bad", annotations={ANNOTATION_NODE_BANDWIDTH: "1G"}))
        await eventually(
            lambda: (
                kube_api.get("nodeslos", "n-bad")["spec"]["systemStrategy"]["totalNetworkBandwidth"]
                == "1G"
            )
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    events = [w.body for w in kube_api.writes("POST", "/events")]
    assert len(events) == 1  # once per bad value, not at every reconcile
    assert events[0]["reason"] == REASON_INVALID_BANDWIDTH
    assert events[0]["involvedObject"]["kind"] == "Node"
    assert events[0]["involvedObject"]["name"] == "n-bad"
    assert events[0]["metadata"]["namespace"] == "default"
    assert "'fast'" in events[0]["message"]

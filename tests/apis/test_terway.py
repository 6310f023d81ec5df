"""terway-qos's files: the formula and formats of Koordinator's ``TerwayQoS`` hook, checked on
the cases of upstream's own tests (``pkg/koordlet/runtimehooks/hooks/terwayqos/terwayqos_test.go``)
and read back the way terway-qos reads them (``pkg/config/config.go``, ``parseConfig``)."""

from __future__ import annotations

from typing import Any

import pytest

from apis.extension import LABEL_POD_QOS, KubeQOS
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS, AnnotationError
from apis.slo import SchemaError
from apis.terway import (
    GlobalBpsConfig,
    TerwayPod,
    global_bps_config,
    net_cls_dir,
    parse_pod_config,
    pod_bandwidth,
    pod_config_text,
    pod_prio,
)
from tests.strategyrig import in_force

M = 1_000_000


def config(qos: dict[str, Any], total: str = "100M") -> GlobalBpsConfig:
    slo = in_force(resourceQOSStrategy=qos, systemStrategy={"totalNetworkBandwidth": total})
    return global_bps_config(slo.resource_qos_strategy, slo.system_strategy.total_network_bandwidth)


def net(**fields: Any) -> dict[str, Any]:
    return {"networkQOS": {"enable": True, **fields}}


def test_upstreams_parse_net_qos_case() -> None:
    # TestParseNetQoS: 100M in total, LS at 10M everywhere, BE at 20M: bytes per second
    ten, twenty = (
        {"ingressRequest": v, "ingressLimit": v, "egressRequest": v, "egressLimit": v}
        for v in ("10M", "20M")
    )
    got = config({"lsClass": net(**ten), "beClass": net(**twenty)})
    assert got.hw_rx_bps_max == got.hw_tx_bps_max == 100 * M // 8
    assert got.offline_l1_tx_bps_min == got.offline_l1_tx_bps_max == 10 * M // 8
    assert got.offline_l1_rx_bps_min == got.offline_l1_rx_bps_max == 10 * M // 8
    assert got.offline_l2_tx_bps_min == got.offline_l2_tx_bps_max == 20 * M // 8
    assert got.offline_l2_rx_bps_min == got.offline_l2_rx_bps_max == 20 * M // 8


def test_a_percent_is_of_the_total_and_written_in_bytes() -> None:
    """Ours: 50 % of a 100 bit/s node is 50 bit/s, 6 byte/s. Upstream's parseQuantity leaves the
    percent branch in bits (TestParseQuantityWithIntType wants 50), 8 times what the same
    bandwidth is as a quantity, which terway-qos reads as bytes."""
    got = config({"beClass": net(egressLimit=50, egressRequest="40")}, total="100")
    assert got.offline_l2_tx_bps_max == 6
    # TestParseQuantityWithStringTypeAndValidValue: "40" of 100 is 40 bits, 5 bytes
    assert got.offline_l2_tx_bps_min == 5


@pytest.mark.parametrize(
    ("qos", "total", "field"),
    [
        # TestParseQuantityWithStringTypeAndValueExceedingTotal: "808" of 100 is refused (ours
        # compares bits with bits; upstream compares the bytes with the bits)
        ({"beClass": net(egressLimit="808")}, "100", "beClass.networkQOS.egressLimit"),
        ({"lsClass": net(ingressLimit="2G")}, "1G", "lsClass.networkQOS.ingressLimit"),
        ({"lsClass": net(egressRequest=150)}, "1G", "lsClass.networkQOS.egressRequest"),
        ({"beClass": net(ingressRequest="fast")}, "1G", "beClass.networkQOS.ingressRequest"),
        ({"beClass": net(egressLimit="1M")}, "0", "beClass.networkQOS.egressLimit"),
    ],
)
def test_a_value_that_cannot_be_applied_names_its_field(
    qos: dict[str, Any], total: str, field: str
) -> None:
    with pytest.raises(SchemaError) as err:
        config(qos, total)
    assert err.value.field == f"spec.resourceQOSStrategy.{field}"


def test_a_disabled_class_and_the_default_total_give_zeros() -> None:
    # parseQoS with Enable false, and parseNetQoS with the total's default 0
    got = config({"lsClass": {"networkQOS": {"enable": False, "egressLimit": "10M"}}})
    assert got.offline_l1_tx_bps_max == 0
    assert config({"beClass": net()}, total="0") == GlobalBpsConfig()


def test_global_bps_config_reads_back_as_terway_qos_reads_it() -> None:
    got = config({"lsClass": net(egressRequest="10M"), "beClass": net(ingressLimit=20)}, "1G")
    text = got.to_text()
    assert text.splitlines()[0] == "hw_tx_bps_max 125000000"
    assert text.endswith("offline_l2_rx_bps_max 25000000\n")
    assert GlobalBpsConfig.from_text(text) == got
    # terway-qos's regex takes name=value too, and a name absent is 0
    assert GlobalBpsConfig.from_text("hw_rx_bps_max=7\n").hw_rx_bps_max == 7
    assert GlobalBpsConfig.from_text("").offline_l1_tx_bps_min == 0


@pytest.mark.parametrize(
    ("labels", "kube_qos", "prio"),
    [
        ({LABEL_POD_QOS: "BE"}, KubeQOS.GUARANTEED, 2),  # TestPodPriorityWithExistingLabel
        ({LABEL_POD_QOS: "SYSTEM"}, KubeQOS.BESTEFFORT, 0),
        ({LABEL_POD_QOS: "LSE"}, None, 1),
        ({}, KubeQOS.GUARANTEED, 1),  # TestPodPriorityWithQOSGuaranteed
        ({}, KubeQOS.BURSTABLE, 1),
        ({}, KubeQOS.BESTEFFORT, 2),
        ({LABEL_POD_QOS: "weird"}, None, 0),  # TestPodPriorityWithNoQOSClass
    ],
)
def test_a_pods_level_is_upstreams_get_pod_prio(
    labels: dict[str, str], kube_qos: KubeQOS | None, prio: int
) -> None:
    assert pod_prio(labels, kube_qos) == prio


def test_a_pods_limits_are_its_annotation_in_bytes() -> None:
    # TestGetPodQoSWithValidAnnotation: Go matches the keys case-insensitively; bits / 8
    value = '{"IngressLimit": "1000", "EgressLimit": "2000"}'
    assert pod_bandwidth({ANNOTATION_POD_NETWORK_QOS: value}) == (125, 250)
    assert pod_bandwidth({}) == (0, 0)  # TestGetPodQoSWithNoAnnotation
    with pytest.raises(AnnotationError, match="ingressLimit 'invalid'"):
        pod_bandwidth({ANNOTATION_POD_NETWORK_QOS: '{"IngressLimit": "invalid"}'})


def test_pod_json_is_gos_marshal_of_the_map_by_uid() -> None:
    pods = [
        TerwayPod("b", "ns", "uid-b", 2, net_cls_dir("/kubepods/besteffort/podb/"), 0, 125),
        TerwayPod("a<&>", "ns", "uid-a", 1, net_cls_dir("kubepods.slice/x.slice"), 1, 0),
    ]
    text = pod_config_text(pods)
    assert text == (
        '{"uid-a":{"podName":"a\\u003c\\u0026\\u003e","podNamespace":"ns","podUID":"uid-a",'
        '"prio":1,"cgroupDir":"/sys/fs/cgroup/net_cls/kubepods.slice/x.slice",'
        '"qosConfig":{"ingressBandwidth":1,"egressBandwidth":0}},'
        '"uid-b":{"podName":"b","podNamespace":"ns","podUID":"uid-b","prio":2,'
        '"cgroupDir":"/sys/fs/cgroup/net_cls/kubepods/besteffort/podb",'
        '"qosConfig":{"ingressBandwidth":0,"egressBandwidth":125}}}'
    )
    assert parse_pod_config(text) == {p.pod_uid: p for p in pods}
    assert pod_config_text([]) == "{}"
    with pytest.raises(ValueError, match="keyed by pod UID"):
        parse_pod_config("[]")

"""The network QoS contract: class ids as upstream's tc plugin names them
(``pkg/koordlet/runtimehooks/hooks/tc``: ``MAJOR_ID`` 1, minors 2/3/4, ``convertToHexClassId``),
``net_cls.classid`` as the kernel reads it (``Documentation/admin-guide/cgroup-v1/net_cls.rst``:
``0xAAAABBBB`` is major ``AAAA``, minor ``BBBB``; ``echo 0x100001`` reads back ``1048577``), the
class of a pod from its label (``GetNetQoSClassByAttrs``) and the bandwidth units
(``getBandwidthVal``: an int is a percent of the total, a string a quantity)."""

from __future__ import annotations

import pytest

from apis.extension import LABEL_POD_QOS, QoSClass
from apis.netqos import (
    ANNOTATION_NODE_NETWORK_BANDWIDTH,
    CLASS_PRIO,
    DEFAULT_CLASS,
    QDISC_HANDLE,
    NetQoSClass,
    bandwidth_bps,
    class_handle,
    class_id_of,
    format_handle,
    net_qos_class,
    node_bandwidth_bps,
    pod_net_qos_class,
)


@pytest.mark.parametrize(
    ("net_class", "upstream_hex", "tc_name"),
    [
        (NetQoSClass.SYSTEM, "0x10002", "1:2"),
        (NetQoSClass.LS, "0x10003", "1:3"),
        (NetQoSClass.BE, "0x10004", "1:4"),
    ],
)
def test_class_ids_are_upstreams_and_what_net_cls_reads_back(
    net_class: NetQoSClass, upstream_hex: str, tc_name: str
) -> None:
    assert class_id_of(net_class) == int(upstream_hex, 16)
    assert format_handle(class_id_of(net_class)) == tc_name


def test_net_cls_encoding_follows_the_kernel_documentation() -> None:
    # net_cls.rst: 0x100001 is class 10:1 and net_cls.classid then reads 1048577.
    assert (0x10 << 16 | 0x1) == 1048577
    assert format_handle(1048577) == "10:1"
    assert QDISC_HANDLE == 0x10000
    assert class_handle(1) == 0x10001
    with pytest.raises(ValueError, match="outside"):
        class_handle(0x10000)


def test_priorities_favour_system_then_ls_then_be_and_the_default_is_system() -> None:
    assert CLASS_PRIO[NetQoSClass.SYSTEM] < CLASS_PRIO[NetQoSClass.LS] < CLASS_PRIO[NetQoSClass.BE]
    assert DEFAULT_CLASS is NetQoSClass.SYSTEM


@pytest.mark.parametrize(
    ("qos", "expected"),
    [
        (QoSClass.SYSTEM, NetQoSClass.SYSTEM),
        (QoSClass.LSE, NetQoSClass.LS),
        (QoSClass.LSR, NetQoSClass.LS),
        (QoSClass.LS, NetQoSClass.LS),
        (QoSClass.BE, NetQoSClass.BE),
        (QoSClass.NONE, None),
    ],
)
def test_qos_class_maps_to_its_network_class(qos: QoSClass, expected: NetQoSClass | None) -> None:
    assert net_qos_class(qos) is expected


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({LABEL_POD_QOS: "BE"}, NetQoSClass.BE),
        ({LABEL_POD_QOS: "LSR"}, NetQoSClass.LS),
        ({LABEL_POD_QOS: "SYSTEM"}, NetQoSClass.SYSTEM),
        ({}, None),
        ({LABEL_POD_QOS: "gold"}, None),
        ({"app": "be"}, None),
    ],
)
def test_a_pods_class_comes_from_its_qos_label_only(
    labels: dict[str, str], expected: NetQoSClass | None
) -> None:
    assert pod_net_qos_class(labels) is expected


@pytest.mark.parametrize(
    ("value", "total", "bps"),
    [
        (0, 1_000_000_000, 0),
        (30, 1_000_000_000, 300_000_000),
        (100, 1_000_000_000, 1_000_000_000),
        (33, 10, 3),  # integer arithmetic, as upstream's total * percent / 100 on uint64
        ("50M", 1_000_000_000, 50_000_000),
        ("1G", 0, 1_000_000_000),
        ("1Gi", 0, 1 << 30),
        ("0", 1_000_000_000, 0),
    ],
)
def test_bandwidth_is_a_percent_of_the_total_or_a_quantity_in_bits(
    value: int | str, total: int, bps: int
) -> None:
    assert bandwidth_bps(value, total) == bps


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (101, "percent 101 outside 0..100"),
        (-1, "percent -1 outside 0..100"),
        ("fast", "'fast' is not a quantity"),
        ("-5M", "is negative"),
        (True, "not a percent or a quantity"),
    ],
)
def test_a_bad_bandwidth_names_the_field(value: int | str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        bandwidth_bps(value, 1000, field="beClass.networkQOS.egressLimit")
    assert str(err.value).startswith("beClass.networkQOS.egressLimit: ")


def test_node_bandwidth_annotation_is_upstreams_key_in_bits_per_second() -> None:
    assert ANNOTATION_NODE_NETWORK_BANDWIDTH == "node.koordinator.sh/network-bandwidth"
    assert node_bandwidth_bps({}) is None
    assert node_bandwidth_bps({ANNOTATION_NODE_NETWORK_BANDWIDTH: "10G"}) == 10_000_000_000
    for bad in ("ten", "0", "-1G"):
        with pytest.raises(ValueError, match=ANNOTATION_NODE_NETWORK_BANDWIDTH):
            node_bandwidth_bps({ANNOTATION_NODE_NETWORK_BANDWIDTH: bad})

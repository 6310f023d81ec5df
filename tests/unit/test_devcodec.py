"""The per-device blkio/io files: their formats as the kernel documents and prints them, and the
property that matters to the writer: writing the encoded lines one at a time over *any* current
file leaves exactly the value in it.

The models below replay what the kernel does with each ``write(2)``
(``Documentation/admin-guide/cgroup-v1/blkio-controller.rst``: a throttle line ``MAJ:MIN 0``
removes the rule; ``Documentation/admin-guide/cgroup-v2.rst``, "IO Interface Files": ``io.max``
keys ``rbps wbps riops wiops`` with ``max`` for none, ``io.weight``/``io.bfq.weight`` per-device
``MAJ:MIN W`` with ``MAJ:MIN default`` to reset, ``io.latency`` ``target=``, ``io.cost.qos``
``enable=0|1 ctrl=auto|user rpct rlat wpct wlat min max``). The texts in the format tests are what
the kernel prints (the v1 throttle file captured on this machine's kernel, the v2 ones from the
document's examples).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordlet.errors import InvalidValueError, ParseError
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.devcodec import canonical_param, device_key
from koordlet.system.knobs import (
    BLKIO_BFQ_WEIGHT,
    BLKIO_COST_MODEL,
    BLKIO_COST_QOS,
    BLKIO_COST_WEIGHT,
    BLKIO_IO_LATENCY,
    BLKIO_READ_BPS,
    BLKIO_READ_IOPS,
    BLKIO_WRITE_BPS,
    Knob,
)

V1, V2 = CgroupVersion.V1, CgroupVersion.V2
DEVICES = st.builds(lambda a, b: f"{a}:{b}", st.integers(1, 9), st.integers(0, 3))

# Kernel models --------------------------------------------------------------------------------


def throttle_v1(state: dict[str, int], line: str) -> None:
    dev, value = line.split()
    if int(value) == 0:
        state.pop(dev, None)
    else:
        state[dev] = int(value)


def show_throttle_v1(state: dict[str, int]) -> str:
    return "".join(f"{d} {v}\n" for d, v in state.items())


def weights(state: dict[str, int], line: str) -> None:
    dev, value = line.split()
    if value == "default":
        state.pop(dev, None)
    else:
        state[dev] = int(value)


def show_weights(state: dict[str, int]) -> str:
    return "default 100\n" + "".join(f"{d} {v}\n" for d, v in state.items())


IO_MAX_KEYS = ("rbps", "wbps", "riops", "wiops")


def io_max(state: dict[str, dict[str, str]], line: str) -> None:
    dev, *items = line.split()
    entry = state.setdefault(dev, dict.fromkeys(IO_MAX_KEYS, "max"))
    for item in items:
        key, _, value = item.partition("=")
        entry[key] = value
    if all(v == "max" for v in entry.values()):
        del state[dev]


def show_io_max(state: dict[str, dict[str, str]]) -> str:
    return "".join(
        f"{d} " + " ".join(f"{k}={e[k]}" for k in IO_MAX_KEYS) + "\n" for d, e in state.items()
    )


def io_cost_qos(state: dict[str, dict[str, str]], line: str) -> None:
    dev, *items = line.split()
    entry = state.setdefault(
        dev,
        {"enable": "0", "ctrl": "auto", "rpct": "0.00", "rlat": "250000", "wpct": "0.00",
         "wlat": "250000", "min": "1.00", "max": "10000.00"},
    )  # fmt: skip
    for item in items:
        key, _, value = item.partition("=")
        entry[key] = f"{float(value):.2f}" if key in ("rpct", "wpct") else value


def show_io_cost_qos(state: dict[str, dict[str, str]]) -> str:
    return "".join(
        f"{d} " + " ".join(f"{k}={v}" for k, v in e.items()) + "\n" for d, e in state.items()
    )


MODELS: dict[str, tuple[Callable[[Any, str], None], Callable[[Any], str], Any]] = {
    "v1-throttle": (throttle_v1, show_throttle_v1, st.integers(1, 10**9)),
    "weights": (weights, show_weights, st.integers(1, 1000)),
    "io.max": (io_max, show_io_max, st.integers(1, 10**9)),
}


@pytest.mark.parametrize(
    ("knob", "version", "model"),
    [
        (BLKIO_READ_BPS, V1, "v1-throttle"),
        (BLKIO_READ_IOPS, V1, "v1-throttle"),
        (BLKIO_BFQ_WEIGHT, V1, "weights"),
        (BLKIO_BFQ_WEIGHT, V2, "weights"),
        (BLKIO_COST_WEIGHT, V2, "weights"),
        (BLKIO_READ_BPS, V2, "io.max"),
        (BLKIO_WRITE_BPS, V2, "io.max"),
        (BLKIO_READ_IOPS, V2, "io.max"),
    ],
)
@given(data=st.data())
def test_writing_the_encoded_lines_over_any_file_leaves_exactly_the_value(
    knob: Knob[Any], version: CgroupVersion, model: str, data: st.DataObject
) -> None:
    apply, show, values = MODELS[model]
    state: Any = {}
    for line in data.draw(st.lists(st.tuples(DEVICES, values), max_size=4)):
        if model == "io.max":
            key = data.draw(st.sampled_from(IO_MAX_KEYS))
            apply(state, f"{line[0]} {key}={line[1]}")
        else:
            apply(state, f"{line[0]} {line[1]}")
    before = show(state)
    value = knob.validate(data.draw(st.dictionaries(DEVICES, values, max_size=4)))
    for line in knob.encode(value, version, before).splitlines():
        apply(state, line)
    assert knob.decode(show(state), version) == value
    if model == "io.max":  # the other three keys of each device are untouched
        other = {k for k in IO_MAX_KEYS if k != knob.codec.v2.key}  # type: ignore[attr-defined]
        before_state: Any = {}
        for line in before.splitlines():
            io_max(before_state, line)
        for dev, entry in before_state.items():
            for key in other:
                assert state.get(dev, {}).get(key, "max") == entry[key]


@given(data=st.data())
def test_iocost_qos_written_over_any_file_leaves_the_value_and_disables_the_rest(
    data: st.DataObject,
) -> None:
    state: dict[str, dict[str, str]] = {}
    for dev in data.draw(st.lists(DEVICES, max_size=3)):
        io_cost_qos(state, f"{dev} enable=1 ctrl=user rpct=90 rlat=1000 wpct=90 wlat=2000")
    qos = {
        "enable": "1",
        "ctrl": "user",
        "rpct": "95",
        "rlat": "3000",
        "wpct": "95",
        "wlat": "3000",
    }
    value = BLKIO_COST_QOS.validate(dict.fromkeys(data.draw(st.lists(DEVICES, max_size=3)), qos))
    for line in BLKIO_COST_QOS.encode(value, V2, show_io_cost_qos(state)).splitlines():
        io_cost_qos(state, line)
    assert BLKIO_COST_QOS.decode(show_io_cost_qos(state), V2) == value
    assert all(e["enable"] == "0" for d, e in state.items() if d not in value)


# Formats ---------------------------------------------------------------------------------------


def test_v1_throttle_reads_the_kernels_lines_and_writes_zero_to_remove() -> None:
    # /sys/fs/cgroup/blkio/<cg>/blkio.throttle.read_bps_device on Linux 6.18 after two writes.
    text = "7:1 2000000\n7:0 1000000\n"
    assert dict(BLKIO_READ_BPS.decode(text, V1)) == {"7:0": 1000000, "7:1": 2000000}
    assert BLKIO_READ_BPS.encode({"7:1": 3000000}, V1, text) == "7:1 3000000\n7:0 0"


def test_v2_io_max_keeps_one_key_per_knob() -> None:
    text = "8:16 rbps=2097152 wbps=max riops=max wiops=120\n"  # cgroup-v2.rst's example
    assert dict(BLKIO_READ_BPS.decode(text, V2)) == {"8:16": 2097152}
    assert dict(BLKIO_WRITE_BPS.decode(text, V2)) == {}
    assert BLKIO_READ_BPS.encode({}, V2, text) == "8:16 rbps=max"
    assert BLKIO_WRITE_BPS.encode({"8:16": 1 << 20}, V2, text) == "8:16 wbps=1048576"


def test_weights_skip_the_default_line_and_reset_with_default() -> None:
    text = "default 100\n8:16 200\n8:0 50\n"  # io.weight as cgroup-v2.rst shows it
    assert dict(BLKIO_COST_WEIGHT.decode(text, V2)) == {"8:0": 50, "8:16": 200}
    assert BLKIO_COST_WEIGHT.encode({"8:0": 50}, V2, text) == "8:0 50\n8:16 default"


def test_io_latency_targets_use_the_target_key() -> None:
    assert dict(BLKIO_IO_LATENCY.decode("8:16 target=75\n", V2)) == {"8:16": 75}
    assert BLKIO_IO_LATENCY.encode({}, V2, "8:16 target=75\n") == "8:16 target=max"


def test_an_auto_cost_model_counts_as_unset_and_a_user_one_is_reset_to_auto() -> None:
    auto = "8:16 ctrl=auto model=linear rbps=488636629 rseqiops=8932 rrandiops=8518 wbps=427891549 wseqiops=28755 wrandiops=21940\n"  # noqa: E501  (cgroup-v2.rst)
    assert dict(BLKIO_COST_MODEL.decode(auto, V2)) == {}
    user = auto.replace("ctrl=auto", "ctrl=user")
    assert BLKIO_COST_MODEL.decode(user, V2)["8:16"]["rbps"] == "488636629"
    assert BLKIO_COST_MODEL.encode({}, V2, user) == "8:16 ctrl=auto"


def test_cost_qos_percentiles_compare_as_numbers() -> None:
    text = (
        "8:16 enable=1 ctrl=user rpct=95.00 rlat=3000 wpct=95.00 wlat=3000 min=50.00 max=150.00\n"
    )
    want = {"enable": 1, "ctrl": "user", "rpct": 95, "rlat": 3000, "wpct": "95.0", "wlat": 3000}
    assert BLKIO_COST_QOS.decode(text, V2) == BLKIO_COST_QOS.validate({"8:16": want})
    assert canonical_param("99.50") == "99.5"
    assert canonical_param("user") == "user"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"8:16": 0}, "outside 1"),
        ({"sda": 100}, "not a device number"),
        ({"8:16": "100"}, "expected an int"),
        ({(4096, 0): 1}, "12:20-bit"),
    ],
)
def test_bad_device_maps_are_refused_naming_the_knob(value: object, message: str) -> None:
    with pytest.raises(InvalidValueError, match=f"blkio_read_bps.*{message}"):
        BLKIO_READ_BPS.validate(value)


def test_a_none_value_drops_the_device_and_tuples_are_device_numbers() -> None:
    assert dict(BLKIO_READ_BPS.validate({(8, 16): 5, "8:0": None})) == {"8:16": 5}
    assert device_key((253, 16)) == "253:16"


@pytest.mark.parametrize(
    ("knob", "version", "text"),
    [
        (BLKIO_READ_BPS, V1, "8:16\n"),
        (BLKIO_READ_BPS, V1, "sda 100\n"),
        (BLKIO_READ_BPS, V1, "8:16 fast\n"),
        (BLKIO_READ_BPS, V2, "8:16 rbps=fast\n"),
        (BLKIO_COST_QOS, V2, "8:16 enable\n"),
    ],
)
def test_garbage_in_a_device_file_is_a_parse_error_naming_it(
    knob: Knob[Any], version: CgroupVersion, text: str
) -> None:
    with pytest.raises(ParseError, match="/cg/file"):
        knob.decode(text, version, path="/cg/file")

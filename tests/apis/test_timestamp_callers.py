"""Each reader of a Kubernetes timestamp reads through ``apis.timestamp`` and keeps its own rule
for an absent value and its own error type, so its caller's ``except`` still catches it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from apis.errors import FieldError
from apis.nodemetric import parse_node_metric_status
from apis.podmigrationjob import parse_job
from apis.slo import SchemaError
from descheduler.cli import main as descheduler_main
from koordlet.statesinformer.kube import pod_info
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.paths import HostPaths
from scheduler_plugins.errors import InputError as SchedulerInputError
from scheduler_plugins.objectfields import optional_time
from scheduler_plugins.snapshot import parse_pod

GOOD = "2026-11-25T20:47:03Z"
GOOD_EPOCH = datetime(2026, 11, 25, 20, 47, 3, tzinfo=UTC).timestamp()
REFUSED = ["2026-11-25", "2026-11-25 20:47:03Z", "2026-11-25T20:47:03", "2026-11-25T20:47:03+0000"]
"""What the replaced fromisoformat copies read and Go's time.Parse(RFC3339) does not."""


def _job(created: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "creationTimestamp": created},
        "spec": {"podRef": {"namespace": "default", "name": "p"}},
    }


def test_the_nodemetric_update_time_reads_as_a_utc_datetime() -> None:
    status = parse_node_metric_status({"updateTime": GOOD}, "nodemetric n1")
    assert status.update_time == datetime(2026, 11, 25, 20, 47, 3, tzinfo=UTC)
    assert parse_node_metric_status({}, "nodemetric n1").update_time is None


@pytest.mark.parametrize("text", REFUSED)
def test_a_nodemetric_update_time_go_refuses_is_a_schema_error(text: str) -> None:
    with pytest.raises(SchemaError) as caught:
        parse_node_metric_status({"updateTime": text}, "nodemetric n1")
    assert (caught.value.source, caught.value.field) == ("nodemetric n1", "status.updateTime")


def test_a_job_reads_its_creation_time_and_zero_without_one() -> None:
    assert parse_job(_job(GOOD), "pmj j").created == GOOD_EPOCH
    assert parse_job(_job(None), "pmj j").created == 0.0
    assert parse_job(_job(""), "pmj j").created == 0.0
    # a YAML datetime without a zone is UTC (the copy read it in the machine's local time)
    naive = datetime(2026, 11, 25, 20, 47, 3)
    assert parse_job(_job(naive), "pmj j").created == GOOD_EPOCH


@pytest.mark.parametrize("text", [*REFUSED, 1764103623])
def test_a_job_creation_time_go_refuses_is_a_schema_error(text: object) -> None:
    with pytest.raises(SchemaError) as caught:
        parse_job(_job(text), "pmj j")
    assert (caught.value.source, caught.value.field) == ("pmj j", "metadata.creationTimestamp")


def test_the_scheduler_reads_an_optional_time_and_raises_its_input_error() -> None:
    assert optional_time(GOOD, "pod p", "status.startTime") == GOOD_EPOCH
    assert optional_time(None, "pod p", "status.startTime") is None
    assert optional_time("", "pod p", "status.startTime") is None
    for text in REFUSED:
        with pytest.raises(SchedulerInputError) as caught:
            optional_time(text, "pod p", "status.startTime")
        assert isinstance(caught.value, FieldError)
        assert (caught.value.source, caught.value.field) == ("pod p", "status.startTime")


def test_a_pod_is_scheduled_when_its_condition_says_so() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "creationTimestamp": GOOD},
        "spec": {"containers": []},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": GOOD}]
        },
    }
    assert parse_pod(pod, "test").scheduled_at == GOOD_EPOCH


def test_the_koordlet_leaves_a_creation_time_it_cannot_read_unknown() -> None:
    paths = HostPaths("/nonexistent/cgroup", "/nonexistent/proc", "/nonexistent/sys")
    layout = CgroupLayout(paths, CgroupVersion.V1, CgroupDriver.CGROUPFS, "kubepods")
    pod: dict[str, Any] = {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "aaaaaaaa-0000-0000-0000-000000000001",
        },
        "spec": {"containers": []},
        "status": {"qosClass": "BestEffort"},
    }
    pod["metadata"]["creationTimestamp"] = GOOD
    assert pod_info(pod, layout).created_at == GOOD_EPOCH
    pod["metadata"]["creationTimestamp"] = "2026-11-25T20:47:03"  # no zone: Go refuses it
    assert pod_info(pod, layout).created_at is None


@pytest.mark.parametrize("flag_value", ["2026-11-25 20:47:03Z", "tomorrow"])
def test_the_descheduler_refuses_a_now_go_would_refuse(
    flag_value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    code = descheduler_main(["explain", "--snapshot", str(snapshot), "--now", flag_value])
    assert code == 2
    assert "--now: must be an RFC 3339 time (2006-01-02T15:04:05Z)" in capsys.readouterr().err

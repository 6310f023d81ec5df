"""``WriteFailures``: each refused write logged when it starts or its error changes, counted while
it repeats, and logged once more with the count when it goes through."""

from __future__ import annotations

import logging

import pytest

from koordlet.qos.shared import WriteFailures, write_key

LOGGER = "tests.write_failures"


@pytest.fixture
def failures() -> WriteFailures:
    return WriteFailures("cpusuppress", logging.getLogger(LOGGER), clock=lambda: 100.0)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_repeated_refusal_is_logged_once_then_counted_then_logged_with_its_count(
    failures: WriteFailures, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    key = write_key("cpuset_cpus", "/kubepods/besteffort/pod1/")
    for _ in range(60):  # a minute of rounds
        failures.failed(key, "Permission denied")

    assert lines(caplog, logging.WARNING) == [
        "cpusuppress: cpuset_cpus kubepods/besteffort/pod1 refused: Permission denied"
    ]
    assert failures.describe() == {key: {"error": "Permission denied", "count": 60, "since": 100.0}}

    failures.succeeded(key)
    assert lines(caplog, logging.INFO) == [
        "cpusuppress: cpuset_cpus kubepods/besteffort/pod1 written again after 60 refusals "
        "(Permission denied)"
    ]
    assert len(failures) == 0


def test_a_changed_error_is_logged_again_with_the_previous_count(
    failures: WriteFailures, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    failures.failed("k", "Invalid argument")
    failures.failed("k", "Invalid argument")
    failures.failed("k", "Device or resource busy")

    assert len(lines(caplog, logging.WARNING)) == 2
    assert "before, 2 times: Invalid argument" in lines(caplog, logging.WARNING)[1]
    assert failures.describe()["k"]["count"] == 1


def test_settle_records_a_batch_and_forget_drops_gone_cgroups_silently(
    failures: WriteFailures, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    failures.settle(["a", "b", "c"], {"b": "Invalid argument", "c": "Invalid argument"})
    assert set(failures.describe()) == {"b", "c"}
    failures.settle(["b"], {})
    failures.forget(["c"])

    assert len(failures) == 0
    assert len(lines(caplog, logging.INFO)) == 1  # b recovered; c's cgroup went away

"""The real ``koordlet`` process with the interference collectors on: node PSI in ``/metrics``
from this machine's ``/proc/pressure``, and every interference source in ``/debug/capabilities``
with an honest verdict (CPI refused with the kernel's errno on this PMU-less VM)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.daemon import one_value
from tests.daemon.test_daemon_process import Proc, koordlet, launcher

pytestmark = pytest.mark.daemon

GATES = "--feature-gates=PSICollector=true,CPICollector=true,ColdPageCollector=true"


def node_psi(proc: Proc) -> float | None:
    return one_value(
        proc.samples(),
        "koordlet_node_psi",
        psi_resource_type="mem",  # upstream label value
        psi_degree="some",
        psi_precision="avg10",
    )


@pytest.mark.skipif(not os.path.exists("/proc/pressure/memory"), reason="kernel without PSI")
def test_node_psi_is_exported_and_each_interference_source_says_why_or_why_not(
    tmp_path: Path,
) -> None:
    args = [
        "--standalone",
        "--nodeslo-file",
        "",
        "--state-dir",
        str(tmp_path / "state"),
        "--psi-collector-interval-seconds",
        "1",
        GATES,
    ]
    with koordlet(launcher(script=False), args, tmp_path) as proc:
        proc.until("node memory PSI exported", lambda: node_psi(proc) is not None)
        caps = proc.json("/debug/capabilities")
        code = proc.stop()

    assert code == 0
    with open("/proc/pressure/memory") as f:
        assert f.readline().startswith("some avg10=")
    assert caps["psi_node"]["supported"] is True
    for name in ("perf_cpi", "psi_cgroup", "psi_trigger", "memcg_threshold", "idle_page_stats"):
        verdict = caps[name]
        assert isinstance(verdict["supported"], bool), name
        assert verdict["reason"], f"{name} has no reason"
    cpi = caps["perf_cpi"]
    if not cpi["supported"]:  # no PMU here: the kernel's errno is named
        assert re.search(r"\b(E[A-Z]+) \(", cpi["reason"]), cpi["reason"]
        assert caps["collector/cpi/perf_cpi"]["supported"] is False

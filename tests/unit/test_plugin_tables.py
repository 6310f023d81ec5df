"""The plugin tables name their factories by reference (koordlet.plugins): importing the daemon
imports no plugin whose gate is off, a start imports the enabled rows only, and enabling a gate
imports and runs the plugin. Module imports are process-wide, so the import checks run in a fresh
interpreter."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from koordlet.collectors.framework import CollectorContext, CollectorSpec
from koordlet.collectors.table import COLLECTORS, build_collectors
from koordlet.config import KoordletConfig
from koordlet.features import KOORDLET_FEATURES
from koordlet.plugins import load, module_of, resolve
from koordlet.qos.table import STRATEGIES
from koordlet.runtimehooks.table import HOOKS
from tests.fakehost import FakeHost
from tests.freshinterp import run_json

DEFAULTS = KoordletConfig(node_name="n")

ROWS: list[tuple[str, str, Any]] = [
    *(("collector", spec.name, spec) for spec in COLLECTORS),
    *(("strategy", spec.name, spec) for spec in STRATEGIES),
    *(("hook", spec.name, spec) for spec in HOOKS.values()),
]


def _module(spec: Any) -> str:
    module = module_of(spec.factory)
    assert module is not None, f"row {spec.name} holds a callable, not a reference"
    return module


def _enabled_by_default(kind: str, spec: Any) -> bool:
    if kind == "hook":
        return DEFAULTS.feature_gates.enabled(spec.gate)
    return bool(spec.enabled(DEFAULTS))


@pytest.mark.parametrize(("kind", "name", "spec"), ROWS, ids=[f"{k}-{n}" for k, n, _ in ROWS])
def test_each_row_names_its_module_build_whose_constants_agree_with_the_row(
    kind: str, name: str, spec: Any
) -> None:
    module = _module(spec)
    assert spec.factory == f"{module}:build"
    assert callable(load(spec.factory))
    loaded = sys.modules[module]
    if kind != "hook":  # hook rows are named after upstream's plugin, their modules are not
        assert getattr(loaded, "NAME", name) == name
    assert getattr(loaded, "FEATURE_GATE", spec.gate) == spec.gate
    gates = [spec.gate, *getattr(spec, "other_gates", ())]
    assert all(gate in KOORDLET_FEATURES for gate in gates if gate)


def test_importing_the_daemon_imports_no_disabled_plugin_nor_what_only_a_file_needs() -> None:
    modules = set(
        run_json("import json, sys, koordlet.daemon; print(json.dumps(sorted(sys.modules)))")
    )

    disabled = [(k, spec) for k, _, spec in ROWS if not _enabled_by_default(k, spec)]
    assert {spec.name for _, spec in disabled} >= {
        *("cpi", "psi", "gpu", "coldmemory", "resctrlmon", "nodestorage"),
        *("netqos", "blkio", "cgreconcile", "sysreconcile", "memoryevict", "cpuevict"),
        *("CoreSched", "TCNetworkQoS", "TerwayQoS", "Resctrl", "GPUEnvInject", "OOMScoreAdj"),
    }
    assert sorted(_module(spec) for _, spec in disabled if _module(spec) in modules) == []
    # PyYAML (the first YAML file), difflib (a misspelt flag), the /debug/ui page
    assert {
        "yaml",
        "difflib",
        "koordlet.server.ui",
        "koordlet.runtimehooks.table",
    } & modules == set()


def test_a_default_start_imports_the_enabled_rows_and_a_gate_turned_on_imports_and_runs_its_row(
    tmp_path: Path,
) -> None:
    """Builds the three tables as the daemon does, with Koordinator's default gates and then with
    PSICollector, BEMemoryEvict and CoreSched on; the PSI collector then steps over a fake node."""
    result = run_json(
        f"""
        import json, sys
        from koordlet.collectors.framework import CollectorContext
        from koordlet.collectors.runner import CollectorRunner
        from koordlet.collectors.table import build_collectors
        from koordlet.config import KoordletConfig
        from koordlet.features import parse_feature_gates
        from koordlet.metriccache.store import MetricCache
        from koordlet.executor.writer import CgroupWriter
        from koordlet.qos.evictor import CgroupKillEvictor, Evictor
        from koordlet.qos.framework import QoSBook, StrategyContext
        from koordlet.qos.manager import QoSManager
        from koordlet.qos.table import STRATEGIES
        from koordlet.runtimehooks.framework import HookDispatcher
        from koordlet.runtimehooks.metrics import HookMetrics
        from koordlet.runtimehooks.table import HOOKS, HookContext
        from koordlet.statesinformer.model import WorkloadSnapshot
        from koordlet.system.cgroups import CgroupDriver, CgroupVersion
        from prometheus_client import CollectorRegistry
        from tests.fakehost import FakeHost
        from tests.strategyrig import in_force

        class Spawner:
            def __init__(self):
                self.loops = []
            def spawn_loop(self, name, step, interval, *, component):
                self.loops.append(name)
            async def stop(self, timeout=None):
                return ()

        fake = FakeHost({str(tmp_path)!r}, CgroupVersion.V1, CgroupDriver.CGROUPFS)
        out = {{}}
        gated = "PSICollector=true,BEMemoryEvict=true,CoreSched=true"
        for label, gates in (("default", ""), ("gated", gated)):
            cfg = KoordletConfig(node_name="n", feature_gates=parse_feature_gates(gates))
            collectors = build_collectors(CollectorContext(fake.host, cfg))
            spawner = Spawner()
            ctx = StrategyContext(
                host=lambda: fake.host, config=cfg, cache=MetricCache(),
                executor=CgroupWriter(fake.host), workloads=WorkloadSnapshot,
                node_slo=in_force, book=QoSBook(),
                evictor=Evictor(CgroupKillEvictor(lambda: fake.host), dry_run=True),
            )
            QoSManager(ctx, STRATEGIES, spawner).start()
            hooks = HookDispatcher(
                HOOKS, HookContext(node_slo=in_force), enabled=cfg.feature_gates.enabled,
                metrics=HookMetrics(CollectorRegistry()),
            )
            out[label] = {{
                "collectors": [c.name for c in collectors],
                "loops": spawner.loops,
                "hooks": list(hooks.enabled_hooks),
                "modules": sorted(m for m in sys.modules if m.startswith("koordlet.")),
            }}
            if label == "gated":
                runner = CollectorRunner(collectors, MetricCache(), WorkloadSnapshot)
                steps = {{s.name: s for s in runner.run_tick(100.0).steps}}
                psi = steps["psi"]
                out["psi_error"] = repr(psi.error)
                samples = psi.result.samples if psi.result else ()
                out["psi_metrics"] = sorted({{x.key.metric for x in samples}})
        print(json.dumps(out))
        """
    )
    default, gated = result["default"], result["gated"]
    for kind, name, spec in ROWS:
        module = _module(spec)
        assert (module in default["modules"]) == _enabled_by_default(kind, spec), (kind, name)
    assert "psi" not in default["collectors"]
    assert "qos/memoryevict" not in default["loops"]
    assert "CoreSched" not in default["hooks"]

    assert "koordlet.collectors.psi" in gated["modules"]
    assert "psi" in gated["collectors"]
    assert result["psi_error"] == "None"
    assert {"psi_cpu_some_avg10", "psi_mem_full_avg10"} <= set(result["psi_metrics"])
    assert "koordlet.qos.memoryevict" in gated["modules"]
    assert "qos/memoryevict" in gated["loops"]
    assert "koordlet.runtimehooks.coresched" in gated["modules"]
    assert "CoreSched" in gated["hooks"]
    # still out: rows whose gates stayed off
    assert "koordlet.collectors.gpu" not in gated["modules"]
    assert "koordlet.qos.netqos" not in gated["modules"]


def test_a_reference_that_does_not_resolve_fails_where_the_row_is_built(
    fake_host: FakeHost,
) -> None:
    broken = CollectorSpec("x", "koordlet.collectors.nosuchcollector:build", lambda c: 1.0, "-")
    off = dataclasses.replace(broken, gate="CPICollector")

    assert build_collectors(CollectorContext(fake_host.host, DEFAULTS), (off,)) == []
    with pytest.raises(ModuleNotFoundError):  # the daemon's start fails on it, as it did
        build_collectors(CollectorContext(fake_host.host, DEFAULTS), (broken,))
    with pytest.raises(ModuleNotFoundError):
        resolve("koordlet.collectors.nosuchcollector:build")
    with pytest.raises(ImportError, match="has no 'nosuch'"):
        resolve("koordlet.plugins:nosuch")
    with pytest.raises(ValueError, match=r"not 'package\.module:attribute'"):
        resolve("koordlet.plugins")

"""``koord-scheduler explain`` end to end, as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from scheduler_plugins.table import DEFAULT_WEIGHTS
from tests.scheduler.builders import NOW, as_list, node, node_metric, nrt, pod, ts

NOW_TEXT = ts(NOW)


def explain(tmp_path: Path, objects, p, *extra: str, config=None):
    snap = tmp_path / "snapshot.yaml"
    snap.write_text(yaml.safe_dump(as_list(*objects)))
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(p))
    args = ["explain", "--pod", str(pod_file), "--snapshot", str(snap), "--now", NOW_TEXT, *extra]
    if config is not None:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump(config))
        args += ["--config", str(cfg)]
    return subprocess.run(
        [sys.executable, "-m", "scheduler_plugins.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


CLUSTER = [
    node("hot"),
    node_metric("hot", cpu="24", memory="8Gi"),
    node("cool"),
    node_metric("cool", cpu="4", memory="8Gi"),
    node("numa", cpu="16"),
    nrt("numa"),
]


def test_explain_json_is_one_document_of_verdicts_reasons_and_scores_per_node(tmp_path):
    done = explain(tmp_path, CLUSTER, pod("p", requests={"cpu": "2", "memory": "2Gi"}), "--json")
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout)  # the whole output: nothing but the JSON document
    assert set(last) == {"nodes"}
    assert set(last["nodes"]) == {"hot", "cool", "numa"}
    hot, cool = last["nodes"]["hot"], last["nodes"]["cool"]
    assert hot == {
        "feasible": False,
        "reasons": ["node(s) cpu usage exceed threshold, cpu usage 80% > threshold 65%"],
        "scores": {},
        "score": 0,
    }
    assert cool["feasible"] is True
    assert cool["reasons"] == []
    assert set(cool) == {"feasible", "reasons", "scores", "score"}
    assert 0 < cool["scores"]["LoadAwareScheduling"] <= 100
    # kube-scheduler's scores take part beside Koordinator's, with the default profile's weights
    weights = {"LoadAwareScheduling": 1, "NodeResourcesFit": 1, "TaintToleration": 3}
    assert set(weights) <= set(cool["scores"])
    total = sum(DEFAULT_WEIGHTS[p] * s for p, s in cool["scores"].items())
    assert cool["score"] == total // sum(DEFAULT_WEIGHTS[p] for p in cool["scores"])
    assert last["nodes"]["numa"]["scores"]["LoadAwareScheduling"] == 0  # no NodeMetric
    text = explain(tmp_path, CLUSTER, pod("p", requests={"cpu": "2", "memory": "2Gi"}))
    assert "result: cool" in text.stdout


def test_explain_text_shows_each_plugins_verdict_and_the_reserved_cpuset(tmp_path):
    lsr = pod(
        "lsr",
        requests={"cpu": "4", "memory": "1Gi"},
        limits={"cpu": "4", "memory": "1Gi"},
        labels={"koordinator.sh/qosClass": "LSR"},
        priority=9500,
    )
    done = explain(tmp_path, CLUSTER, lsr)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(
        r"LoadAwareScheduling +FAIL  node\(s\) cpu usage exceed threshold, "
        r"cpu usage 86% > threshold 65%",
        out,
    )
    assert re.search(
        r"NodeNUMAResource +FAIL  node\(s\) invalid CPU Topology \(the node has no "
        r"NodeResourceTopology: is the koordlet running there\?\)",
        out,
    )
    # kube-scheduler's in-tree plugins give their verdicts and scores too
    assert re.search(
        r"node numa: feasible.*\n(.*\n)*  TaintToleration +pass  score 100 "
        r"\(weight 3\)",
        out,
    )
    assert re.search(r"NodeResourcesBalancedAllocation +pass  score \d+ \(weight 1\)", out)
    assert "result: numa" in out
    assert 'scheduling.koordinator.sh/resource-status: {"cpuset":"0-1,8-9"}' in out


def test_config_file_thresholds_change_the_verdict(tmp_path):
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "koord-scheduler",
                "pluginConfig": [
                    {
                        "name": "LoadAwareScheduling",
                        "args": {"kind": "LoadAwareSchedulingArgs", "usageThresholds": {"cpu": 90}},
                    }
                ],
            }
        ],
    }
    done = explain(tmp_path, CLUSTER, pod("p", requests={"cpu": "1"}), "--json", config=config)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes"]["hot"]["feasible"] is True


def test_bad_inputs_exit_2_naming_the_file_and_the_field(tmp_path):
    broken = node("n1", cpu="lots")
    done = explain(tmp_path, [broken], pod("p"))
    assert done.returncode == 2
    assert "snapshot.yaml: items[0].status.allocatable.cpu" in done.stderr
    config = {
        "pluginConfig": [{"name": "LoadAwareScheduling", "args": {"usageThresholds": {"cpu": "x"}}}]
    }
    done = explain(tmp_path, [node("n1")], pod("p"), config=config)
    assert done.returncode == 2
    assert "config.yaml: pluginConfig[LoadAwareScheduling].args.usageThresholds.cpu" in done.stderr
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler_plugins.cli",
            "explain",
            "--pod",
            str(tmp_path / "nope.yaml"),
            "--snapshot",
            str(tmp_path / "snapshot.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "nope.yaml" in missing.stderr


# -- koord-scheduler run: leader election settings ----------------------------------------------


def election_of(*argv: str):
    from scheduler_plugins.cli import _parser, leader_election

    return leader_election(_parser().parse_args(["run", *argv]))


def test_run_elects_a_leader_on_koordinators_lease_with_kube_schedulers_default_timings():
    election = election_of()
    assert election.leader_elect is True
    assert (election.resource_namespace, election.resource_name) == (
        "koordinator-system",
        "koord-scheduler",
    )
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (
        15.0,
        10.0,
        2.0,
    )


def test_leader_election_flags_take_go_booleans_and_go_durations():
    assert election_of("--leader-elect=false").leader_elect is False
    assert election_of("--leader-elect").leader_elect is True
    election = election_of(
        "--leader-elect-lease-duration=1m",
        "--leader-elect-renew-deadline=45s",
        "--leader-elect-retry-period=500ms",
        "--leader-elect-resource-name=other",
        "--leader-elect-resource-namespace=kube-system",
    )
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (
        60.0,
        45.0,
        0.5,
    )
    assert (election.resource_namespace, election.resource_name) == ("kube-system", "other")


def test_the_config_files_leader_election_stanza_applies_and_flags_given_override_it(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "leaderElection": {
                    "leaderElect": True,
                    "resourceLock": "leases",
                    "resourceName": "from-file",
                    "resourceNamespace": "file-ns",
                    "leaseDuration": "30s",
                    "renewDeadline": "20s",
                    "retryPeriod": "4s",
                },
            }
        )
    )
    election = election_of(f"--config={cfg}", "--leader-elect-resource-name=from-flag")
    assert election.resource_name == "from-flag"
    assert election.resource_namespace == "file-ns"
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (
        30.0,
        20.0,
        4.0,
    )


def test_timings_out_of_order_or_unreadable_are_bad_input_exit_2(tmp_path, capsys):
    from scheduler_plugins.cli import main

    assert main(["run", "--leader-elect-renew-deadline=20s"]) == 2
    assert "renew_deadline < lease_duration" in capsys.readouterr().err
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"leaderElection": {"leaseDuration": "soon"}}))
    assert main(["run", f"--config={cfg}"]) == 2
    assert "leaderElection.leaseDuration" in capsys.readouterr().err
    # with election off, its timings are not checked
    assert (
        election_of("--leader-elect=false", "--leader-elect-renew-deadline=20s").renew_deadline
        == 20
    )


MANIFESTS = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "scheduler"


def test_the_packaged_standalone_deployment_runs_two_replicas_under_the_lease_its_role_grants():
    from scheduler_plugins.cli import _parser, leader_election

    deployment = yaml.safe_load((MANIFESTS / "standalone.yaml").read_text())
    assert deployment["spec"]["replicas"] == 2
    pod_spec = deployment["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    assert container["command"] == ["koord-scheduler"]
    args = _parser().parse_args(
        [a for a in container["args"] if not a.startswith("--config=")]  # file in the ConfigMap
    )
    election = leader_election(args)
    assert election.leader_elect is True
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (
        15.0,
        10.0,
        2.0,
    )
    docs = list(yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text()))
    binding = next(
        d
        for d in docs
        if d["kind"] == "RoleBinding"
        and any(s["name"] == pod_spec["serviceAccountName"] for s in d["subjects"])
    )
    role = next(
        d
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["name"] == binding["roleRef"]["name"]
    )
    assert role["metadata"]["namespace"] == election.resource_namespace
    granted = {
        verb
        for rule in role["rules"]
        if "leases" in rule["resources"]
        and election.resource_name in rule.get("resourceNames", [election.resource_name])
        for verb in rule["verbs"]
    }
    assert {"get", "create", "update"} <= granted

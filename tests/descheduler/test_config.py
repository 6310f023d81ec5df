"""The DeschedulerConfiguration: upstream's defaults, the plugin sets merged as
``mergePluginSet`` merges them, and bad input named by file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from descheduler.config import default_config, load_config, parse_config
from descheduler.errors import ConfigError
from descheduler.loadaware.args import DEFAULT_POOL
from descheduler.loadaware.args import parse_args as parse_lnl
from descheduler.migration.args import parse_args as parse_mc


def test_defaults_are_upstreams() -> None:
    cfg = default_config()
    (profile,) = cfg.profiles
    assert profile.name == "koord-descheduler"
    assert profile.plugins["evict"] == ("MigrationController",)
    assert profile.plugins["balance"] == ()
    le = cfg.leader_election
    assert (le.leader_elect, le.resource_namespace, le.resource_name) == (
        True,
        "koordinator-system",
        "koord-descheduler",
    )
    assert (le.lease_duration_s, le.renew_deadline_s, le.retry_period_s) == (15, 10, 2)
    m = cfg.migration_args()
    assert m.max_migrating_per_node == 2
    assert m.default_job_mode == "ReservationFirst"
    assert m.default_job_ttl_s == 300
    assert m.scheduler_names == ("koord-scheduler",)
    assert m.eviction_policy == "Eviction"
    assert (m.evict_qps, m.evict_burst) == (10, 1)
    assert m.object_limiters["workload"].duration_s == 300
    assert (m.arbitration_enabled, m.arbitration_interval_s) == (True, 0.5)


def test_low_node_load_defaults_and_the_default_pool() -> None:
    args = parse_lnl(
        {"lowThresholds": {"cpu": 30, "pods": 10}, "resourceWeights": {"cpu": 10, "memory": 5}}, "t"
    )
    assert args.node_fit is True
    assert args.node_metric_expiration_s == 180
    assert args.detector_cache_timeout_s == 300
    (pool,) = args.node_pools
    assert pool.name == DEFAULT_POOL
    assert dict(pool.resource_weights) == {"cpu": 10, "memory": 5, "pods": 1}
    a = pool.anomaly
    assert (a.timeout_s, a.consecutive_abnormalities, a.consecutive_normalities) == (60, 5, 3)


def test_node_pools_inherit_unset_fields_from_the_top_level() -> None:
    """``TestSetDefaults_NodePoolsUseDefaultArgsFromLowNodeLoadArgs``."""
    args = parse_lnl(
        {
            "highThresholds": {"cpu": 80, "memory": 80},
            "lowThresholds": {"cpu": 20, "memory": 20},
            "prodHighThresholds": {"cpu": 90},
            "prodLowThresholds": {"cpu": 10},
            "resourceWeights": {"cpu": 2},
            "anomalyCondition": {
                "timeout": "2m",
                "consecutiveAbnormalities": 10,
                "consecutiveNormalities": 5,
            },
            "nodePools": [
                {"name": "test-pool"},
                {"name": "partial", "anomalyCondition": {"timeout": "1m"}},
            ],
        },
        "t",
    )
    default, pool, partial = args.node_pools
    assert default.name == DEFAULT_POOL
    assert pool.high_thresholds == {"cpu": 80, "memory": 80}
    assert pool.prod_low_thresholds == {"cpu": 10}
    assert dict(pool.resource_weights) == {"cpu": 2, "memory": 1}
    assert (
        pool.anomaly.timeout_s,
        pool.anomaly.consecutive_abnormalities,
        pool.anomaly.consecutive_normalities,
    ) == (120, 10, 5)
    assert (
        partial.anomaly.timeout_s,
        partial.anomaly.consecutive_abnormalities,
        partial.anomaly.consecutive_normalities,
    ) == (60, 10, 5)


def test_plugin_sets_merge_over_the_defaults() -> None:
    cfg = parse_config(
        {
            "profiles": [
                {
                    "name": "p",
                    "plugins": {
                        "deschedule": {"disabled": [{"name": "*"}]},
                        "balance": {"enabled": [{"name": "LowNodeLoad"}]},
                        "evict": {
                            "disabled": [{"name": "*"}],
                            "enabled": [{"name": "MigrationController"}],
                        },
                    },
                }
            ]
        },
        "c.yaml",
    )
    assert cfg.profiles[0].plugins["balance"] == ("LowNodeLoad",)
    assert cfg.profiles[0].plugins["evict"] == ("MigrationController",)
    assert "LowNodeLoad" in cfg.profiles[0].args


BAD: list[tuple[dict[str, Any], str]] = [
    (
        {
            "profiles": [
                {
                    "pluginConfig": [
                        {"name": "LowNodeLoad", "args": {"highThresholds": {"cpu": "lots"}}}
                    ]
                }
            ]
        },
        "c.yaml: profiles[0].pluginConfig[0].args.highThresholds.cpu: must be a percentage",
    ),
    (
        {
            "profiles": [
                {
                    "pluginConfig": [
                        {
                            "name": "LowNodeLoad",
                            "args": {"lowThresholds": {"cpu": 80}, "highThresholds": {"cpu": 50}},
                        }
                    ]
                }
            ]
        },
        "c.yaml: profiles[0].pluginConfig[0].args.lowThresholds.cpu: low percentage must be "
        "less than or equal to highThresholds",
    ),
    (
        {
            "profiles": [
                {
                    "pluginConfig": [
                        {
                            "name": "LowNodeLoad",
                            "args": {"evictableNamespaces": {"include": ["a"], "exclude": ["b"]}},
                        }
                    ]
                }
            ]
        },
        "c.yaml: profiles[0].pluginConfig[0].args.evictableNamespaces: only one of",
    ),
    (
        {
            "profiles": [
                {
                    "pluginConfig": [
                        {"name": "MigrationController", "args": {"defaultJobMode": "Teleport"}}
                    ]
                }
            ]
        },
        "c.yaml: profiles[0].pluginConfig[0].args.defaultJobMode: must be one of",
    ),
    (
        {
            "profiles": [
                {
                    "pluginConfig": [
                        {"name": "MigrationController", "args": {"maxMigratingPerNode": -1}}
                    ]
                }
            ]
        },
        "c.yaml: profiles[0].pluginConfig[0].args.maxMigratingPerNode: maxMigratingPerNode "
        "should be greater or equal 0",
    ),
    (
        {"profiles": [{"plugins": {"balance": {"enabled": [{"name": "Nope"}]}}}]},
        "c.yaml: profiles[0].plugins.balance.enabled[0].name: unknown plugin 'Nope'",
    ),
    ({"deschedulingInterval": "often"}, "c.yaml: deschedulingInterval: not a Go duration"),
    (
        {"leaderElection": {"leaseDuration": "5s", "renewDeadline": "10s"}},
        "c.yaml: leaderElection: need 0 < retryPeriod < renewDeadline < leaseDuration",
    ),
    ({"kind": "KubeSchedulerConfiguration"}, "c.yaml: kind: must be DeschedulerConfiguration"),
]


@pytest.mark.parametrize(("doc", "message"), BAD)
def test_a_bad_field_is_named(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "c.yaml")
    assert str(err.value).startswith(message)


def test_a_file_that_is_not_yaml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: not YAML"):
        load_config(path)


def test_migration_args_read_int_or_percent_and_limiters() -> None:
    m = parse_mc(
        {
            "maxMigratingPerWorkload": "20%",
            "maxUnavailablePerWorkload": 3,
            "objectLimiters": {
                "workload": {"duration": "10m", "maxMigrating": 2},
                "namespace": {"duration": "1m", "maxMigrating": 5},
            },
            "evictionPolicy": "Delete",
            "arbitrationArgs": {"interval": "1s"},
        },
        "t",
    )
    assert m.max_migrating_per_workload == "20%"
    assert m.max_unavailable_per_workload == 3
    assert m.object_limiters["workload"].duration_s == 600
    assert m.object_limiters["namespace"].max_migrating == 5
    assert m.eviction_policy == "Delete"
    # upstream defaults Enabled only when arbitrationArgs is absent altogether
    assert m.arbitration_enabled is False
    assert m.arbitration_interval_s == 1

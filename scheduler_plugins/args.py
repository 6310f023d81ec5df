"""Reading a plugin's ``args`` map (``pluginConfig[].args`` of a KubeSchedulerConfiguration) into
typed values, every error naming the file and the field (``pluginConfig[LoadAwareScheduling].
args.usageThresholds.cpu``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.duration import parse_duration
from scheduler_plugins.errors import PluginArgsError

SCORING_TYPES = ("LeastAllocated", "MostAllocated")
"""``scoringStrategy.type`` values, the default first."""


class ArgsReader:
    """Typed access to one plugin's args."""

    def __init__(self, args: Mapping[str, Any] | None, source: str, plugin: str) -> None:
        self.args = dict(args or {})
        self.source = source
        self.where = f"pluginConfig[{plugin}].args"

    def fail(self, key: str, message: str) -> PluginArgsError:
        """The error for ``key``."""
        return PluginArgsError(self.source, f"{self.where}.{key}" if key else self.where, message)

    def boolean(self, key: str, default: bool) -> bool:
        """A boolean field."""
        value = self.args.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, default: int, *, minimum: int | None = None) -> int:
        """An integer field, optionally bounded below."""
        value = self.args.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def string(self, key: str, default: str, choices: tuple[str, ...] | None = None) -> str:
        """A string field, optionally one of ``choices``."""
        value = self.args.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def duration(self, key: str, default: float) -> float:
        """A Go duration string (``"5m"``) in seconds."""
        value = self.args.get(key)
        if value is None:
            return default
        try:
            return parse_duration(str(value))
        except ValueError as err:
            raise self.fail(key, str(err)) from err

    def percent_map(
        self, key: str, default: Mapping[str, int] | None, *, low: int = 0, high: int = 100
    ) -> dict[str, int] | None:
        """A map resource name → integer in ``[low, high]`` (thresholds, weights, factors)."""
        value = self.args.get(key)
        if value is None:
            return dict(default) if default is not None else None
        return int_map(value, self, key, low, high)

    def scoring_strategy(self, *, max_weight: int | None) -> tuple[str, dict[str, int]]:
        """``scoringStrategy``: its ``type`` (``LeastAllocated`` or ``MostAllocated``, default
        the first) and ``resources[].{name, weight}`` (default cpu and memory at 1); a weight
        runs from 0 to ``max_weight`` (no ceiling when None)."""
        strategy, weights = SCORING_TYPES[0], {"cpu": 1, "memory": 1}
        sub = self.section("scoringStrategy")
        if sub is None:
            return strategy, weights
        strategy = sub.string("type", strategy, SCORING_TYPES)
        resources = sub.args.get("resources")
        if resources is None:
            return strategy, weights
        if not isinstance(resources, list) or not resources:
            raise sub.fail("resources", "must be a non-empty list of {name, weight}")
        weights = {}
        for i, item in enumerate(resources):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise sub.fail(f"resources[{i}]", "needs a name")
            w = item.get("weight", 1)
            bad = isinstance(w, bool) or not isinstance(w, int) or w < 0
            if max_weight is None and bad:
                raise sub.fail(
                    f"resources[{i}].weight", f"must be a non-negative integer, got {w!r}"
                )
            if max_weight is not None and (bad or w > max_weight):
                raise sub.fail(f"resources[{i}].weight", f"must be 0..{max_weight}, got {w!r}")
            weights[item["name"]] = w
        return strategy, weights

    def section(self, key: str) -> ArgsReader | None:
        """A nested object as its own reader (``aggregated``), ``None`` when absent."""
        value = self.args.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.fail(key, "must be an object")
        sub = ArgsReader(value, self.source, "")
        sub.where = f"{self.where}.{key}"
        return sub


def int_map(value: Any, reader: ArgsReader, key: str, low: int, high: int) -> dict[str, int]:
    """Validate ``value`` as a map of integers in ``[low, high]``."""
    if not isinstance(value, Mapping):
        raise reader.fail(key, f"must be a map of resource name to integer, got {value!r}")
    out: dict[str, int] = {}
    for name, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise reader.fail(f"{key}.{name}", f"must be an integer, got {v!r}")
        if not low <= v <= high:
            raise reader.fail(f"{key}.{name}", f"must be in [{low}, {high}], got {v}")
        out[str(name)] = v
    return out

"""The plugin table: every plugin koord-descheduler has, one row each, in one place.

A row holds the plugin's name (Koordinator's), the extension points it serves, its args parser
(``pluginConfig[].args`` → a frozen dataclass, defaults applied, errors naming the field) and,
for Deschedule and Balance plugins, its factory. ``config.py`` enables plugins by these names;
nothing registers itself on import, and tests pass their own table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from apis.records import frozen
from descheduler.loadaware import args as loadaware_args
from descheduler.loadaware.plugin import LowNodeLoad
from descheduler.migration import args as migration_args

DESCHEDULE = "deschedule"
BALANCE = "balance"
EVICT = "evict"
FILTER = "filter"
POINTS = (DESCHEDULE, BALANCE, EVICT, FILTER)

ArgsParser = Callable[[Mapping[str, Any] | None, str, str], Any]
"""``parse(args, source, path)``: the plugin's typed args."""


@frozen
class PluginSpec:
    """One row of the table."""

    name: str
    """Koordinator's plugin name."""
    points: tuple[str, ...]
    """Extension points: ``deschedule``, ``balance``, ``evict``, ``filter``."""
    parse_args: ArgsParser
    """Reads its ``pluginConfig`` args (``None``: all defaults)."""
    factory: Callable[[Any], Any] | None = None
    """Builds a Deschedule or Balance plugin from its parsed args."""


PLUGINS: dict[str, PluginSpec] = {
    loadaware_args.NAME: PluginSpec(
        loadaware_args.NAME, (BALANCE,), loadaware_args.parse_args, LowNodeLoad
    ),
    migration_args.NAME: PluginSpec(
        migration_args.NAME, (EVICT, FILTER), migration_args.parse_args
    ),
}
"""Every plugin. The MigrationController is the evictor (and its filter); LowNodeLoad balances."""

DEFAULT_EVICTOR = migration_args.NAME
"""The evict plugin every profile has unless disabled (``getDefaultPlugins``)."""

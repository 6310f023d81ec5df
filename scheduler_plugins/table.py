"""The plugin table: Koordinator's plugin name → factory, in the order the framework runs them.

Nothing registers itself on import; callers (explain, the extender, tests) pass this table, or
their own, to :func:`build_framework`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import Framework, Plugin
from scheduler_plugins.plugins import (
    beevictionpressure,
    coscheduling,
    deviceshare,
    elasticquota,
    loadaware,
    nodenumaresource,
    noderesourcesfit,
    reservation,
)

PluginFactory = Callable[[Mapping[str, Any] | None, str], Plugin]
"""``factory(args, source)``: the plugin configured by its ``pluginConfig`` args (``None``:
Koordinator's defaults); ``source`` names the config file in errors."""

PLUGINS: dict[str, PluginFactory] = {
    coscheduling.NAME: coscheduling.build,
    elasticquota.NAME: elasticquota.build,
    noderesourcesfit.NAME: noderesourcesfit.build,
    loadaware.NAME: loadaware.build,
    nodenumaresource.NAME: nodenumaresource.build,
    reservation.NAME: reservation.build,
    deviceshare.NAME: deviceshare.build,
    beevictionpressure.NAME: beevictionpressure.build,
}
"""Every plugin, in run order."""

DEFAULT_WEIGHTS: dict[str, int] = dict.fromkeys(PLUGINS, 1)
"""Score weight per plugin (``plugins.score.enabled[].weight`` overrides)."""


def build_framework(
    table: Mapping[str, PluginFactory] = PLUGINS,
    plugin_args: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    weights: Mapping[str, int] | None = None,
    disabled: Sequence[str] = (),
    source: str = "<defaults>",
) -> Framework:
    """A :class:`Framework` running the plugins of ``table`` less ``disabled``."""
    plugins = [
        factory((plugin_args or {}).get(name), source)
        for name, factory in table.items()
        if name not in disabled
    ]
    merged = dict(DEFAULT_WEIGHTS)
    merged.update(weights or {})
    return Framework(plugins, merged)

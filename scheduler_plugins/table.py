"""The plugin tables: plugin name → factory, in the order the framework runs them.

koord-scheduler is kube-scheduler plus Koordinator's plugins, so :data:`PLUGINS` (``explain``
and the standalone scheduler) runs kube-scheduler's default in-tree plugins first, in its
default profile's order (``pkg/scheduler/apis/config/v1/default_plugins.go``), then
Koordinator's. :data:`EXTENDER_PLUGINS` is what the extender runs behind a stock kube-scheduler,
which has already run its own in-tree plugins: Koordinator's, and NodeResourcesFit's filter only
(for batch, mid and reserved resources).

Nothing registers itself on import; callers (explain, the extender, tests) pass one of these
tables, or their own, to :func:`build_framework`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import Framework, Plugin
from scheduler_plugins.plugins import (
    balancedallocation,
    coscheduling,
    deviceshare,
    elasticquota,
    imagelocality,
    interpodaffinity,
    loadaware,
    nodeaffinity,
    nodename,
    nodenumaresource,
    nodeports,
    noderesourcesfit,
    nodeunschedulable,
    podtopologyspread,
    reservation,
    tainttoleration,
    volumebinding,
)

PluginFactory = Callable[[Mapping[str, Any] | None, str], Plugin]
"""``factory(args, source)``: the plugin configured by its ``pluginConfig`` args (``None``:
the defaults); ``source`` names the config file in errors."""

IN_TREE: dict[str, PluginFactory] = {
    nodeunschedulable.NAME: nodeunschedulable.build,
    nodename.NAME: nodename.build,
    tainttoleration.NAME: tainttoleration.build,
    nodeaffinity.NAME: nodeaffinity.build,
    nodeports.NAME: nodeports.build,
    noderesourcesfit.NAME: noderesourcesfit.build,
    volumebinding.NAME: volumebinding.build,
    podtopologyspread.NAME: podtopologyspread.build,
    interpodaffinity.NAME: interpodaffinity.build,
    balancedallocation.NAME: balancedallocation.build,
    imagelocality.NAME: imagelocality.build,
}
"""kube-scheduler's default profile, in its order (its volume-limit, volume-restriction and
volume-zone plugins and DynamicResources are not here; VolumeBinding refuses unbound claims)."""

KOORDINATOR: dict[str, PluginFactory] = {
    coscheduling.NAME: coscheduling.build,
    elasticquota.NAME: elasticquota.build,
    loadaware.NAME: loadaware.build,
    nodenumaresource.NAME: nodenumaresource.build,
    reservation.NAME: reservation.build,
    deviceshare.NAME: deviceshare.build,
}
"""Koordinator's plugins."""

PLUGINS: dict[str, PluginFactory] = {**IN_TREE, **KOORDINATOR}
"""Every plugin, in run order: what ``koord-scheduler run`` and ``explain`` run."""

EXTENDER_PLUGINS: dict[str, PluginFactory] = {
    coscheduling.NAME: coscheduling.build,
    elasticquota.NAME: elasticquota.build,
    noderesourcesfit.NAME: noderesourcesfit.build_filter_only,
    loadaware.NAME: loadaware.build,
    nodenumaresource.NAME: nodenumaresource.build,
    reservation.NAME: reservation.build,
    deviceshare.NAME: deviceshare.build,
}
"""What the extender runs behind kube-scheduler (which runs the in-tree plugins itself)."""

DEFAULT_WEIGHTS: dict[str, int] = {
    **dict.fromkeys(PLUGINS, 1),
    tainttoleration.NAME: 3,
    nodeaffinity.NAME: 2,
    podtopologyspread.NAME: 2,
    interpodaffinity.NAME: 2,
    noderesourcesfit.NAME: 1,
    balancedallocation.NAME: 1,
    imagelocality.NAME: 1,
}
"""Score weight per plugin (``plugins.score.enabled[].weight`` overrides): kube-scheduler's
default profile for its plugins (TaintToleration 3, NodeAffinity 2, PodTopologySpread 2,
InterPodAffinity 2, NodeResourcesFit 1, NodeResourcesBalancedAllocation 1, ImageLocality 1;
``getDefaultPlugins``), 1 for Koordinator's."""


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

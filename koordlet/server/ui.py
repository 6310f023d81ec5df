"""``/debug/ui``: one self-contained page with live charts, and the two JSON views it polls.

=========================  ====================================================================
``/debug/ui``              the page (``ui.html`` beside this module): inline CSS and JS, charts
                           drawn on canvas by its own code, nothing loaded from elsewhere (its
                           Content-Security-Policy allows only itself and this server)
``/debug/summary``         the node at a glance: mode, dry run, capacity, current usage, the BE
                           allowance, the NodeSLO thresholds in cores and bytes, the pods of each
                           QoS class with their usage (:mod:`koordlet.server.summary`)
``/debug/series``          ``?metric=&entity=`` or ``?metric=&group=qos``, ``&window=600&step=``:
                           the cache's samples in buckets of ``step`` seconds, for a chart
=========================  ====================================================================

The page also polls ``/debug/qos`` (the last decision of every strategy) and ``/debug/audit``
(evictions). Like every ``/debug`` path these are served to loopback peers only (the server's
guard). docs/ui.md shows the page.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import json
import math
import re
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from koordlet.server.debug import json_response
from koordlet.server.http import Handler, Request, Response
from koordlet.server.summary import (
    UiDeps,
    bucket_step,
    bucketed,
    pods_by_class,
    summary_payload,
)

if TYPE_CHECKING:
    from koordlet.server.app import ServerDeps

DEFAULT_SERIES_WINDOW = 600.0
"""Seconds ``/debug/series`` covers when ``window`` is not given."""
_SERIES_PARAMS = frozenset({"metric", "entity", "group", "window", "step"})
_GROUPS = ("qos",)
_METRIC_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_:]{0,127}")
_ENTITY_RE = re.compile(r"[\w.:/@-]{1,256}")
_INLINE_RE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)

_dumps = partial(json.dumps, default=str)


def load_page() -> tuple[bytes, str]:
    """The page's bytes and its Content-Security-Policy: the hashes of its inline script and
    style, fetches to this server only, images from ``data:`` only, nothing else."""
    text = importlib.resources.files(__package__).joinpath("ui.html").read_text("utf-8")
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag, body in _INLINE_RE.findall(text):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[tag].append(f"'sha256-{digest}'")
    csp = "; ".join(
        [
            "default-src 'none'",
            f"script-src {' '.join(hashes['script'])}",
            f"style-src {' '.join(hashes['style'])}",
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return text.encode(), csp


def parse_series_query(
    pairs: Iterable[tuple[str, str]], max_window: float
) -> tuple[str, str | None, str | None, float, float | None]:
    """``(metric, entity, group, window, step)`` from ``/debug/series``'s parameters; exactly one
    of ``entity`` and ``group`` is set. ``ValueError`` with a message for the client."""
    sent = list(pairs)
    names = [k for k, _ in sent]
    unknown = sorted(set(names) - _SERIES_PARAMS)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown}; expected metric, entity or group, window, step"
        )
    repeated = sorted({k for k in names if names.count(k) > 1})
    if repeated:
        raise ValueError(f"parameter(s) {repeated} given more than once")
    params = dict(sent)
    metric = params.get("metric", "")
    if not _METRIC_RE.fullmatch(metric):
        raise ValueError(f"metric must be a series name such as node_cpu_usage, got {metric!r}")
    entity, group = params.get("entity"), params.get("group")
    if (entity is None) == (group is None):
        raise ValueError("give exactly one of entity (node, be, pod/<uid>...) and group (qos)")
    if entity is not None and not _ENTITY_RE.fullmatch(entity):
        raise ValueError(f"entity must be an entity id such as node or pod/<uid>, got {entity!r}")
    if group is not None and group not in _GROUPS:
        raise ValueError(f"group must be one of {', '.join(_GROUPS)}, got {group!r}")
    window = _seconds(params, "window", max_window)
    step = _seconds(params, "step", max_window)
    return metric, entity, group, DEFAULT_SERIES_WINDOW if window is None else window, step


def _seconds(params: dict[str, str], name: str, most: float) -> float | None:
    """Parameter ``name`` as seconds in ``(0, most]``; None when not given."""
    raw = params.get(name, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or not 0 < value <= most:
        raise ValueError(f"{name} must be in (0, {most:g}] seconds, got {raw!r}")
    return value


class UiHandlers:
    """The handlers of the module docstring's table."""

    def __init__(self, deps: ServerDeps, ui: UiDeps) -> None:
        self._deps = deps
        self._ui = ui
        self._page, self._csp = load_page()

    def routes(self) -> list[tuple[str, Handler]]:
        """``(path, handler)`` of every endpoint."""
        return [
            ("/debug/ui", self.page),
            ("/debug/summary", self.summary),
            ("/debug/series", self.series),
        ]

    async def page(self, request: Request) -> Response:
        return Response(
            200,
            self._page,
            {
                "Content-Type": "text/html; charset=utf-8",
                "Content-Security-Policy": self._csp,
                "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
            },
        )

    async def summary(self, request: Request) -> Response:
        deps = self._deps
        payload = summary_payload(self._ui, deps.cache, deps.workloads(), deps.clock())
        payload["degraded"] = list(deps.degraded()) if deps.degraded is not None else []
        return json_response(payload)

    async def series(self, request: Request) -> Response:
        deps = self._deps
        try:
            metric, entity, _group, window, step = parse_series_query(
                request.query, deps.max_query_window
            )
            width = bucket_step(window, step)
        except ValueError as err:
            return json_response({"error": str(err)}, 400)
        end = deps.clock()
        # Start on a bucket boundary: a bucket is either whole in the answer or absent.
        start = math.ceil((end - window) / width) * width
        points = self._ui.points
        if entity is not None:
            groups: dict[str, list[str]] = {entity: [entity]}
        else:
            groups = dict(pods_by_class(deps.workloads()))
        return json_response(
            {
                "metric": metric,
                "window": window,
                "step": width,
                "start": start,
                "end": end,
                "series": {
                    name: bucketed(members, metric, points, start, end, width)
                    for name, members in groups.items()
                },
                "members": {name: len(members) for name, members in groups.items()},
            }
        )

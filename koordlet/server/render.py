"""The exporter's families written straight to exposition text, for the per-tick exposition.

:class:`FamilyRenderer` writes what prometheus-client's encoders write for
``KoordletExporter.collect()``'s families, byte for byte (tests compare the two), without building
a ``Metric`` and a ``Sample`` per value:

- each sample line up to its value (``name{labels} ``) is built once per inventory snapshot, from
  a %-template per family and source in which the source's fixed labels are already written and
  the scope's labels (escaped once per entity) fill the placeholders;
- a source whose series the metric cache holds none of (a collector gated off) costs one lookup;
- the values of a source are read from the cache in one call (``last_values``).

About 1.5 µs a sample at 200 pods, against 18 µs through prometheus-client (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from koordlet.metriccache.series import SeriesKey
from koordlet.server.exporter import FAMILIES, FamilySpec, KoordletExporter, Scope, Source
from koordlet.server.textformat import (
    Format,
    escape_label_value,
    format_value,
    header,
    label_order,
)
from koordlet.statesinformer.model import WorkloadSnapshot

_Row = tuple[SeriesKey, str]
"""A sample the renderer may write: its series, and its line up to the value."""
_CACHE_SCOPES = frozenset({Scope.NUMA, Scope.RESCTRL})
"""Scopes whose entities are found in the cache at each build, not in the inventory."""


def _template(spec: FamilySpec, src: Source) -> str:
    """``name{...} `` with ``%s`` for each scope label (in sorted order) and ``src``'s extra
    labels written in."""
    names = spec.labels
    width = len(spec.scope.labels)
    parts = []
    for i in label_order(names):
        value = "%s" if i < width else escape_label_value(src.extra[i - width]).replace("%", "%%")
        parts.append(f'{names[i]}="{value}"')
    return f"{spec.name}{{{','.join(parts)}}} "


class FamilyRenderer:
    """Writes an exporter's families as exposition text; see the module docstring.

    Not thread-safe: it reads the metric cache, so it runs where the cache's owner runs.
    """

    def __init__(self, exporter: KoordletExporter) -> None:
        self._exporter = exporter
        self._templates = {
            (spec.name, src): _template(spec, src) for spec in FAMILIES for src in spec.sources
        }
        self._headers = {
            fmt: {spec.name: header(spec.name, spec.help, "gauge", fmt) for spec in FAMILIES}
            for fmt in Format
        }
        self._snapshot: WorkloadSnapshot | None = None
        self._scope_values: dict[Scope, list[tuple[str, tuple[str, ...]]]] = {}
        self._rows: dict[tuple[str, Source], list[_Row]] = {}

    def render(self, fmt: Format) -> str:
        """Every family with its fresh samples, in ``FAMILIES`` order (no ``# EOF``)."""
        exporter = self._exporter
        cache = exporter.cache
        now = exporter.now()
        snapshot = exporter.workloads()
        if snapshot is not self._snapshot:
            self._snapshot = snapshot
            self._scope_values.clear()
            self._rows.clear()
        headers = self._headers[fmt]
        out: list[str] = []
        push = out.append
        fmt_value = format_value
        for spec in FAMILIES:
            push(headers[spec.name])
            since = now - exporter.max_age_of(spec.name)
            flag_values: dict[str, list[float | None]] = {}
            for src in spec.sources:
                if not cache.has_series(src.series):
                    continue
                rows = self._rows_of(spec, src, snapshot)
                values = cache.last_values([row[0] for row in rows], since)
                if src.only_if is not None:
                    # A family's sources list the same entities in the same order: the flag
                    # series is read once a family, not once a source.
                    flag_series, wanted = src.only_if
                    flags = flag_values.get(flag_series)
                    if flags is None or len(flags) != len(rows):
                        keys = [SeriesKey(flag_series, key.entity) for key, _ in rows]
                        flags = flag_values[flag_series] = cache.last_values(keys, 0.0)
                    values = [
                        v if f == wanted else None for f, v in zip(flags, values, strict=True)
                    ]
                for (_, prefix), value in zip(rows, values, strict=True):
                    if value is not None:
                        push(prefix)
                        push(fmt_value(value))
                        push("\n")
        return "".join(out)

    def _rows_of(self, spec: FamilySpec, src: Source, snapshot: WorkloadSnapshot) -> list[_Row]:
        if spec.scope in _CACHE_SCOPES:
            return self._build_rows(spec, src, self._entities(spec.scope, src, snapshot))
        key = (spec.name, src)
        rows = self._rows.get(key)
        if rows is None:
            values = self._scope_values.get(spec.scope)
            if values is None or spec.scope is Scope.NODE:
                values = list(self._entities(spec.scope, src, snapshot))
                if spec.scope is not Scope.NODE:
                    self._scope_values[spec.scope] = values
            rows = self._rows[key] = self._build_rows(spec, src, values)
        return rows

    def _entities(
        self, scope: Scope, src: Source, snapshot: WorkloadSnapshot
    ) -> Iterable[tuple[str, tuple[str, ...]]]:
        """``(entity, escaped scope label values in label-name order)``, as the exporter lists
        them."""
        order = label_order(scope.labels)
        for entity, labels in self._exporter.entities(scope, src, snapshot):
            yield entity, tuple(escape_label_value(labels[i]) for i in order)

    def _build_rows(
        self, spec: FamilySpec, src: Source, values: Iterable[tuple[str, tuple[str, ...]]]
    ) -> list[_Row]:
        template = self._templates[(spec.name, src)]
        series = src.series
        return [(SeriesKey(series, entity), template % labels) for entity, labels in values]

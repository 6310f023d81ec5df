"""The two exposition formats ``/metrics`` speaks, and how a scraper picks one.

- Prometheus text format 0.0.4 (``text/plain; version=0.0.4``), what every Prometheus and
  node-exporter-era tool reads. It has no created timestamps: prometheus-client writes each
  counter's and histogram's ``_created`` as an extra gauge family, which Prometheus then stores
  as a series of its own; :func:`encode_registry` leaves them out, as the Go client does.
- OpenMetrics 1.0.0 (``application/openmetrics-text; version=1.0.0``), what Prometheus asks for
  first: ``_created`` samples are part of that format and stay; the body ends with ``# EOF``.

:func:`negotiate` reads the ``Accept`` header with its q-values (RFC 9110 §12.5.1): the highest
q among the formats above wins, ties going to the one listed first; a header that accepts
neither, or none at all, gets the text format, as Prometheus' own clients answer.
:func:`accepts_gzip` reads ``Accept-Encoding`` the same way.

Sample lines are written as prometheus-client writes them (labels sorted by name, values with
``floatToGoString``), so a body is byte for byte what its encoders produce for the same
families, minus the ``_created`` gauges in the text format; the registry's families are written
by :mod:`koordlet.prom.encode`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from enum import Enum

from apis.records import frozen
from koordlet.prom import Collector
from koordlet.prom.encode import encode_openmetrics, encode_text
from koordlet.prom.textvalue import go_float

_go_string: Callable[[float], str] = go_float


def format_value(value: float) -> str:
    """A sample value as both formats write it, exactly as prometheus-client's
    ``floatToGoString`` does (``0.25``, ``1.5e+09`` where Go switches to an exponent, ``+Inf``,
    ``NaN``), with the finite case, every value of the metric cache, done inline."""
    if value - value != 0.0:  # inf or NaN
        return _go_string(value)
    text = repr(value)
    if value > 0:
        dot = text.find(".")
        if dot > 6:
            mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
    return text


class Format(Enum):
    """An exposition format ``/metrics`` can answer in."""

    TEXT = "text"
    OPENMETRICS = "openmetrics"


TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_OPENMETRICS_VERSIONS = frozenset({"", "1.0.0", "0.0.1"})
"""OpenMetrics versions we answer as 1.0.0 (0.0.1 is the same text; Prometheus asks for it
second)."""
_TEXT_VERSIONS = frozenset({"", "0.0.4"})


@frozen
class _Range:
    media: str
    params: dict[str, str]
    q: float


def _ranges(header: str) -> Iterator[_Range]:
    """The media ranges of an ``Accept`` or ``Accept-Encoding`` header, in order."""
    for item in header.split(","):
        media, *rest = item.split(";")
        media = media.strip().lower()
        if not media:
            continue
        params: dict[str, str] = {}
        for param in rest:
            key, _, value = param.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0  # a malformed weight: not acceptable, rather than a guess
        yield _Range(media, params, q if 0.0 <= q <= 1.0 else 0.0)


def _format_of(r: _Range) -> Format | None:
    version = r.params.get("version", "")
    if r.media == "application/openmetrics-text" and version in _OPENMETRICS_VERSIONS:
        return Format.OPENMETRICS
    if r.media == "text/plain" and version in _TEXT_VERSIONS:
        return Format.TEXT
    if r.media in ("*/*", "text/*"):
        return Format.TEXT
    return None


def negotiate(accept: str) -> Format:
    """The format to answer a request whose ``Accept`` header is ``accept`` (may be empty)."""
    best: Format | None = None
    best_q = 0.0
    for r in _ranges(accept):
        fmt = _format_of(r)
        if fmt is not None and r.q > best_q:
            best, best_q = fmt, r.q
    return best or Format.TEXT


def content_type(fmt: Format) -> str:
    return OPENMETRICS_CONTENT_TYPE if fmt is Format.OPENMETRICS else TEXT_CONTENT_TYPE


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (``gzip`` or ``*`` with a q above 0)."""
    explicit = None
    wildcard = None
    for r in _ranges(accept_encoding):
        if r.media in ("gzip", "x-gzip"):
            explicit = r.q
        elif r.media == "*":
            wildcard = r.q
    if explicit is not None:
        return explicit > 0
    return wildcard is not None and wildcard > 0


# Writing -------------------------------------------------------------------------------------


def escape_label_value(value: str) -> str:
    """A label value between its double quotes (both formats escape the same three)."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def header(name: str, help_text: str, kind: str, fmt: Format) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family (OpenMetrics also escapes quotes)."""
    text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    if fmt is Format.OPENMETRICS:
        text = text.replace('"', '\\"')
    return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


def label_order(names: Sequence[str]) -> tuple[int, ...]:
    """Positions of ``names`` in the order the encoders write labels (sorted by name)."""
    return tuple(sorted(range(len(names)), key=names.__getitem__))


_EOF = "# EOF\n"


def encode_registry(registry: Collector, fmt: Format) -> str:
    """The registry's families in ``fmt``; the OpenMetrics ``# EOF`` line is left for the
    caller to write after whatever follows."""
    if fmt is Format.TEXT:
        return encode_text(registry.collect())
    return encode_openmetrics(registry.collect())


def end_of_body(fmt: Format) -> str:
    """What ends a body: ``# EOF`` in OpenMetrics, nothing in the text format."""
    return _EOF if fmt is Format.OPENMETRICS else ""

"""The koordlet's registry families in the two exposition formats, written as prometheus-client's
encoders write them (labels sorted by name, values as :func:`~koordlet.prom.textvalue.go_float`,
the same escapes), so a body is byte for byte what ``generate_latest`` gave for the same
families (``tests/unit/test_prom.py`` compares them):

- :func:`encode_text`: Prometheus text format 0.0.4. A counter's family is named ``x_total``, an
  info's ``x_info`` (a gauge), an unknown one ``untyped``. ``_created`` samples are left out, as
  the Go client leaves them out (prometheus-client writes them as extra gauge families, which a
  Prometheus then stores as series of their own); ``_gsum`` and ``_gcount`` follow the family as
  gauges of their own.
- :func:`encode_openmetrics`: OpenMetrics 1.0.0, ``_created`` samples in place; without the final
  ``# EOF`` (the caller writes it after what follows).

Metric and label names are the koordlet's, all of the legacy character set: none is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable

from koordlet.prom.families import Metric, Sample
from koordlet.prom.textvalue import go_float

_TEXT_NAMES = {"counter": "_total", "info": "_info"}
_TEXT_TYPES = {
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}


def _value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_value(v)}"' for k, v in sorted(labels.items())) + "}"


def _text_line(s: Sample) -> str:
    stamp = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
    return f"{s.name}{_labels(s.labels)} {go_float(s.value)}{stamp}\n"


def encode_text(families: Iterable[Metric]) -> str:
    """``families`` in the text format 0.0.4 (see the module docstring)."""
    out: list[str] = []
    for metric in families:
        name = metric.name + _TEXT_NAMES.get(metric.type, "")
        kind = _TEXT_TYPES.get(metric.type, metric.type)
        doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        created = metric.name + "_created"
        extra: dict[str, list[str]] = {}
        for s in metric.samples:
            if s.name == created:
                continue
            if s.name in (metric.name + "_gsum", metric.name + "_gcount"):
                extra.setdefault(s.name, []).append(_text_line(s))
            else:
                out.append(_text_line(s))
        for extra_name, lines in sorted(extra.items()):
            out.append(f"# HELP {extra_name} {doc}\n# TYPE {extra_name} gauge\n")
            out.extend(lines)
    return "".join(out)


def encode_openmetrics(families: Iterable[Metric]) -> str:
    """``families`` in OpenMetrics 1.0.0, without the final ``# EOF``."""
    out: list[str] = []
    for metric in families:
        name = metric.name
        doc = _value(metric.documentation)
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        if metric.unit:
            out.append(f"# UNIT {name} {metric.unit}\n")
        for s in metric.samples:
            stamp = "" if s.timestamp is None else f" {s.timestamp}"
            out.append(f"{s.name}{_labels(s.labels)} {go_float(s.value)}{stamp}\n")
    return "".join(out)

"""Typed reads of a configuration document, each failure a :class:`ConfigError` naming the field.

A :class:`Fields` wraps one mapping at one path (``profiles[0].pluginConfig[1].args``) and the
source file; its methods read one key as the Go type upstream declares (``bool``, ``*int32``,
``metav1.Duration``, ``ResourceThresholds``, ``intstr.IntOrString``, ``LabelSelector``...).
A key a document carries that the type does not know is logged (upstream's decoder would drop
it), never silently honoured.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from apis.duration import parse_duration
from descheduler.errors import ConfigError
from descheduler.selectors import (
    Selector,
    SelectorError,
    from_label_selector,
    parse_selector_string,
)

logger = logging.getLogger(__name__)

_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%?\s*$")


class Fields:
    """Typed access to one mapping of a document."""

    def __init__(self, raw: Any, source: str, path: str) -> None:
        self.source = source
        self.path = path
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise self.error("", f"must be a map, got {type(raw).__name__}")
        self.raw: Mapping[str, Any] = raw

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path and key else self.path or key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.where(key), message)

    def warn_unknown(self, known: Iterable[str]) -> None:
        """Log keys this type does not have (``apiVersion``/``kind`` always allowed)."""
        extra = sorted(set(self.raw) - set(known) - {"apiVersion", "kind"})
        if extra:
            logger.warning(
                "%s: %s: unknown field(s) ignored: %s", self.source, self.path, ", ".join(extra)
            )

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def sub(self, key: str) -> Fields:
        return Fields(self.raw.get(key), self.source, self.where(key))

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, default: int | None, *, minimum: int | None = None) -> int | None:
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def number(
        self, key: str, default: float | None, *, minimum: float | None = None
    ) -> float | None:
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool):
            raise self.error(key, f"must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError) as err:
            raise self.error(key, f"must be a number, got {value!r}") from err
        if minimum is not None and number < minimum:
            raise self.error(key, f"must be >= {minimum:g}, got {value!r}")
        return number

    def string(self, key: str, default: str = "", *, choices: Iterable[str] = ()) -> str:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        allowed = tuple(choices)
        if allowed and value not in allowed:
            raise self.error(key, f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings, got {value!r}")
        return tuple(value)

    def duration(self, key: str, default: float | None) -> float | None:
        """A ``metav1.Duration`` (``"5m"``) in seconds."""
        value = self.raw.get(key)
        if value is None:
            return default
        try:
            seconds = parse_duration(str(value))
        except ValueError as err:
            raise self.error(key, f"not a Go duration: {value!r}") from err
        if seconds < 0:
            raise self.error(key, f"must not be negative, got {value!r}")
        return seconds

    def thresholds(self, key: str) -> dict[str, float] | None:
        """A ``ResourceThresholds`` map: resource name → percentage, not negative (a number, or a
        string such as ``"80"`` or ``"80%"``); ``None`` when absent. Upstream's validation refuses
        only negative values (``validation_loadaware.go``): above 100 is never reached."""
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a map of resource name to percentage")
        out: dict[str, float] = {}
        for name, pct in value.items():
            where = f"{key}.{name}"
            if isinstance(pct, bool):
                raise self.error(where, f"must be a percentage, got {pct!r}")
            if isinstance(pct, int | float):
                number = float(pct)
            else:
                m = _PERCENT.match(str(pct))
                if m is None:
                    raise self.error(where, f"must be a percentage, got {pct!r}")
                number = float(m.group(1))
            if number < 0:
                raise self.error(
                    where, f"percentage must be greater than or equal to 0, got {pct!r}"
                )
            out[str(name)] = number
        return out

    def weights(self, key: str) -> dict[str, int] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a map of resource name to weight")
        out: dict[str, int] = {}
        for name, w in value.items():
            if isinstance(w, bool) or not isinstance(w, int):
                raise self.error(f"{key}.{name}", f"must be an integer, got {w!r}")
            out[str(name)] = w
        return out

    def int_or_percent(self, key: str) -> int | str | None:
        """An ``intstr.IntOrString``: an integer or ``"<n>%"``."""
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool):
            raise self.error(key, f"must be an integer or a percentage, got {value!r}")
        if isinstance(value, int):
            if value < 0:
                raise self.error(key, f"must not be negative, got {value}")
            return value
        if isinstance(value, str) and re.fullmatch(r"[0-9]+%", value):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
        raise self.error(key, f"must be an integer or a percentage such as '10%', got {value!r}")

    def label_selector(self, key: str) -> Selector | None:
        """A ``metav1.LabelSelector``; ``None`` when absent."""
        value = self.raw.get(key)
        if value is None:
            return None
        try:
            return from_label_selector(value, key)
        except SelectorError as err:
            raise ConfigError(self.source, self.path, str(err)) from err

    def selector_string(self, key: str) -> Selector | None:
        """A selector in ``labels.Parse`` form (``"a=b,c!=d"``); ``None`` when absent or empty."""
        value = self.string(key)
        if not value:
            return None
        try:
            return parse_selector_string(value)
        except SelectorError as err:
            raise self.error(key, str(err)) from err

    def items(self, key: str) -> list[Fields]:
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(key, "must be a list")
        return [Fields(v, self.source, f"{self.where(key)}[{i}]") for i, v in enumerate(value)]

"""Value converters of the settings table: a YAML scalar or a flag string in, a checked value
out; TypeError or ValueError (with the reason) on bad input, which the loader turns into a
:class:`~koordlet.errors.ConfigError` naming the flag or the file and the field. Each is named
for what it accepts; each row of :data:`koordlet.config.settings.SETTINGS` names one.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable

from apis.duration import parse_duration
from apis.gobool import parse_go_bool
from koordlet.config.model import RUNTIME_HOOK_POINTS
from koordlet.errors import ConfigError


def string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"must be a string, got {value!r}")
    return value


def nonempty(value: object) -> str:
    text = string(value).strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def abs_path(value: object) -> str:
    text = nonempty(value)
    if not os.path.isabs(text):
        raise ValueError(f"must be an absolute path, got {text!r}")
    return os.path.normpath(text)


def boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return parse_go_bool(string(value).strip())


def choice(*choices: str) -> Callable[[object], str]:
    def convert(value: object) -> str:
        text = string(value).strip().lower()
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
        return text

    return convert


_PLAIN_SECONDS = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")


def duration_seconds(text: str) -> float:
    """Seconds from a Go duration (:func:`apis.duration.parse_duration`: ``300ms``, ``1m30s``,
    ``-1.5h``) or, as our flags also take, a plain number of seconds (``1.5``); ValueError."""
    text = text.strip()
    if _PLAIN_SECONDS.fullmatch(text):
        return float(text)
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError(
            f"invalid duration {text!r} (want e.g. 1s, 500ms, 1m30s or seconds)"
        ) from None


def positive_duration(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a duration, got {value!r}")
    seconds = duration_seconds(value) if isinstance(value, str) else float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"must be a positive duration, got {value!r}")
    return seconds


def duration_or_zero(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a duration, got {value!r}")
    seconds = duration_seconds(value) if isinstance(value, str) else float(value)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"must be a duration of 0 or more, got {value!r}")
    return seconds


def finite(value: object) -> float:
    """A finite number from a number or its text; TypeError/ValueError naming the value."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError as err:
        raise ValueError(f"must be a number, got {value!r}") from err
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value!r}")
    return number


def non_negative(value: object) -> float:
    number = finite(value)
    if number < 0:
        raise ValueError(f"must be a number of 0 or more, got {value!r}")
    return number


def percent(value: object) -> float:
    number = non_negative(value)
    if number > 100:
        raise ValueError(f"must be a percent from 0 to 100, got {value!r}")
    return number


def cpu_share(value: object) -> float:
    """A fraction of one core, above 0 and at most 1."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"must be a number, got {value!r}")
    try:
        share = float(value)
    except ValueError:
        raise ValueError(f"must be a number, got {value!r}") from None
    if not (math.isfinite(share) and 0 < share <= 1):
        raise ValueError(f"must be above 0 and at most 1 (a fraction of one core), got {value!r}")
    return share


def kube_dir(value: object) -> str:
    text = nonempty(value)
    parts = text.strip("/").split("/")
    if os.path.isabs(text) or "." in parts or ".." in parts or "" in parts:
        raise ValueError(f"must be a relative directory below the cgroup roots, got {text!r}")
    if parts[-1] not in ("kubepods", "kubepods.slice"):  # the kubelet names nothing else
        raise ValueError(f"must end in kubepods/ or kubepods.slice/, got {text!r}")
    return text


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def node_name(value: object) -> str:
    name = nonempty(value)
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"must be a valid Kubernetes node name (DNS subdomain), got {name!r}")
    return name


def addr(value: object) -> str:
    text = nonempty(value)
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"must be HOST:PORT with a port in 0..65535, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"bad IPv6 address in {text!r}") from None
    elif ":" in host or "[" in host or "]" in host:
        raise ValueError(f"an IPv6 host needs brackets ([::1]:9316), got {text!r}")
    return text


def optional_path(value: object) -> str:
    return string(value).strip()


def verbosity(text: str) -> str:
    """``-v N`` (klog's verbosity) as a log level: 4 and above is debug, below that info."""
    try:
        level = int(text)
    except ValueError:
        raise ConfigError(f"must be a whole number, got {text!r}", source="-v") from None
    return "debug" if level >= 4 else "info"


def optional_host(value: object) -> str:
    """A host name or IP address (no scheme, port or path); empty for none."""
    text = string(value).strip()
    if any(c in text for c in "/ \t") or text.count(":") == 1:
        raise ValueError(
            f"must be a host name or IP address (no scheme, port or path), got {text!r}"
        )
    return text


def optional_file(value: object) -> str:
    """A file path, made absolute against the working directory; empty for none."""
    text = string(value).strip()
    return os.path.abspath(text) if text else ""


def optional_abs_path(value: object) -> str:
    text = string(value).strip()
    return abs_path(text) if text else ""


_STRATEGY_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def strategy_names(value: object) -> frozenset[str]:
    """``a,b`` (flag or YAML string) or a YAML list of strategy table names."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple | frozenset | set):
        items = [string(item).strip() for item in value]
    else:
        raise TypeError(f"must be a comma-separated string or a list of names, got {value!r}")
    names = frozenset(item for item in items if item)
    bad = sorted(n for n in names if not _STRATEGY_NAME.fullmatch(n))
    if bad:
        raise ValueError(f"not strategy names (lower case, as in the strategy table): {bad}")
    return names


def disk_mb(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"must be a whole number of MiB, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"must be a whole number of MiB, got {value!r}")
        number = int(text)
    elif isinstance(value, int):
        number = value
    else:
        raise TypeError(f"must be a whole number of MiB, got {value!r}")
    if not 1 <= number <= 10240:
        raise ValueError(f"must be between 1 and 10240 MiB, got {number}")
    return number


def tcp_port(allow_zero: bool) -> Callable[[object], int]:
    """A TCP port (1..65535), or 0 too when ``allow_zero``."""

    def convert(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(f"must be a TCP port, got {value!r}")
        text = str(value).strip()
        lowest = 0 if allow_zero else 1
        if not (text.isascii() and text.isdigit()) or not lowest <= int(text) <= 65535:
            raise ValueError(f"must be a TCP port{' or 0' if allow_zero else ''}, got {value!r}")
        return int(text)

    return convert


def hook_stages(value: object) -> frozenset[str]:
    """``A,B`` (flag or YAML string) or a YAML list of Koordinator's runtime hook stage names."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple | frozenset | set):
        items = [string(item).strip() for item in value]
    else:
        raise TypeError(f"must be a comma-separated string or a list of stages, got {value!r}")
    stages = frozenset(item for item in items if item)
    bad = sorted(stages - set(RUNTIME_HOOK_POINTS))
    if bad:
        raise ValueError(f"unknown stages {bad}; known: {', '.join(RUNTIME_HOOK_POINTS)}")
    return stages


def optional_socket(value: object) -> str:
    text = string(value).strip()
    return abs_path(text) if text else ""


def factor(value: object) -> float:
    number = finite(value)
    if number < 1.0:
        raise ValueError(f"must be a number >= 1, got {value!r}")
    return number


def plugin_index(value: object) -> str:
    text = string(value).strip()
    if not re.fullmatch(r"[0-9]{2}", text):
        raise ValueError(f"must be two digits (NRI's plugin index), got {value!r}")
    return text


def plugin_name(value: object) -> str:
    text = nonempty(value)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", text):
        raise ValueError(f"must be letters, digits, '_', '.', '-', got {value!r}")
    return text


def evictions(value: object) -> int:
    """A whole number of evictions per round, 0 (no cap) to 1000."""
    number = whole_number(value)
    if not 0 <= number <= 1000:
        raise ValueError(f"must be between 0 (no cap) and 1000, got {number}")
    return number


def requests_in_flight(value: object) -> int:
    """A whole number of requests, 1 to 1000."""
    number = whole_number(value)
    if not 1 <= number <= 1000:
        raise ValueError(f"must be between 1 and 1000, got {number}")
    return number


def whole_number(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"must be a whole number, got {value!r}")
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"must be a whole number, got {value!r}")
    return int(text)

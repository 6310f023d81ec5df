"""Tests of the whole daemon, in the test's event loop and as the real ``koordlet`` process.

Shared helpers: a free loopback port and the Prometheus text format read back into samples.
"""

from __future__ import annotations

import socket

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name → ``(labels, value)`` of each sample."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by sample name."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def one_value(samples: Samples, name: str, /, **labels: str) -> float | None:
    """The value of the one sample ``name`` whose labels include ``labels``; None if absent."""
    hits = [
        value
        for got, value in samples.get(name, [])
        if all(got.get(k) == v for k, v in labels.items())
    ]
    if len(hits) > 1:
        raise AssertionError(f"{len(hits)} samples of {name} match {labels}")
    return hits[0] if hits else None

"""The ``/metrics`` bodies, built at most once per collection tick and served as bytes.

A scrape used to rebuild the whole exposition (3,480 samples at 200 pods: 59 ms of the event
loop's CPU), so eight clients scraping in a loop kept the loop busy and starved the protective
loops that share it. :class:`Exposition` builds a body when the first request after a collection
tick asks for it, keeps it, and answers every later request of that tick with the same bytes: no
request load makes more than one build a tick per format. The gzip variant is compressed once
from it on first demand (the plain bytes are kept only when a plain request asked for them). A
body also expires after ``max_age`` seconds (one collect interval), so that a stalled collection
cannot freeze what is served (the freshness rules of the exporter and the loop-health gauges are
applied again at each build), and is then dropped, so that nothing is held between scrapes.

Nothing is built while nobody scrapes: an idle koordlet pays nothing for its exposition.

Content: the registry's families (self metrics, the strategies', the evictor's) written by
prometheus-client's encoders (:mod:`koordlet.server.textformat`: no ``_created`` gauges in the
text format), then the exporter's usage families written by
:class:`~koordlet.server.render.FamilyRenderer`, then ``# EOF`` in OpenMetrics.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from koordlet.prom import Collector
from koordlet.server.exporter import FAMILIES
from koordlet.server.render import FamilyRenderer
from koordlet.server.textformat import Format, encode_registry, end_of_body

logger = logging.getLogger(__name__)

GZIP_LEVEL = 1
"""zlib level of the gzip variant: the repetitive label text shrinks about tenfold at level 1,
for a third of level 6's CPU (docs/benchmarks.md)."""


@dataclass(slots=True)
class _Body:
    generation: object
    built_at: float
    plain: bytes | None = None
    gzipped: bytes | None = None


class Exposition:
    """The cached ``/metrics`` bodies; see the module docstring.

    :param registry: the self-metrics registry (without the exporter).
    :param renderer: writes the exporter's families; None serves the registry alone.
    :param generation: the collection tick's number: a body is rebuilt when it changes.
    :param max_age: seconds after which a body is rebuilt even without a new tick.
    :param clock: monotonic seconds.

    Raises ``ValueError`` when a registry family has the name of an exporter family (a
    registry refuses such a clash at registration; the exporter is not registered).
    """

    def __init__(
        self,
        registry: Collector,
        renderer: FamilyRenderer | None,
        *,
        generation: Callable[[], object],
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_age > 0:
            raise ValueError(f"max_age must be positive, got {max_age}")
        self._registry = registry
        self._renderer = renderer
        self._generation = generation
        self._max_age = max_age
        self._clock = clock
        self._bodies: dict[Format, _Body] = {}
        self.builds = 0
        """Bodies built since start (each format counts)."""
        if renderer is not None:
            clash = sorted({m.name for m in registry.collect()} & {f.name for f in FAMILIES})
            if clash:
                raise ValueError(f"registry families clash with the exporter's: {clash}")

    def body(self, fmt: Format, *, gzipped: bool) -> bytes:
        """The body in ``fmt``, gzip-compressed when asked; built if the tick moved on."""
        generation = self._generation()
        now = self._clock()
        body = self._bodies.get(fmt)
        if body is None or body.generation != generation or now - body.built_at >= self._max_age:
            body = self._bodies[fmt] = _Body(generation, now)
            self._expire_later(fmt, body)
        if not gzipped:
            if body.plain is None:
                body.plain = self._build(fmt)
            return body.plain
        if body.gzipped is None:
            # The plain bytes are kept only when a plain request asked for them.
            plain = body.plain if body.plain is not None else self._build(fmt)
            body.gzipped = gzip.compress(plain, GZIP_LEVEL, mtime=0)
        return body.gzipped

    def held(self) -> list[Format]:
        """The formats whose body is held now."""
        return list(self._bodies)

    def _expire_later(self, fmt: Format, body: _Body) -> None:
        """Drop ``body`` once it is stale, so a koordlet scraped rarely does not hold a body
        (890 KB of text at 200 pods) between scrapes. Outside an event loop (tests), never."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_later(self._max_age, self._expire, fmt, body)

    def _expire(self, fmt: Format, body: _Body) -> None:
        if self._bodies.get(fmt) is body:
            del self._bodies[fmt]

    def _build(self, fmt: Format) -> bytes:
        self.builds += 1
        parts = [encode_registry(self._registry, fmt).encode()]
        if self._renderer is not None:
            parts.extend(self._renderer.chunks(fmt))
        parts.append(end_of_body(fmt).encode())
        return b"".join(parts)

"""The files the koordlet keeps in its state directory, as one health view: the originals journal
(``originals.jsonl``, what ``koordlet reset`` puts back) and the audit log (``audit.jsonl``).

Neither stops protection when the disk refuses a write (``ENOSPC``, a read-only state
directory): each holds what it could not write and writes it once the disk takes it
(:mod:`koordlet.executor.originals`, :mod:`koordlet.executor.audit`). This module says so where
an operator looks:

- :meth:`StateFiles.problems`: one line per file that cannot be written now, for ``/readyz``'s
  answer (still ``200``: the node is protected, what is at risk is the record of it) and
  ``koordlet status``;
- :meth:`StateFiles.as_dict`: both files' counters for ``/debug/summary``;
- as a Prometheus collector, fresh samples per scrape:
  ``koordlet_state_write_errors_total{file}`` (failed attempts to write the file) and
  ``koordlet_state_pending_records{file}`` (records held in memory for the disk); ``file`` is
  ``originals`` or ``audit``. ``docs/metrics.md`` lists them, and the shipped alert
  ``KoordletStateNotWritable`` fires on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from koordlet.executor.audit import AuditLog
from koordlet.executor.originals import OriginalsJournal
from koordlet.prom import CounterMetricFamily, GaugeMetricFamily, Metric

ORIGINALS = "originals"
"""The ``file`` label of the originals journal."""
AUDIT = "audit"
"""The ``file`` label of the audit log."""


class StateFiles:
    """The journal and the audit log, judged together (either may be None: not started)."""

    def __init__(self, journal: OriginalsJournal | None, audit: AuditLog | None) -> None:
        self.journal = journal
        self.audit = audit

    def retry(self) -> bool:
        """Write what the journal holds (the audit log's thread retries by itself); True when
        nothing is held. Blocking file I/O: call it in a worker thread."""
        return self.journal.retry() if self.journal is not None else True

    def needs_retry(self) -> bool:
        """Whether :meth:`retry` has something to write (cheap: no I/O)."""
        return self.journal is not None and self.journal.needs_retry

    def problems(self) -> list[str]:
        """One line per file the disk refuses now; empty when both are written."""
        out = []
        journal, audit = self.journal, self.audit
        if journal is not None:
            stats = journal.stats()
            if stats["last_error"]:
                out.append(
                    f"{journal.path} cannot be written ({stats['last_error']}); "
                    f"{stats['pending']} originals held in memory for koordlet reset"
                )
        if audit is not None and audit.last_error:
            out.append(
                f"{audit.path} cannot be written ({audit.last_error}); "
                f"{audit.pending} audit entries held in memory"
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        """Both files' counters, JSON-ready, with :meth:`problems`."""
        return {
            ORIGINALS: None if self.journal is None else self.journal.stats(),
            AUDIT: None if self.audit is None else self.audit.stats(),
            "problems": self.problems(),
        }

    # Prometheus collector -------------------------------------------------------------------

    def describe(self) -> list[Metric]:
        """The families without samples (checked by the registry at registration)."""
        return list(self._families(sample=False))

    def collect(self) -> Iterator[Metric]:
        return self._families(sample=True)

    def _families(self, *, sample: bool) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "koordlet_state_write_errors",
            "Attempts to write a file of the state directory (originals journal, audit log) "
            "that failed; what they carried is held in memory and written again.",
            labels=("file",),
        )
        pending = GaugeMetricFamily(
            "koordlet_state_pending_records",
            "Records held in memory because the state directory refused them; 0 once written.",
            labels=("file",),
        )
        if sample:
            if self.journal is not None:
                errors.add_metric((ORIGINALS,), float(self.journal.errors))
                pending.add_metric((ORIGINALS,), float(self.journal.pending))
            if self.audit is not None:
                errors.add_metric((AUDIT,), float(self.audit.errors))
                pending.add_metric((AUDIT,), float(self.audit.pending))
        yield errors
        yield pending


__all__ = ["AUDIT", "ORIGINALS", "StateFiles"]

"""Count a run's warnings by kind and message, show each once, and keep the counts.

A sweep task's stderr is lost with its worker process; :class:`WarningTally` keeps what the task
warned about (with how often) for its stored result, e.g. ``result["warnings"] = tally.summary()``.
"""

from __future__ import annotations

import warnings

__all__ = ["WarningTally"]


class WarningTally:
    """Within ``with``: every warning is counted by (category, first 80 characters of its message)
    and shown the first time only (messages that differ in a number later on count as one kind);
    :meth:`summary` gives the counts (a task's result keeps them: workers' stderr is lost)."""

    def __enter__(self) -> WarningTally:
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("always")  # count repeats too (the per-location registry would hide them)
        self._show, self.counts = warnings.showwarning, {}
        warnings.showwarning = self._record
        return self

    def _record(self, message, category, filename, lineno, file=None, line=None) -> None:
        key = (category.__name__, str(message)[:80])
        if key not in self.counts:
            self._show(message, category, filename, lineno, file, line)
        self.counts[key] = self.counts.get(key, 0) + 1

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)

    def summary(self, limit: int = 1000) -> str:
        text = "; ".join(f"{n}x {cat}: {msg[:200]}" for (cat, msg), n in self.counts.items())
        return text[:limit]

"""The exception a check of the log fold raises for a violated invariant (caught and reported by
:class:`~affidavit.verify._fold.LogFold` with the event's version)."""

from __future__ import annotations


class _Violation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(detail)
        self.invariant = invariant
        self.detail = detail

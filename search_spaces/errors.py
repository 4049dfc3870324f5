"""The search-space package's exceptions (standalone: search_spaces imports nothing of the project)."""

from __future__ import annotations


class SearchSpaceError(ValueError):
    """A search space is malformed; `key` is the parameter it concerns (None: the space as a whole).

    The message reads `<key>: <reason>` so callers can prefix it with a file and a field.
    """

    def __init__(self, key: str | None, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}" if key else reason)

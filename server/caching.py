"""HTTP caching of the hot reads, and the answers the server keeps while an experiment's trials do not change.

The best configs (`/experiments/{name}/best`, `/best/arms`) and the trial lists answer with

    ETag: "<hash of the body>"        Cache-Control: no-cache

so a client or a proxy may keep an answer and ask again with `If-None-Match: <its ETag>`: an unchanged answer is
then a 304 without a body. `no-cache` lets them keep it but makes them ask every time, because a trial that
finishes changes the best config at once and the API never serves an older one. The ETag is the body's hash, so
it is the same from every server process over the same database and survives a restart.

`AnswerCache` keeps the best configs and the counts of filtered trial lists per experiment, under the
experiment's `trials_version` (`Storage.trials_version`, one primary-key read) read *before* the answer was
computed: a kept answer is never older than its version, and a request that reads the same version is served
the kept answer without reading a trial. Any change of a trial record (a trial created, started, finished,
interrupted or re-queued) moves the version on, so the next request computes the answer afresh.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from fastapi import Request, Response

CACHE_CONTROL = "no-cache"  # keep, but ask again (If-None-Match) before every use
ANSWER_CACHE_SIZE = 4096  # answers kept (experiments x arms x batch sizes x list filters)
MISSING = object()  # AnswerCache.get: nothing kept for this version
NOT_MODIFIED = {304: {"description": "Not modified: the answer whose ETag the request's `If-None-Match` names is "
                                     "still the answer (no body)."}}  # fmt: skip


def etag_of(body: bytes) -> str:
    """A strong ETag for `body`: the first 128 bits of its SHA-256, quoted (SHA-256 runs on the CPU's SHA
    instructions: 14 us for a 25 KB trial page, where BLAKE2b takes 36)."""
    return f'"{hashlib.sha256(body).hexdigest()[:32]}"'


def if_none_match(request: Request, etag: str) -> bool:
    """Whether the request's `If-None-Match` names `etag` (or is `*`): the client already has this answer. The
    comparison is weak, as RFC 9110 wants for If-None-Match: `W/"x"` matches `"x"`."""
    header = request.headers.get("if-none-match")
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))


def cached_json(request: Request, body: bytes, etag: str | None = None) -> Response:
    """`body` as a JSON answer with its ETag and Cache-Control, or a 304 without a body when the client has it."""
    headers = {"ETag": etag or etag_of(body), "Cache-Control": CACHE_CONTROL}
    if if_none_match(request, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


class AnswerCache:
    """Answers kept under the `trials_version` of their experiment (see the module docstring); the least recently
    stored go first once `size` are kept."""

    def __init__(self, size: int = ANSWER_CACHE_SIZE) -> None:
        self._answers: OrderedDict[Hashable, tuple[int, Any]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: int) -> Any:
        """The answer kept under `key` for this version of the experiment's trials, else MISSING."""
        kept = self._answers.get(key)
        return kept[1] if kept is not None and kept[0] == version else MISSING

    def put(self, key: Hashable, version: int, answer: Any) -> Any:
        """Keep `answer` under `key`, computed after `version` was read (unless a newer one is kept); returns it."""
        with self._lock:
            kept = self._answers.get(key)
            if kept is not None and kept[0] > version:  # a slower request of an older version finished last
                return answer
            self._answers[key] = (version, answer)
            self._answers.move_to_end(key)
            while len(self._answers) > self._size:
                self._answers.popitem(last=False)
        return answer

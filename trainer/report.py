"""Where the trainer's metrics go: the `Reporter` protocol and its JSON-lines implementation.

The trainer calls `intermediate` after evaluations and progress steps and `final` once at the end. Other
implementations (the NNI trial entry, a controller) live with their users; the trainer imports none of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Protocol, TextIO

from trainer.result import TrainResult


class Reporter(Protocol):
    def intermediate(self, metrics: dict[str, Any]) -> None:
        """A progress or evaluation record (samples, loss, mlm_accuracy, ...)."""

    def final(self, result: TrainResult) -> None:
        """The run's final result (status, samples_to_target, ...); called exactly once."""


class JsonLinesReporter:
    """One JSON object per line: {"kind": "intermediate" | "final", ...}, flushed after every record."""

    def __init__(self, path: str | Path | None = None, stream: TextIO | None = None):
        self._own = path is not None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._stream: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        else:
            self._stream = stream or sys.stdout
        self.finals = 0  # final records written: the CLI writes one for a run that ended before train() could

    def _write(self, kind: str, record: dict[str, Any]) -> None:
        self._stream.write(json.dumps({"kind": kind, **record}, default=float) + "\n")
        self._stream.flush()

    def intermediate(self, metrics: dict[str, Any]) -> None:
        self._write("intermediate", metrics)

    def final(self, result: TrainResult) -> None:
        self._write("final", result.to_dict())
        self.finals += 1

    def close(self) -> None:
        if self._own:
            self._stream.close()


class NullReporter:
    """Reports nothing; used on ranks other than 0."""

    def intermediate(self, metrics: dict[str, Any]) -> None:
        pass

    def final(self, result: TrainResult) -> None:
        pass


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines report file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

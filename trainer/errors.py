"""The trainer's exceptions. Everything the trainer raises on purpose derives from `TrainerError`.

`DataWarning` is the one warning (not an error): data that trains, but not as its settings suggest (a part of it
skipped, a setting that does nothing on it).
Messages say what was wrong, where (file, dotted config key, shard) and what to do about it.
"""


class TrainerError(Exception):
    """Root of all errors the trainer raises deliberately."""


class ConfigError(TrainerError):
    """A config file or override is malformed: unknown key, wrong type or out-of-range value."""


class DataError(TrainerError):
    """A data shard, vocabulary or text file is missing or malformed."""


class DataWarning(UserWarning):
    """Data that trains, but not as the user may think (for example an empty shard that is skipped)."""


class CheckpointError(TrainerError):
    """A checkpoint or weights file cannot be read or does not fit the model."""


class DiskFullError(CheckpointError):
    """A checkpoint could not be written because its disk is full: the machine's fault, not the configuration's."""


class BackendUnavailableError(TrainerError):
    """An optional backend (for example NVIDIA apex) was requested but cannot be imported."""


class FinalSaveError(CheckpointError):
    """The run ended and its final record was written, but its final checkpoint could not be saved: the result
    stands (`result`), the latest checkpoint is an earlier one."""

    def __init__(self, message: str, result) -> None:
        super().__init__(message)
        self.result = result  # the run's TrainResult, as its final record has it


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or container stopping the job), raised where the run is, as Ctrl-C is: the run ends as
    interrupted, with its final record, and the same command resumes it (`python -m trainer` installs the handler)."""


def crash_reason(error: BaseException) -> str:
    """The final record's reason for an error the trainer did not expect: its type and message, one line."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message[:500]}" if message else type(error).__name__


def error_line(e: Exception) -> str:
    """The line of an exception's text that says what went wrong: Triton's compile errors carry it in
    `error_message` (their text starts with the source position), others in their last non-empty line."""
    text = getattr(e, "error_message", None) or str(e)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]

"""`python -m trainer --config CFG.yaml [dotted.key=value ...]` (or under torchrun for several processes).

Exit codes (`trainer.result`): 0 reached_target or budget_exhausted, 1 failed, 2 bad config (nothing
trained), 3 diverged, 130 interrupted (Ctrl-C), 143 stopped by SIGTERM (a scheduler, a container's stop; one
process: torchrun ends its ranks itself): both end the run with its final record, and the same command resumes it
from its last checkpoint. Under torchrun an error every rank reaches alike (the config's, the data's, a
checkpoint's) is said once, by rank 0 (`say_once`), as is a warning about the data.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import os
import signal
import sys
import threading
import time
import warnings

from trainer.config import TrainerConfig, dump_config, load_config, refuse_unread, shipped_config_names
from trainer.disk import free_text
from trainer.errors import ConfigError, DataError, DataWarning, FinalSaveError, Terminated, TrainerError, crash_reason
from trainer.report import JsonLinesReporter, Reporter
from trainer.result import EXIT_BAD_CONFIG, EXIT_INTERRUPTED, EXIT_TERMINATED, TrainStatus


class _Once(argparse.Action):
    """An option given once: a second --config replaced the first without a word (the first file's settings lost)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if (before := getattr(namespace, self.dest)) is not None:
            parser.error(f"{option_string} given twice ({before} and {values}): a run has one config file; put the "
                         "settings of the other in it, or give them as key=value overrides")  # fmt: skip
        setattr(namespace, self.dest, values)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="BERT pretraining (MLM + NSP).")
    shipped = shipped_config_names()
    parser.add_argument("--config", action=_Once, help=f"YAML trainer config, or the name of a shipped one ({shipped})")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optimizer.lr=1e-3")
    return parser.parse_intermixed_args(argv)  # options and overrides in any order


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.config is None and not args.overrides and not args.print_config:  # as a config file that sets nothing
        return refuse(ConfigError(
            f"no config given: pass --config FILE, or the name of a shipped config ({shipped_config_names()}); with "
            "nothing given the trainer would train BERT-large with every default (to do so, pass a file holding {})"
        ))  # fmt: skip
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        return refuse(e)
    # The config alone, before PyTorch loads (a second or more): it may be printed on a machine without the device
    # it asks for.
    if args.print_config:
        print(dump_config(cfg), end="")
        try:  # printed, and refused as a run would refuse it
            refuse_unread(cfg)
        except ConfigError as e:
            return refuse(e)
        return 0
    # torch loads only after the config is valid, so a bad config is refused at once. Ctrl-C or SIGTERM while it
    # loads (a second or two) or while the run is checked ends the run as one in its set-up does, with its final
    # record (SIGTERM killed the process without a word).
    on_main = threading.current_thread() is threading.main_thread()  # where Python delivers signals
    catch = on_main and _one_process()
    previous = signal.signal(signal.SIGTERM, _terminate) if catch else None
    loaded = False
    try:
        try:
            with _stops_held(sigterm=catch) if on_main else contextlib.nullcontext():
                import trainer.train  # noqa: F401  (the model and the loop load here too, under this guard)
                from trainer.distributed import check_device, dist_env_from_environ
                from trainer.preflight import refuse_before_work

            loaded = True
            check_device(cfg.device, dist_env_from_environ())  # before the reporter makes its file
            refuse_before_work(cfg)
            try:
                reporter = JsonLinesReporter(cfg.log.jsonl)
            except OSError as e:
                raise ConfigError(f"log.jsonl: cannot write the report file {cfg.log.jsonl!r}: {e}") from None
        except ConfigError as e:
            return refuse(e)
    except KeyboardInterrupt as e:
        return _interrupted_in_set_up(cfg, e, loaded)
    finally:
        if catch:
            signal.signal(signal.SIGTERM, previous)

    return train_to_exit_code(cfg, reporter)


@contextlib.contextmanager
def _stops_held(sigterm: bool):
    """Ctrl-C (and SIGTERM, with `sigterm`) held until the block ends, then raised as KeyboardInterrupt (Terminated):
    raised where it came, inside an extension module's import (numpy's, as torch loads), it broke that import
    ("ImportError: cannot load module more than once per process") instead of stopping the run."""
    held: list[int] = []
    handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    if sigterm:
        handlers[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)
    if handlers[signal.SIGINT] is not signal.default_int_handler:  # ignored (a background job), or the caller's own
        del handlers[signal.SIGINT]
    for signum in handlers:
        signal.signal(signum, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if held:
        raise Terminated if held[0] == signal.SIGTERM else KeyboardInterrupt


def _one_process() -> bool:
    """Not a rank of several (under torchrun, torchrun ends its ranks: a rank waiting in a collective on a dead peer
    would not run a Python handler until that wait ends)."""
    return os.environ.get("WORLD_SIZE", "1").strip() in ("", "1")


def _terminate(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM (a launcher passing its own on)
    raise Terminated  # must not cut the final record short


def _interrupted_in_set_up(cfg: TrainerConfig, e: KeyboardInterrupt, loaded: bool) -> int:
    """Ctrl-C or SIGTERM before the run's loop: its final record (when `log.jsonl` can be written), one line, exit
    130 or 143. `loaded`: PyTorch has loaded (the resume hint reads the checkpoint folder through it)."""
    reason = f"interrupted ({_stopped_by(e)}) " + ("before training began" if loaded else "while PyTorch loaded, "
                                                   "before anything began")  # fmt: skip
    try:
        reporter = JsonLinesReporter(cfg.log.jsonl)
    except OSError:  # no record where the report file cannot be written: the line still says how the run ended
        reporter = None
    try:
        return _interrupted(cfg, reporter, e, reason, resume_hint(cfg) if loaded else None)
    finally:
        if reporter is not None:
            reporter.close()


def _stopped_by(e: KeyboardInterrupt) -> str:
    return "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"


def _interrupted(
    cfg: TrainerConfig, reporter: Reporter | None, e: KeyboardInterrupt, reason: str, again: str | None
) -> int:
    """A run stopped by Ctrl-C or SIGTERM outside its loop: its final record (none without a `reporter`), one line
    (by rank 0: Ctrl-C reaches every rank under torchrun) with what to do next (`again`), and exit code 130 or 143."""
    if reporter is not None:
        record_unended(cfg, reporter, reason, "interrupted")
    if _is_rank_0():
        print(f"error: {reason}" + (f"; {again}" if again else ""), file=sys.stderr)
    return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def _is_rank_0() -> bool:
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _said_as_a_warning(message, category, filename, lineno, line=None, *, otherwise) -> str:
    """A DataWarning as the trainer's other warnings read ("warning: ..."), without the source line that raised it;
    any other warning as `otherwise` (the formatter in place before) shows it."""
    if issubclass(category, DataWarning):
        return f"warning: {message}\n"
    return otherwise(message, category, filename, lineno, line)


def train_to_exit_code(cfg: TrainerConfig, reporter: Reporter) -> int:
    """Train as configured, with SIGTERM caught where it can be; say how the run ended and return its exit code. An
    error outside the loop (which records its own) gets the final record the run did not write."""
    from trainer.distributed import cleanup, dist_env_from_environ
    from trainer.train import train

    # One process (`_one_process`), in the main thread (where Python delivers signals).
    catch = threading.current_thread() is threading.main_thread() and _one_process()
    full = False  # the run stopped on a full disk
    previous = signal.signal(signal.SIGTERM, _terminate) if catch else None
    formatwarning = warnings.formatwarning
    warnings.formatwarning = functools.partial(_said_as_a_warning, otherwise=formatwarning)  # restored below
    try:
        with warnings.catch_warnings():
            if not dist_env_from_environ().is_main:  # every rank reads the same files: rank 0 names what it skips
                warnings.simplefilter("ignore", DataWarning)
            result = train(cfg, reporter)
    except ConfigError as e:
        return refuse(e)
    except FinalSaveError as e:  # its final record is written: not a second one
        print(f"error: {e}", file=sys.stderr)
        return TrainStatus.FAILED.exit_code
    except TrainerError as e:  # before the loop (a checkpoint that does not load, say): every rank reads it alike
        record_unended(cfg, reporter, str(e), "data" if isinstance(e, DataError) else "crash")
        return say_once(str(e), TrainStatus.FAILED.exit_code)
    except KeyboardInterrupt as e:
        reason = str(e) or f"interrupted ({_stopped_by(e)}) before training began"
        return _interrupted(cfg, reporter, e, reason, resume_hint(cfg) or "set checkpoint.dir to make a run resumable")
    except OSError as e:
        if e.errno != errno.ENOSPC:
            record_unended(cfg, reporter, crash_reason(e), "crash")
            raise
        full = True  # a file the run writes as it goes (log.jsonl, log.mlperf) on a full disk: no record can follow
        print(f"error: {no_space_left(cfg, e)}", file=sys.stderr)
        return TrainStatus.FAILED.exit_code
    except Exception as e:  # outside the loop (which records its own): a bug, a collective whose peer died
        record_unended(cfg, reporter, crash_reason(e), "crash")
        raise
    finally:
        warnings.formatwarning = formatwarning
        if catch:
            signal.signal(signal.SIGTERM, previous)
        try:
            reporter.close()
        except OSError:  # what it could not write before: said above
            if not full:
                raise
        cleanup()
    if result.status is TrainStatus.FAILED and result.error == "data":  # files every rank reads alike
        return say_once(str(result.reason), result.status.exit_code)
    if result.status is TrainStatus.FAILED:  # out of memory, a crash: a rank's own
        print(f"error: {result.reason}", file=sys.stderr)
    elif dist_env_from_environ().is_main:  # every rank returns the result; rank 0 says how the run ended
        print(f"finished: {result.status.value}" + (f" ({result.reason})" if result.reason else ""), file=sys.stderr)
    return result.status.exit_code


# How long a rank other than 0 keeps an error every rank may reach to itself, waiting for torchrun to end it
# (`say_once`)
OWN_ERROR_AFTER_S = 10.0


def refuse(error: ConfigError) -> int:
    """Say a config error once (`say_once`), return its exit code (2)."""
    return say_once(str(error), EXIT_BAD_CONFIG)


def say_once(message: str, exit_code: int) -> int:
    """Say an error that every rank reaches alike once, return `exit_code`: a config error, or one of the data or
    of a checkpoint (files every rank reads). Under torchrun rank 0 says it, the others say nothing and wait for
    torchrun, which ends them (here, with this exit code) once rank 0 has exited. A rank > 0 whose error is its own
    (a LOCAL_RANK without a GPU of its own, a shard its node cannot read; rank 0 then goes on, waiting for it) would
    never be ended: after `OWN_ERROR_AFTER_S` it says it, naming its rank. Not quiet at once: torchrun ends every
    rank when one exits, so rank 0 could be ended before it said anything."""
    rank = os.environ.get("RANK", "0").strip()
    if rank in ("", "0"):
        print(f"error: {message}", file=sys.stderr)
        return exit_code
    stop = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _rank_ended) if stop else None
    try:
        time.sleep(OWN_ERROR_AFTER_S)
    except (KeyboardInterrupt, _RankEnded):  # ended by torchrun (or Ctrl-C): rank 0 said it
        return exit_code
    finally:
        if stop:
            signal.signal(signal.SIGTERM, previous)
    print(f"error (rank {rank}): {message}", file=sys.stderr)
    return exit_code


class _RankEnded(Exception):
    """SIGTERM to a rank > 0 waiting with an error rank 0 says (`say_once`)."""


def _rank_ended(signum, frame):
    raise _RankEnded


def no_space_left(cfg, error: OSError) -> str:
    """What to say about a write that found the disk full (ENOSPC) mid-run: the files the run writes as it goes and
    the free space under each, what to do, and how to go on."""
    paths = {key: path for key, path in (("log.jsonl", cfg.log.jsonl), ("log.mlperf", cfg.log.mlperf),
                                         ("checkpoint.dir", cfg.checkpoint.dir)) if path}  # fmt: skip
    where = "; ".join(f"{key} {path}: {free_text(path)}" for key, path in paths.items())
    again = resume_hint(cfg) or "then run it again"
    said = f"{error.filename}: {error.strerror}" if error.filename else error.strerror or str(error)
    return f"a file of the run could not be written: {said} ({where}); free space there, or choose other paths; {again}"


def resume_hint(cfg) -> str | None:
    """What the same command does after the run stopped early (None without `checkpoint.dir`): it resumes from the
    last checkpoint, where one is saved; without `checkpoint.every_samples` only the run's end is saved, so a run
    stopped before it has none, and the same command trains from the start."""
    from trainer.checkpoint import latest_checkpoint  # imports torch, which the run has loaded by now

    directory = cfg.checkpoint.dir
    if not directory:
        return None
    if latest_checkpoint(directory) is not None:
        return f"run the same command again to resume from the last checkpoint in {directory}"
    if cfg.checkpoint.every_samples is None:
        return (f"no checkpoint is saved in {directory} yet (without checkpoint.every_samples only the run's end is): "
                "the same command starts afresh; set checkpoint.every_samples to save along the way")  # fmt: skip
    return f"no checkpoint is saved in {directory} yet: the same command starts afresh"


def record_unended(cfg, reporter, reason: str, error: str) -> None:
    """The final record of a run that ended before `train` wrote one (rank 0's, as `train` writes it)."""
    from trainer.result import TrainResult

    if reporter.finals or not _is_rank_0():
        return
    micro = cfg.batch.micro_batch_size
    reporter.final(TrainResult(TrainStatus.FAILED, reason, global_batch_size=cfg.batch.global_batch_size,
                               micro_batch_size=None if micro == "auto" else micro,
                               target_mlm_accuracy=cfg.eval.target_mlm_accuracy, error=error))  # fmt: skip


def entry() -> int:
    """`main`, with standard output that cannot take what is printed said in one line, not a traceback: a reader
    that left (`--print-config | head -1`) quietly, as any Unix filter, and a file that cannot grow with an error."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail again
        return 128 + signal.SIGPIPE
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO) or e.filename is not None:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"error: cannot write the output: {e.strerror}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    from trainer.leave import leave

    leave(entry())  # not the interpreter's finalization (trainer.leave): an exception still ends the usual way

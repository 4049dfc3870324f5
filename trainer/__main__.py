"""`python -m trainer --config CFG.yaml [dotted.key=value ...]` (or under torchrun for several processes).

Exit codes (`trainer.result`): 0 reached_target or budget_exhausted, 1 failed, 2 bad config (nothing
trained), 3 diverged.
"""

from __future__ import annotations

import argparse
import sys

from trainer.config import dump_config, load_config
from trainer.errors import ConfigError, TrainerError
from trainer.result import EXIT_BAD_CONFIG, TrainStatus


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="BERT pretraining (MLM + NSP).")
    parser.add_argument("--config", help="YAML trainer config (see trainer/configs/)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optimizer.lr=1e-3")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    # torch loads only after the config is valid, so a bad config is refused at once.
    from trainer.distributed import check_device, cleanup, dist_env_from_environ
    from trainer.report import JsonLinesReporter
    from trainer.train import train

    if args.print_config:  # the config alone: it may be printed on a machine without the device it asks for
        print(dump_config(cfg), end="")
        return 0
    try:
        check_device(cfg.device, dist_env_from_environ())  # before the reporter makes its file
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    reporter = JsonLinesReporter(cfg.log.jsonl)
    try:
        result = train(cfg, reporter)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except TrainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return TrainStatus.FAILED.exit_code
    finally:
        reporter.close()
        cleanup()
    if result.status is TrainStatus.FAILED:
        print(f"error: {result.reason}", file=sys.stderr)
    elif dist_env_from_environ().is_main:  # every rank returns the result; rank 0 says how the run ended
        print(f"finished: {result.status.value}" + (f" ({result.reason})" if result.reason else ""), file=sys.stderr)
    return result.status.exit_code


if __name__ == "__main__":
    sys.exit(main())

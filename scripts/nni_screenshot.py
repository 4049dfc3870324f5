"""Screenshot an engine: nni experiment's NNI web UI with headless Chromium (Debian's `chromium`, installed by
`make system-deps`), for the README.

    python scripts/nni_screenshot.py NAME [--db URL] [--page oview] [--arm N | --nni-experiment ID]
        [--out docs/img/nni_webui.png]

It reopens the experiment's web UI in view mode (like `hpo webui NAME`), waits until the page has rendered,
saves the screenshot, and closes the web UI again if it was not open before.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hpo.cli.common import open_storage
from hpo.nni.manager import is_answering, load_experiments, stop_all, view

PAGES = ("oview", "detail")  # NNI 3.0's routes: the overview and the trial details


def screenshot(url: str, out: Path, width: int, height: int, wait_ms: int) -> None:
    """Render `url` in headless Chromium and save a PNG; raises with Chromium's output when it fails."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: chromium is not installed; run `make system-deps`")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:  # a throw-away profile: nothing written to HOME
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--virtual-time-budget={wait_ms}", f"--screenshot={out.resolve()}", url]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"error: chromium could not render {url}:\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the experiment (it must have run under engine: nni)")
    parser.add_argument("--db", help="database URL (default: HPO_DATABASE_URL, else sqlite:///.hpo/hpo.db)")
    parser.add_argument("--page", choices=PAGES, default="oview", help="the web UI page (default oview)")
    parser.add_argument("--arm", type=int, default=0, help="which arm's NNI experiment (default 0: its latest)")
    parser.add_argument("--nni-experiment", metavar="ID", help="the NNI experiment by its id (e.g. hpo1-arm1, an "
                                                                "arm's tuning), instead of --arm's latest")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("docs/img/nni_webui.png"), help="the PNG to write")
    parser.add_argument("--size", default="1920x1080", help="window size WIDTHxHEIGHT (default 1920x1080)")
    parser.add_argument("--wait-ms", type=int, default=15000, help="virtual time for the page to render")
    args = parser.parse_args(argv)
    record = open_storage(args.db, read_only=True).get_experiment_by_name(args.name)
    run_dir = Path(record.spec["run_dir"])
    was_open = any(is_answering(e) for e in load_experiments(run_dir))
    experiments = view(run_dir)
    try:
        if args.nni_experiment:
            ids = [e.nni_id for e in experiments]
            if args.nni_experiment not in ids:
                raise SystemExit(f"error: --nni-experiment {args.nni_experiment}: not one of {', '.join(ids)}")
            experiment = experiments[ids.index(args.nni_experiment)]
        else:
            experiment = [e for e in experiments if e.arm == args.arm][-1]  # the arm's latest run (after a resume)
        width, height = (int(v) for v in args.size.split("x"))
        screenshot(f"http://127.0.0.1:{experiment.port}/{args.page}", args.out, width, height, args.wait_ms)
    finally:
        if not was_open:
            stop_all(run_dir)
    print(f"wrote {args.out} ({args.name}, NNI experiment {experiment.nni_id}, page {args.page})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Open a report page in headless Chromium (Debian's `chromium`, installed by `make system-deps`), check that it
rendered with every image loaded and that no request left this machine, and save a full-page screenshot.

    python scripts/report_screenshot.py URL [--out docs/img/report.png] [--width 1300] [--max-height PX]

URL is a page of the running API (`hpo serve`), e.g. http://127.0.0.1:8000/api/v1/experiments/NAME/report, or a
file written by `hpo report` (file:///abs/path/NAME.html). Chromium runs with a fresh profile, no network
services of its own (no component updates, sync or background fetches), and is driven over the Chrome DevTools
protocol: every request the page makes is recorded, and one for another host is failed before it is sent (so
even a broken page cannot reach the network from here). Exit status 1 when an image did not load or a request went
to another host, or when the page is wider than the window (the screenshot would cut it); the lines printed say
which.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--disable-default-apps", "--disable-extensions", "--remote-debugging-port=0")  # fmt: skip
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
IMAGES_JS = "JSON.stringify([...document.images].map(i => [i.complete, i.naturalWidth, i.alt]))"


@dataclass
class Rendered:
    """What the page did: its images (complete, natural width, alt text) and every URL it requested."""

    title: str
    images: list[tuple[bool, int, str]]
    requests: list[str] = field(default_factory=list)
    width: int = 0  # the page's laid-out width (CSS pixels): more than the window's where something overflows

    @property
    def broken_images(self) -> list[str]:
        return [alt for complete, width, alt in self.images if not complete or width == 0]

    @property
    def external_requests(self) -> list[str]:
        """Requests that would leave the machine (anything but data:, file:, about: and this host)."""
        out = []
        for url in self.requests:
            parsed = urlparse(url)
            if parsed.scheme in ("data", "file", "about", "blob"):
                continue
            if parsed.hostname not in LOCAL_HOSTS and f"[{parsed.hostname}]" not in LOCAL_HOSTS:
                out.append(url)
        return out


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, screenshot: Path | None = None, width: int = 1300, timeout_s: float = 60,
           max_height: int | None = None) -> Rendered:  # fmt: skip
    """Load `url` in a fresh headless Chromium; return what it rendered and requested (and save a full-page PNG)."""
    chromium = chromium_path()
    if chromium is None:
        raise SystemExit("error: chromium is not installed; run `make system-deps`")
    # Chromium's helper processes can outlive the browser by a moment and still write into the profile: they are
    # killed with its process group, and a file one of them writes during the clean-up is left, not an error.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},1000", "about:blank"]
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)  # fmt: skip
        try:
            from websockets.sync.client import connect

            with connect(_browser_socket(process, timeout_s), max_size=None, open_timeout=timeout_s) as socket:
                return _load(_DevTools(socket, timeout_s), url, screenshot, width, max_height)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)


def _browser_socket(process: subprocess.Popen, timeout_s: float) -> str:
    """The DevTools websocket Chromium prints on start ("DevTools listening on ws://...")."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            return found.group(1)
    raise RuntimeError("chromium did not start its DevTools endpoint:\n" + "".join(seen[-20:]))


class _DevTools:
    """A minimal Chrome DevTools protocol client over one websocket (flattened target sessions)."""

    def __init__(self, socket, timeout_s: float):
        self.socket = socket
        self.timeout_s = timeout_s
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        self.blocked: list[str] = []

    def send(self, method: str, session: str | None, params: dict) -> int:
        message_id = next(self.ids)
        message = {"id": message_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        return message_id

    def receive(self, timeout_s: float) -> dict:
        """The next message; paused requests are answered here: local ones go on, others fail unsent."""
        message = json.loads(self.socket.recv(timeout=timeout_s))
        if message.get("method") == "Fetch.requestPaused":
            params, session = message["params"], message.get("sessionId")
            request_id = {"requestId": params["requestId"]}
            if Rendered("", [], [params["request"]["url"]]).external_requests:
                self.blocked.append(params["request"]["url"])
                self.send("Fetch.failRequest", session, {**request_id, "errorReason": "BlockedByClient"})
            else:
                self.send("Fetch.continueRequest", session, request_id)
        return message

    def call(self, method: str, session: str | None = None, **params) -> dict:
        message_id = self.send(method, session, params)
        while True:
            reply = self.receive(self.timeout_s)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            event = self.receive(max(0.1, deadline - time.monotonic()))
            if event.get("method") == method:
                return event
            self.events.append(event)
        raise TimeoutError(f"no {method} within {self.timeout_s} s")


def _load(devtools: _DevTools, url: str, screenshot: Path | None, width: int, max_height: int | None) -> Rendered:
    target = devtools.call("Target.createTarget", url="about:blank")["targetId"]
    session = devtools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Network", "Runtime"):
        devtools.call(f"{domain}.enable", session)
    devtools.call("Fetch.enable", session, patterns=[{"urlPattern": "*"}])  # every request pauses for a check
    devtools.call("Emulation.setDeviceMetricsOverride", session, width=width, height=1000, deviceScaleFactor=1,
                  mobile=False)  # fmt: skip
    devtools.call("Page.navigate", session, url=url)
    devtools.wait_for("Page.loadEventFired")
    images = json.loads(devtools.call("Runtime.evaluate", session, expression=IMAGES_JS)["result"]["value"])
    title = devtools.call("Runtime.evaluate", session, expression="document.title")["result"].get("value", "")
    laid_out = devtools.call("Runtime.evaluate", session, expression="document.documentElement.scrollWidth")
    sent = [e["params"]["request"]["url"] for e in devtools.events if e.get("method") == "Network.requestWillBeSent"]
    requests = list(dict.fromkeys(sent + devtools.blocked))
    if screenshot is not None:
        size = devtools.call("Page.getLayoutMetrics", session)["cssContentSize"]
        height = min(size["height"], max_height or size["height"])
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        shot = devtools.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True, clip=clip)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    return Rendered(title, [tuple(i) for i in images], requests, laid_out["result"].get("value", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the page: http://127.0.0.1:PORT/api/v1/experiments/NAME/report, or file:///...")
    parser.add_argument("--out", type=Path, default=Path("docs/img/report.png"), help="the PNG to write")
    parser.add_argument("--width", type=int, default=1300, help="page width in CSS pixels (default 1300)")
    parser.add_argument("--max-height", type=int, help="cut the screenshot at this height (default: the whole page)")
    args = parser.parse_args(argv)
    page = render(args.url, args.out, args.width, max_height=args.max_height)
    print(f"{page.title}: {len(page.images)} image(s), {len(page.requests)} request(s); wrote {args.out}")
    for alt in page.broken_images:
        print(f"image not loaded: {alt}", file=sys.stderr)
    for url in page.external_requests:
        print(f"request left the machine: {url}", file=sys.stderr)
    if page.width > args.width:
        print(f"the page is {page.width} px wide, wider than the window's {args.width}: the screenshot cuts it",
              file=sys.stderr)  # fmt: skip
    return 1 if page.broken_images or page.external_requests or page.width > args.width else 0


if __name__ == "__main__":
    sys.exit(main())

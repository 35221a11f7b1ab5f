"""Headless Chromium for the tests: open a page, evaluate JavaScript in it, read its console, screenshot it.

The browser is driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: commands on fd 3, replies on fd 4, one JSON
message per NUL-terminated record), so no port is opened and nothing but the
``chromium`` binary is needed. Debian's package installs it as
``/usr/bin/chromium``; ``make test`` and ``make demo`` install it when it is
missing (the Makefile's ``chromium`` target, as root with apt-get).

The page's console is read through the ``Log`` domain, enabled before the
page is navigated to: it reports console errors and the browser's own
messages about the page, a Content-Security-Policy violation (a blocked
fetch) included.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL_HINT = (
    "the browser test needs Chromium: install Debian's package with "
    "`apt-get update && apt-get install -y chromium` (or put a chromium binary on PATH)"
)

#: Seconds one protocol reply may take; a page of a few hundred KB loads in well under one.
REPLY_TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    """The Chromium binary on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageRun:
    """What the browser saw: the value of the expression, the console entries and a PNG screenshot."""

    value: Any
    console: list[dict[str, Any]] = field(default_factory=list)
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, to_browser: int, from_browser: int) -> None:
        self.to_browser = to_browser
        self.from_browser = from_browser
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        return self.next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed the DevTools pipe")
                self.buffer += chunk
        record, self.buffer = self.buffer.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(record)
        return parsed

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        """Send a command and return its result; events met meanwhile are kept in ``events``."""
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            message = self._read(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_event(self, method: str) -> dict[str, Any]:
        """The first event named ``method`` (already received or the next to arrive)."""
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = self._read(deadline)
            self.events.append(message)
            if message.get("method") == method:
                return message


def open_page(binary: str, url: str, expression: str, *, width: int = 1200, height: int = 900) -> PageRun:
    """Load ``url`` in headless Chromium, evaluate ``expression`` once it has loaded, screenshot the page.

    ``expression`` is evaluated by the test, in the page's context: the page
    itself needs no script. The screenshot covers the whole page, not just
    the window.
    """
    commands_r, commands_w = os.pipe()
    replies_r, replies_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="dlm-chromium-")
    log = open(Path(profile) / "stderr.log", "wb")  # closed in the finally below
    # Chromium reads fd 3 and writes fd 4. bash moves the pipe ends there
    # before exec'ing it (a preexec_fn would run Python in a forked child of
    # a process with torch's threads, which can deadlock). Copies at 10 and
    # up cannot collide with 3 and 4.
    child_in = fcntl.fcntl(commands_r, fcntl.F_DUPFD_CLOEXEC, 10)
    child_out = fcntl.fcntl(replies_w, fcntl.F_DUPFD_CLOEXEC, 10)
    wiring = f'exec "$0" "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-'
    process = subprocess.Popen(
        [
            "bash", "-c", wiring,
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank",
        ],
        pass_fds=(child_in, child_out),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,  # a file, not a pipe: chromium logs a lot (D-Bus, GPU) and must never block on it
    )  # fmt: skip
    for fd in (commands_r, replies_w, child_in, child_out):
        os.close(fd)
    pipe = _Pipe(commands_w, replies_r)
    try:
        return _drive(pipe, url, expression)
    except (OSError, EOFError, TimeoutError) as exc:
        log.flush()
        tail = (Path(profile) / "stderr.log").read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"chromium failed: {exc}; its stderr ended with:\n" + "\n".join(tail)) from exc
    finally:
        try:
            pipe.send("Browser.close")
        except OSError:
            pass
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        os.close(commands_w)
        os.close(replies_r)
        log.close()
        shutil.rmtree(profile, ignore_errors=True)


def _drive(pipe: _Pipe, url: str, expression: str) -> PageRun:
    """Attach to the page, load ``url``, evaluate ``expression``, screenshot the whole page."""
    targets = pipe.call("Target.getTargets")["targetInfos"]
    page = next(t["targetId"] for t in targets if t["type"] == "page")
    session = pipe.call("Target.attachToTarget", {"targetId": page, "flatten": True})["sessionId"]
    for domain in ("Page", "Log", "Runtime"):
        pipe.call(f"{domain}.enable", session=session)
    pipe.events.clear()  # about:blank's own load
    pipe.call("Page.navigate", {"url": url}, session=session)
    pipe.wait_event("Page.loadEventFired")
    result = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"the expression failed: {result['exceptionDetails']}")
    shot = pipe.call(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session
    )
    console = [
        event["params"]["entry"] for event in pipe.events if event.get("method") == "Log.entryAdded"
    ] + [
        {"level": event["params"]["type"], "text": str(event["params"].get("args"))}
        for event in pipe.events
        if event.get("method") == "Runtime.consoleAPICalled"
    ]
    return PageRun(result["result"].get("value"), console, base64.b64decode(shot["data"]))


def page_url(path: Path) -> str:
    return path.resolve().as_uri()

"""Headless Chromium for pictures of served pages: here, Netron drawing an exported graph.

Debian's `chromium` package; used by the tests (is the graph really drawn?) and by
notebooks/img/06_make_figures.py (the screenshot in lesson 06).
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    # Netron's page asks ipinfo.io for the country and sends usage statistics to Google Analytics;
    # resolving no host but 127.0.0.1 keeps the test off the network.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


class DevTools:
    """Headless Chromium driven through the DevTools protocol over a pipe.

    Chromium reads commands from fd 3 and writes replies to fd 4, one JSON message per NUL byte.
    The CLI's --screenshot with --virtual-time-budget cannot be used for Netron: virtual time
    fast-forwards Netron's 2.5 s watchdog while its graph layout runs (in real time) in a Web
    Worker, so the page shows "This large graph layout might take a very long time" instead.
    """

    def __init__(self, profile: Path, timeout: float = 60):
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # The pipe ends arrive as stdin and stdout; the shell moves them to fds 3 and 4.
        redirect = 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null'
        argv = [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.process = subprocess.Popen(
            ["sh", "-c", redirect, "sh", *argv], stdin=commands_r, stdout=replies_w, stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: close() ends the helper processes too
        )
        os.close(commands_r)
        os.close(replies_w)
        self._deadline = time.monotonic() + timeout
        self._buffer = b""
        self._id = 0

    def send(self, method: str, session: str | None = None, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:  # events arrive between replies; skip them
            reply = self._read()
            if reply.get("id") == self._id:
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            left = self._deadline - time.monotonic()
            assert left > 0 and select.select([self._replies], [], [], left)[0], (
                "Chromium did not answer in time"
            )
            chunk = os.read(self._replies, 1 << 20)
            assert chunk, "Chromium exited"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, session: str, expression: str):
        reply = self.send("Runtime.evaluate", session, expression=expression, returnByValue=True)
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    def close(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        os.close(self._commands)
        os.close(self._replies)


@dataclass
class Drawn:
    png: bytes  # a screenshot of the page
    labels: list[str]  # the text of every graph node
    places: list[str | None]  # each node's SVG transform: "translate(...)" once laid out


def render_netron(url: str, *, width: int = 1400, height: int = 1000, scale: float = 1.0,
                  timeout: float = 30) -> Drawn:
    """Open a Netron page served at `url`, wait until its graph is drawn, and capture it."""
    if CHROMIUM is None:
        raise RuntimeError("needs Chromium (Debian: apt-get install chromium)")
    # Chromium's helper processes may still be flushing the profile as it is removed: ignore that.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        browser = DevTools(Path(profile))
        try:
            # Without a "consent" cookie Netron waits for a click on its cookie notice before it opens the model.
            browser.send("Storage.setCookies", cookies=[{"name": "consent", "value": "1", "url": url}])
            target = browser.send("Target.createTarget", url=url)["targetId"]
            session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            browser.send("Emulation.setDeviceMetricsOverride", session, width=width, height=height,
                         deviceScaleFactor=scale, mobile=False)
            # Netron marks the body "default" once the graph is laid out and drawn.
            drawn = ("document.body?.classList.contains('default') && "
                     "document.querySelectorAll('g.graph-node').length")
            deadline = time.monotonic() + timeout
            while not browser.evaluate(session, drawn) and time.monotonic() < deadline:
                time.sleep(0.2)
            png = base64.b64decode(browser.send("Page.captureScreenshot", session)["data"])
            nodes = "[...document.querySelectorAll('g.graph-node')]"
            labels = browser.evaluate(session, f"{nodes}.map(n => n.textContent)")
            places = browser.evaluate(session, f"{nodes}.map(n => n.getAttribute('transform'))")
        finally:
            browser.close()
    return Drawn(png, labels, places)

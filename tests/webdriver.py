"""A headless Chromium driven over W3C WebDriver (Debian's `chromium` + `chromium-driver`).

The five commands the browser tests need (new session, navigate, run a script, screenshot, end)
spoken over HTTP with the standard library: selenium would add a dependency tree (trio,
urllib3, certifi, ...) for the same five calls.

    with Browser() as b:
        b.get("http://127.0.0.1:9465/")
        b.wait_for("return document.body.dataset.updated")
        png = b.screenshot()
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

# As a root process on a CI box: no sandbox (it needs user namespaces root does not get), no
# GPU, and nothing that reaches the network on its own (QUIC, background fetches, component
# updates, sync); a fresh profile per run.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def available() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    for exe in ("chromium", "chromedriver"):
        if shutil.which(exe) is None:
            return f"{exe} is not installed (apt-get install chromium chromium-driver)"
    return None


class WebDriverError(RuntimeError):
    pass


class Browser:
    def __init__(self, width: int = 1280, height: int = 900, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.TemporaryDirectory(prefix="xm-chromium-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen(
            ["chromedriver", f"--port={port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.session = ""
        try:
            self._wait_driver()
            args = CHROMIUM_ARGS + [
                f"--user-data-dir={self.profile.name}",
                f"--window-size={width},{height}",
            ]
            caps = {
                "capabilities": {
                    "alwaysMatch": {
                        "browserName": "chrome",
                        "goog:chromeOptions": {"binary": shutil.which("chromium"), "args": args},
                    }
                }
            }
            self.session = self._call("POST", "/session", caps)["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_driver(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except (OSError, WebDriverError):
                pass
            if self.driver.poll() is not None or time.monotonic() > deadline:
                raise WebDriverError("chromedriver did not come up")
            time.sleep(0.1)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            raise WebDriverError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def get(self, url: str) -> None:
        self._call("POST", self._s("/url"), {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """A script's return value (the body of a function: `return ...`)."""
        return self._call("POST", self._s("/execute/sync"), {"script": script, "args": list(args)})

    def wait_for(self, script: str, timeout_s: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            v = self.run(script)
            if v:
                return v
            if time.monotonic() > deadline:
                raise WebDriverError(f"timed out waiting for: {script}")
            time.sleep(0.1)

    def screenshot(self, path: Path | None = None) -> bytes:
        png = base64.b64decode(self._call("GET", self._s("/screenshot")))
        if path is not None:
            path.write_bytes(png)
        return png

    def close(self) -> None:
        if self.session:
            try:
                self._call("DELETE", self._s(""))
            except (OSError, WebDriverError):
                pass
            self.session = ""
        if self.driver.poll() is None:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait()
        self.profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

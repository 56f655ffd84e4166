"""A minimal Chrome DevTools Protocol driver for headless chromium (tests only).

Starts Debian's chromium with a private profile, opens one page, records console errors,
uncaught exceptions, log errors and every network request, evaluates expressions and takes
screenshots.  Uses the `websockets` package's synchronous client.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--remote-debugging-port=0",
)


def find_chromium() -> str | None:
    for name in (os.environ.get("PATCHKIT_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """One headless chromium with one page (a flattened CDP session)."""

    def __init__(self, executable: str, width: int = 1400, height: int = 1000) -> None:
        from websockets.sync.client import connect

        self.profile = Path(tempfile.mkdtemp(prefix="patchkit-chromium-"))
        self.proc = subprocess.Popen(
            [
                executable,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or len(port_file.read_text().splitlines()) < 2:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self._connection = connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=20)
        self.ws = self._connection.__enter__()
        self._ids = itertools.count(1)
        self.events: list[dict] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )

    def call(
        self, method: str, params: dict | None = None, *, session: bool = False, timeout: float = 30
    ) -> dict:
        msg_id = next(self._ids)
        message = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.1)))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        for event in self.events:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.1)))
            if "method" in reply:
                self.events.append(reply)
                if reply["method"] == method:
                    return reply
        raise TimeoutError(method)

    def goto(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")
        time.sleep(0.3)  # let late console messages arrive
        self.call("Runtime.evaluate", {"expression": "1"}, session=True)

    def evaluate(self, expression: str):
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("text", "evaluation failed"))
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error-level log entries since goto()."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append("exception: " + p["exceptionDetails"].get("text", ""))
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(
                    "console: "
                    + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", []))
                )
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log: {p['entry'].get('text')} ({p['entry'].get('url', '')})")
        return out

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        params: dict = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params, session=True, timeout=60)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self._connection.__exit__(None, None, None)
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

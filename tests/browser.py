"""Load a local HTML file in headless Chromium and report what a person would see go wrong: console errors,
uncaught exceptions, network requests, and a full-page screenshot.

Chromium is driven through the DevTools protocol over pipes (`--remote-debugging-pipe`: JSON messages ended by
NUL on file descriptors 3 and 4), so no websocket client or browser-automation package is needed. The browser is
Debian's `chromium` (`apt-get install -y chromium`); `find_chromium()` is None without one, and tests skip.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Optional

LOCAL_SCHEMES = ("file:", "data:", "about:")


def find_chromium() -> Optional[str]:
    """The browser binary: $QC_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    for c in (os.environ.get("QC_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


class _Pipe:
    def __init__(self, proc, write_fd: int, read_fd: int):
        self.proc, self.w, self.r = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list = []

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> int:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def _read_one(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None,
             timeout: float = 60.0) -> dict:
        want = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_one(deadline)
            if m.get("id") == want:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read_one(deadline)
            if m.get("method") == method:
                return m
            if "method" in m:
                self.events.append(m)


def load_page(path: str, width: int = 1200, height: int = 900, timeout: float = 90.0) -> dict:
    """Open `path` (a local file) in headless Chromium. Returns {"console_errors": [...], "exceptions": [...],
    "requests": [every URL the page asked for, the page itself included], "png": full-page screenshot bytes,
    "title": document.title, "height": the page's height in CSS pixels}."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no chromium")
    profile = tempfile.mkdtemp(prefix="qc-chromium-")
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    args = [browser, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]

    def child_fds():   # the protocol's fds: chromium reads 3, writes 4 (moved up first: a pipe may be 3 or 4)
        r, w = os.dup(to_browser_r) + 100, os.dup(from_browser_w) + 100
        os.dup2(to_browser_r, r)
        os.dup2(from_browser_w, w)
        os.dup2(r, 3)
        os.dup2(w, 4)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.environ.get("QC_CHROMIUM_LOG", os.devnull), "wb"),
                            preexec_fn=child_fds, close_fds=False)
    os.close(to_browser_r)
    os.close(from_browser_w)
    pipe = _Pipe(proc, to_browser_w, from_browser_r)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.events.clear()
        pipe.call("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout=timeout)
        time.sleep(0.3)   # late console messages and image decodes
        metrics = pipe.call("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = pipe.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                   "clip": {"x": 0, "y": 0, "width": size["width"],
                                                            "height": size["height"], "scale": 1}},
                         session=session, timeout=timeout)
        title = pipe.call("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                          session=session)["result"].get("value")
        broken = pipe.call("Runtime.evaluate", {"expression": "Array.from(document.images).filter("
                                                "i => !(i.complete && i.naturalWidth > 0)).length",
                                                "returnByValue": True}, session=session)["result"].get("value")
        events = pipe.events
        return {
            "console_errors": [e["params"] for e in events if e["method"] == "Runtime.consoleAPICalled"
                               and e["params"].get("type") in ("error", "assert")]
            + [e["params"]["entry"] for e in events if e["method"] == "Log.entryAdded"
               and e["params"]["entry"].get("level") == "error"],
            "exceptions": [e["params"] for e in events if e["method"] == "Runtime.exceptionThrown"],
            "requests": [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"],
            "png": base64.b64decode(shot["data"]), "title": title, "height": size["height"],
            "broken_images": broken,
        }
    finally:
        try:
            pipe.send("Browser.close")
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - the browser is killed below anyway
            pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(to_browser_w)
        os.close(from_browser_r)
        shutil.rmtree(profile, ignore_errors=True)


def network_requests(requests: list) -> list:
    """The requests that would leave the machine (anything but file:, data: and about: URLs)."""
    return [u for u in requests if not u.startswith(LOCAL_SCHEMES)]


def is_blank(png: bytes) -> bool:
    """True when every pixel of the screenshot has one colour (or the image does not decode)."""
    import io

    from PIL import Image
    try:
        img = Image.open(io.BytesIO(png)).convert("RGB")
    except Exception:  # noqa: BLE001 - a screenshot that does not decode is as good as blank
        return True
    lo, hi = zip(*img.getextrema())
    return lo == hi

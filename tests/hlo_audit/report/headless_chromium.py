"""A small driver for headless Chromium over the DevTools protocol (stdlib only).

Starts Debian's `chromium` with a fresh profile and the flags that keep it off
the network, opens one page target, and speaks the DevTools protocol over a
minimal WebSocket client (RFC 6455: masked client frames, fragmented and
64-bit-length server frames, ping/pong). Enough to load a file, collect
console errors, uncaught exceptions and network requests, evaluate script and
take screenshots; nothing more.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Any

#: Flags of a quiet, offline headless Chromium (see .library's python.md).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--mute-audio", "--remote-debugging-port=0")


def find_chromium() -> str | None:
  """Path of a Chromium executable, or None."""
  for name in ("chromium", "chromium-browser", "google-chrome"):
    path = shutil.which(name)
    if path:
      return path
  return None


class WebSocket:
  """A blocking WebSocket client for text messages."""

  def __init__(self, url: str, timeout: float = 30.0):
    m = re.match(r"^ws://([^/:]+):(\d+)(/.*)$", url)
    if m is None:
      raise ValueError(f"not a ws:// URL: {url!r}")
    host, port, path = m.group(1), int(m.group(2)), m.group(3)
    self.sock = socket.create_connection((host, port), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                       "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                       f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                       ).encode())
    head = b""
    while b"\r\n\r\n" not in head:
      chunk = self.sock.recv(4096)
      if not chunk:
        raise ConnectionError("closed during the WebSocket handshake")
      head += chunk
    head, self._buf = head.split(b"\r\n\r\n", 1)
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
      raise ConnectionError(f"WebSocket handshake refused: {head[:200]!r}")

  def _read(self, n: int) -> bytes:
    while len(self._buf) < n:
      chunk = self.sock.recv(max(65536, n - len(self._buf)))
      if not chunk:
        raise ConnectionError("WebSocket closed")
      self._buf += chunk
    out, self._buf = self._buf[:n], self._buf[n:]
    return out

  def _send_frame(self, opcode: int, payload: bytes) -> None:
    header = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
      header += bytes([0x80 | n])
    elif n < 1 << 16:
      header += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
      header += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    self.sock.sendall(header + mask + masked)

  def send(self, text: str) -> None:
    self._send_frame(0x1, text.encode())

  def recv(self) -> str:
    """The next text message (pings answered, fragments joined)."""
    parts: list[bytes] = []
    while True:
      b0, b1 = self._read(2)
      fin, opcode = b0 & 0x80, b0 & 0x0F
      n = b1 & 0x7F
      if n == 126:
        n = struct.unpack(">H", self._read(2))[0]
      elif n == 127:
        n = struct.unpack(">Q", self._read(8))[0]
      mask = self._read(4) if b1 & 0x80 else None
      payload = self._read(n)
      if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
      if opcode == 0x8:
        raise ConnectionError("WebSocket closed by the browser")
      if opcode == 0x9:
        self._send_frame(0xA, payload)
        continue
      if opcode == 0xA:
        continue
      parts.append(payload)
      if fin:
        return b"".join(parts).decode()

  def close(self) -> None:
    try:
      self._send_frame(0x8, b"")
    except OSError:
      pass
    self.sock.close()


class Chromium:
  """Headless Chromium with one page, driven over DevTools.

  Use as a context manager. `events` holds every protocol event received.
  """

  def __init__(self, executable: str, width: int = 1280, height: int = 900,
               timeout: float = 60.0):
    self.executable = executable
    self.width, self.height = width, height
    self.timeout = timeout
    self.events: list[dict[str, Any]] = []
    self._next_id = 0

  def __enter__(self) -> Chromium:
    self._profile = tempfile.mkdtemp(prefix="hlo_audit_chromium_")
    self.proc = subprocess.Popen(
        [self.executable, *FLAGS, f"--user-data-dir={self._profile}",
         f"--window-size={self.width},{self.height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    self.stderr: list[str] = []

    def pump():
      for line in self.proc.stderr:
        self.stderr.append(line)
        lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + self.timeout
    url = None
    while url is None:
      try:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
      except queue.Empty:
        line = ""
      m = re.search(r"DevTools listening on (ws://\S+)", line)
      if m:
        url = m.group(1)
      elif time.monotonic() > deadline or self.proc.poll() is not None:
        self.__exit__()
        raise RuntimeError("chromium did not start: " + "".join(self.stderr[-20:]))
    port = int(re.match(r"ws://[^:]+:(\d+)/", url).group(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                timeout=self.timeout) as r:
      targets = json.load(r)
    page = next(t for t in targets if t.get("type") == "page")
    self.ws = WebSocket(page["webSocketDebuggerUrl"], timeout=self.timeout)
    for domain in ("Page", "Runtime", "Log", "Network"):
      self.call(f"{domain}.enable")
    return self

  def __exit__(self, *exc) -> None:
    ws = getattr(self, "ws", None)
    if ws is not None:
      ws.close()
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    shutil.rmtree(self._profile, ignore_errors=True)

  def call(self, method: str, **params) -> dict[str, Any]:
    """Sends a command and returns its result (events are kept meanwhile).

    Raises:
      RuntimeError: if the browser answers with an error.
    """
    self._next_id += 1
    my_id = self._next_id
    self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
    while True:
      msg = json.loads(self.ws.recv())
      if msg.get("id") == my_id:
        if "error" in msg:
          raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})
      if "method" in msg:
        self.events.append(msg)

  def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
    """Waits for the next event `method` not seen yet.

    Raises:
      TimeoutError: if it does not come in time.
    """
    for e in self.events:
      if e["method"] == method and not e.get("_seen"):
        e["_seen"] = True
        return e
    self.ws.sock.settimeout(timeout or self.timeout)
    try:
      while True:
        msg = json.loads(self.ws.recv())
        if "method" in msg:
          self.events.append(msg)
          if msg["method"] == method:
            msg["_seen"] = True
            return msg
    except socket.timeout:
      raise TimeoutError(f"no {method} event in {timeout or self.timeout} s") from None
    finally:
      self.ws.sock.settimeout(self.timeout)

  def load(self, url: str) -> None:
    """Navigates to `url` and waits for its load event."""
    result = self.call("Page.navigate", url=url)
    if result.get("errorText"):
      raise RuntimeError(f"cannot load {url}: {result['errorText']}")
    self.wait_event("Page.loadEventFired")

  def evaluate(self, expression: str) -> Any:
    """The value of a JavaScript expression in the page.

    Raises:
      RuntimeError: if the expression throws.
    """
    r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                  awaitPromise=True)
    if "exceptionDetails" in r:
      raise RuntimeError(f"{expression!r} threw: {r['exceptionDetails']}")
    return r["result"].get("value")

  def screenshot(self, clip: dict[str, float] | None = None,
                 full_page: bool = False) -> bytes:
    """A PNG of the viewport, of a clip rectangle (page coordinates), or of
    the whole page."""
    params: dict[str, Any] = {"format": "png"}
    if clip is not None:
      params["clip"] = {**clip, "scale": 1}
      params["captureBeyondViewport"] = True
    elif full_page:
      w, h = self.evaluate("[document.documentElement.scrollWidth, "
                           "document.documentElement.scrollHeight]")
      params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
      params["captureBeyondViewport"] = True
    return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

  def errors(self, since: int = 0) -> list[str]:
    """Console errors, uncaught exceptions and error log entries among
    `events[since:]`."""
    out = []
    for e in self.events[since:]:
      p = e.get("params", {})
      if e["method"] == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        out.append("exception: " + str(d.get("exception", {}).get("description")
                                       or d.get("text")))
      elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        out.append("console." + p["type"] + ": " + " ".join(
            str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
      elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        out.append("log: " + p["entry"].get("text", ""))
    return out

  def requests(self, since: int = 0) -> list[str]:
    """URLs of the network requests among `events[since:]`."""
    return [e["params"]["request"]["url"] for e in self.events[since:]
            if e["method"] == "Network.requestWillBeSent"]

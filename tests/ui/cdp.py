"""Headless Chromium driven over the DevTools protocol, with aiohttp's websocket client only.

:func:`chromium` starts Debian's ``chromium`` with ``--remote-debugging-port=0``, reads the
``DevTools listening on ws://...`` line it prints, and yields a :class:`Browser` on that
websocket. :meth:`Browser.new_page` creates a target and attaches to it with a flattened
session: commands carry its ``sessionId``, and the page's console messages, uncaught exceptions
and log entries (``Runtime.consoleAPICalled``, ``Runtime.exceptionThrown``, ``Log.entryAdded``)
are collected in :attr:`Page.console`. The browser process is killed on the way out, whatever
happened, and its profile folder removed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


def find_chromium() -> str | None:
    """The Chromium binary on PATH (Debian names it ``chromium``), or None."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(Exception):
    """A DevTools command answered with an error, or the browser went away."""


@dataclass
class ConsoleEntry:
    """One message of the page's console or log."""

    source: str
    """``console`` (console API), ``exception`` (uncaught) or ``log`` (the browser's log:
    network errors, CSP violations, ...)."""
    level: str
    text: str


@dataclass
class Page:
    """An attached tab."""

    browser: Browser
    session: str
    console: list[ConsoleEntry] = field(default_factory=list)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, session=self.session, **params)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (``await``ed when it is a promise)."""
        reply = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            raise CdpError(f"{expression!r} raised: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""
        reply = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(reply["data"])

    def errors(self) -> list[ConsoleEntry]:
        """Entries at error level, and every uncaught exception."""
        return [e for e in self.console if e.source == "exception" or e.level == "error"]


class Browser:
    """The browser-level DevTools websocket; see the module docstring."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}
        self._reader = asyncio.create_task(self._read(), name="cdp-reader")

    async def send(self, method: str, *, session: str | None = None, **params: Any) -> Any:
        """Send one command and await its result (10 s at most)."""
        if self._reader.done():
            raise CdpError("the DevTools connection is closed")
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = future
        await self._ws.send_str(json.dumps(message))
        async with asyncio.timeout(10):
            reply = await future
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def new_page(self, width: int = 1400, height: int = 1000) -> Page:
        """A blank tab of ``width`` by ``height`` CSS pixels, attached, with its console, log and
        page events enabled."""
        target = await self.send("Target.createTarget", url="about:blank")
        attached = await self.send(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = Page(self, attached["sessionId"])
        self._pages[page.session] = page
        for domain in ("Runtime", "Log", "Page"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return page

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    break
                data = json.loads(msg.data)
                if "id" in data:
                    future = self._waiting.pop(data["id"], None)
                    if future is not None and not future.done():
                        future.set_result(data)
                else:
                    self._event(data)
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(CdpError("the DevTools connection closed"))

    def _event(self, data: dict[str, Any]) -> None:
        page = self._pages.get(data.get("sessionId", ""))
        if page is None:
            return
        method, params = data.get("method"), data.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            level = "error" if params["type"] in ("error", "assert") else params["type"]
            page.console.append(ConsoleEntry("console", level, text))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            page.console.append(ConsoleEntry("exception", "error", text))
        elif method == "Log.entryAdded":
            entry = params["entry"]
            text = f"{entry.get('text', '')} {entry.get('url', '')}".strip()
            page.console.append(ConsoleEntry("log", entry["level"], text))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


@contextlib.asynccontextmanager
async def chromium(binary: str, *, start_within: float = 30.0) -> AsyncIterator[Browser]:
    """Headless Chromium with a throw-away profile; yields the connected :class:`Browser`."""
    profile = tempfile.mkdtemp(prefix="kpytest-chromium-")
    proc = await asyncio.create_subprocess_exec(
        binary,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its helper processes share the group, killed together
    )
    drain: asyncio.Task[None] | None = None
    try:
        assert proc.stderr is not None
        seen = b""
        async with asyncio.timeout(start_within):
            while (found := _LISTENING.search(seen)) is None:
                line = await proc.stderr.readline()
                if not line:
                    raise CdpError(f"chromium exited before listening: {seen.decode()[-2000:]}")
                seen += line
        # Keep reading stderr so that a chatty browser never blocks on a full pipe.
        drain = asyncio.create_task(_drain(proc.stderr), name="chromium-stderr")
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(found.group(1).decode(), max_msg_size=64 << 20)
            browser = Browser(ws)
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
        shutil.rmtree(profile, ignore_errors=True)


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass

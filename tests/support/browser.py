"""A real headless Chromium (Debian's ``chromium``) driven by Playwright from trio tests.

Playwright's sync API binds its objects to the thread that made them, so every call runs on one
dedicated thread (a one-worker executor) and the trio test awaits it there:
``await browser.call(lambda page: ...)``. Playwright downloads no browser: it launches
``/usr/bin/chromium`` with the flags a closed network needs (no background connections).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

T = TypeVar("T")
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


class Browser:
    def __init__(self, executor: ThreadPoolExecutor, page: Any) -> None:
        self._executor = executor
        self.page = page
        self.dialogs: list[str] = []  # every alert/confirm/prompt a page opened (none should)
        self.errors: list[str] = []  # uncaught script errors and console errors

    async def call(self, fn: Callable[[Any], T]) -> T:
        """``fn(page)`` on the browser's thread."""
        future = self._executor.submit(fn, self.page)
        return await trio.to_thread.run_sync(future.result)


@asynccontextmanager
async def open_browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        raise RuntimeError(f"{CHROMIUM} is missing: ./scripts/setup installs Debian's chromium")
    executor = ThreadPoolExecutor(1, thread_name_prefix="chromium")
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    state: dict[str, Any] = {}

    def start() -> Any:
        from playwright.sync_api import sync_playwright

        state["pw"] = sync_playwright().start()
        state["context"] = state["pw"].chromium.launch_persistent_context(
            # The pages' Content-Security-Policy forbids eval, which Playwright's waits use; and
            # with it bypassed, an escaping test sees what escaping alone does (no CSP to save it).
            profile, executable_path=CHROMIUM, args=FLAGS, headless=True, bypass_csp=True,
        )
        page = state["context"].new_page()
        page.set_default_timeout(15_000)
        return page

    def stop() -> None:
        if "context" in state:
            state["context"].close()
        if "pw" in state:
            state["pw"].stop()

    try:
        page = await trio.to_thread.run_sync(executor.submit(start).result)
        browser = Browser(executor, page)

        def listen(p: Any) -> None:
            def on_dialog(d: Any) -> None:
                browser.dialogs.append(d.message)
                d.dismiss()

            p.on("dialog", on_dialog)
            p.on("pageerror", lambda exc: browser.errors.append(str(exc)))
            p.on("console", lambda m: browser.errors.append(m.text) if m.type == "error" else None)

        await browser.call(listen)
        yield browser
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(executor.submit(stop).result)
        executor.shutdown()
        shutil.rmtree(profile, ignore_errors=True)

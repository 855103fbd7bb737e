"""Headless Chromium for the console's tests and benchmark: Debian's ``/usr/bin/chromium`` driven
by Playwright (no browser is ever downloaded), with the flags that keep it off the network."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from playwright.async_api import Browser, async_playwright

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""Without the background-networking flags Chromium keeps trying hosts this network refuses."""


def chromium_path() -> str | None:
    """Debian's Chromium, if installed (``make test`` installs it)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium, closed (its processes gone) afterwards."""
    path = chromium_path()
    if path is None:
        raise RuntimeError(
            "`chromium` is not on PATH: `make test` installs it (apt-get install -y chromium)"
        )
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            await browser.close()

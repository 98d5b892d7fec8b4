"""Headless Chromium for page tests: Debian's ``chromium`` driven by Playwright.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium``
(``scripts/test`` installs it from Debian's packages). The flags keep Chromium
off the network: no background services, no component updates, no QUIC.
"""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    path = os.environ.get("JUPYTERHUB_GPU_CHROMIUM") or shutil.which("chromium")
    if not path:
        raise RuntimeError(
            "page tests need Debian's Chromium: `apt-get install -y chromium` "
            "(or set JUPYTERHUB_GPU_CHROMIUM to a Chromium binary)"
        )
    return path


@pytest.fixture(scope="session")
async def browser():
    """One headless Chromium for the session (Playwright gives it a fresh profile)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def page(browser):
    """A fresh page in a fresh context (own cookies), closed after the test."""
    context = await browser.new_context()
    page = await context.new_page()
    yield page
    await context.close()


async def log_in(page, hub_url: str, user: str, password: str) -> None:
    """Log ``user`` in through the hub's own login page; the page lands on the spawn page."""
    await page.goto(f"{hub_url}/hub/login?next=%2Fhub%2Fspawn")
    await page.fill("#username_input", user)
    await page.fill("#password_input", password)
    await page.click("#login_submit")
    await page.wait_for_url(f"{hub_url}/hub/spawn**")

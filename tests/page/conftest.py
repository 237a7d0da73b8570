"""A real Chromium (Debian's `/usr/bin/chromium`) driven by Playwright against the quickstart app.

Playwright's own browser downloads are never used: the tests launch the system Chromium.
Without it they skip on a developer's machine and fail under `CI=true` (`.ci/run`
installs it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 15_000
"""The bound of every wait for something the page should show."""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the page tests must run; see .ci/run)")
    pytest.skip(f"{reason}; install it to run the page tests")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module.

    Not per session: the sync API keeps an event loop running in the main thread while it
    is open, and the async tests that run after this directory need that thread's loop.
    """
    if not CHROMIUM.exists():
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable('the "playwright" package is missing (pip install -e ".[dev]")')
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context and page; every wait is bounded by `WAIT_MS`."""
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], f"the page raised: {errors}"

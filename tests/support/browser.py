"""Headless Chromium for the console's browser tests (Debian's `chromium` and
`chromium-driver`; `.ci/run` installs them where it can)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest


def chromium() -> Any:
    """A headless Chromium driven by selenium, or the test skipped when either is absent."""
    webdriver = pytest.importorskip("selenium.webdriver")
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.skip("headless Chromium is not installed (apt install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1600"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium")
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def screenshots() -> Path | None:
    """Where to save screenshots (`RETRACE_CONSOLE_SCREENSHOTS`, e.g. docs/console), or None."""
    where = os.environ.get("RETRACE_CONSOLE_SCREENSHOTS")
    return Path(where) if where else None

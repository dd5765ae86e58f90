"""Headless chromium through selenium, for the dashboard's browser tests and its load-time benchmark
(bench/dashboard_build.py): Debian's chromium and chromium-driver, installed by ./run.sh test."""

import contextlib
import importlib.util
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# Root in a container needs --no-sandbox; the others keep chromium from reaching out to Google
# services (there is no network: it would stall and log errors).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
]
READY_TIMEOUT_S = 30


@contextlib.contextmanager
def headless_chromium(profile: Path):
    """A selenium driver of headless chromium with a fresh profile in ``profile``, keeping the
    browser console log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_until_ready(driver) -> float:
    """Wait for the page's ready marker (every plot drawn); return it: ms since navigation start."""
    from selenium.webdriver.support.wait import WebDriverWait

    WebDriverWait(driver, READY_TIMEOUT_S).until(
        lambda browser: browser.execute_script("return window.dashboardReadyMs !== undefined")
    )
    return driver.execute_script("return window.dashboardReadyMs")


needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER and importlib.util.find_spec("selenium")),
    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver) and selenium",
)

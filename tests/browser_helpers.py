"""Headless Chromium for the UI tests: Debian's `chromium` and `chromium-driver` packages driven by Selenium.

The browser starts with a new empty profile and without any of its background connections (the machines'
network is closed: Chromium's own update, sync and safe-browsing requests would only wait or fail). Where
Chromium, its driver or Selenium is absent, :func:`chromium_or_skip` skips the test with the reason printed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import pytest

CHROMIUM = os.environ.get("MJOIN_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MJOIN_CHROMEDRIVER", "/usr/bin/chromedriver")
#: what every Chromium of the tests starts with: headless, no sandbox (root in CI), and none of its background
#: connections (updates, sync, QUIC probes), which a closed network refuses
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1600,1000")


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} not found: install Debian's {package} (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401  (only to tell whether it is installed)
    except ImportError:
        return "selenium is not installed (requirements.txt pins it; make setup installs it)"
    return None


def chromium_or_skip():
    reason = missing()
    if reason:
        print(f"skipping the browser test: {reason}")
        pytest.skip(reason)


@contextlib.contextmanager
def chromium(downloads: str | None = None):
    """A headless Chromium (Selenium WebDriver) with a new empty profile, quit and removed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="mjoin-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, condition, timeout: float = 60, poll: float = 0.5, what: str = "the page"):
    """``condition(driver)``'s first truthy value within ``timeout`` seconds (exceptions count as not yet)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = condition(driver)
            if got:
                return got
        except Exception as exc:  # the element is not there yet, or went stale while React re-rendered
            last = exc
        time.sleep(poll)
    shot = os.path.join(tempfile.gettempdir(), f"mjoin-browser-{int(time.time())}.png")
    with contextlib.suppress(Exception):
        driver.save_screenshot(shot)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last error: {last}; url {driver.current_url}; "
                         f"screenshot {shot})")


def type_into(element, text: str, attempts: int = 4) -> None:
    """Type ``text`` into an input as a user does, and check that it holds it: under load Chromium can lose a
    keystroke while React re-renders a controlled input (seen: "deo/lake" for "demo/lake"), so the field is
    cleared and typed again, more slowly, until it reads back what was typed."""
    from selenium.webdriver.common.keys import Keys

    for attempt in range(attempts):
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.DELETE)
        if attempt == 0:
            element.send_keys(text)
        else:
            for ch in text:
                element.send_keys(ch)
                time.sleep(0.02 * attempt)
        time.sleep(0.2)
        if element.get_attribute("value") == text:
            return
    raise AssertionError(f"the field holds {element.get_attribute('value')!r}, not {text!r}, after {attempts} tries")


def login(driver, base: str, password: str, user: str = "admin") -> None:
    """Log in through the simple auth manager's login form, as a user would."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/auth/login")
    name = wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, "input[name=username]"), what="the login form")
    name.send_keys(user)
    driver.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "/auth/login" not in d.current_url and d.get_cookie("_token"), what="the login")

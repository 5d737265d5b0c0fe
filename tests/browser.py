"""Debian's Chromium, headless, driven through Debian's chromedriver by Selenium (no browser download)."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: the flags of a closed machine: no background connections (they would be refused, many at a time)
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1360,900")


@contextlib.contextmanager
def chromium(*flags: str) -> Iterator["object"]:
    """A Selenium WebDriver on a headless Chromium with a profile of its own, quit (and removed) after;
    `flags` are added to its command line."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="gitops-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(120)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

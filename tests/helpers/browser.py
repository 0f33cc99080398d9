"""A real browser for tests: Debian's ``chromium`` driven by Selenium through the system's
``chromedriver`` (``scripts/setup.sh`` installs both). Nothing is downloaded: the driver's
path is given, so selenium-manager never runs, and Chromium starts with its background
networking off.

``browser_missing()`` says why no browser can run here (the test then skips with that
reason); ``artifacts_dir()`` is where screenshots go (``$TEST_ARTIFACTS``, default
``.pytest_artifacts/`` in the checkout, git-ignored).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def chromium_path() -> str | None:
    return next((p for p in CHROMIUM if os.access(p, os.X_OK)), None)


def browser_missing() -> str | None:
    """None when a browser can be driven here, else why not."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "no chromium here (scripts/setup.sh installs it: apt-get install chromium)"
    if not os.access(CHROMEDRIVER, os.X_OK):
        return (
            "no chromedriver here (scripts/setup.sh installs it: apt-get install chromium-driver)"
        )
    return None


def artifacts_dir() -> Path:
    path = Path(os.environ.get("TEST_ARTIFACTS") or ROOT / ".pytest_artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Browser:
    """One headless Chromium with a fresh profile; ``close`` ends it and removes the profile."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="chromium-test-")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium_path() or CHROMIUM[0]
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(60)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def console_errors(self) -> list[dict[str, Any]]:
        """The console's errors since the last call (failed loads, exceptions, console.error)."""
        return [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, path: Path) -> Path:
        """The whole page, beyond the window's height (Chrome DevTools' full-page capture)."""
        import base64

        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

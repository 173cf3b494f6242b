"""Fixtures for the explorer's browser tests: the real `tileweave gui` server on a free loopback
port, and a real headless Chromium (Debian's) driven by Selenium. Screenshots and downloads go
to artifacts/web/ (scripts/web_test.sh sets everything up)."""
import os
import pathlib
import re
import subprocess
import time

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = pathlib.Path(os.environ.get("TW_WEB_ARTIFACTS", ROOT / "artifacts" / "web"))


@pytest.fixture(scope="session")
def tileweave_bin():
    path = pathlib.Path(os.environ.get("TILEWEAVE_BIN", ROOT / "build" / "tools" / "tileweave"))
    if not path.exists():
        pytest.fail(f"no tileweave binary at {path} (build it, or set TILEWEAVE_BIN)")
    return path


@pytest.fixture(scope="session")
def server(tileweave_bin):
    """Starts `tileweave gui --port 0` from an unrelated directory (the page is built in) and
    returns its URL, read from the line it prints."""
    proc = subprocess.Popen([str(tileweave_bin), "gui", "--port", "0"], cwd="/", stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    match = re.search(r"serving on (http://127\.0\.0\.1:\d+/)", line)
    if not match:
        proc.kill()
        pytest.fail(f"tileweave gui did not start: {line!r}")
    yield match.group(1)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def downloads():
    d = ARTIFACTS / "downloads"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def browser(downloads):
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1300"):
        opts.add_argument(arg)
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=opts)
    yield driver
    driver.quit()


class Page:
    """The explorer page, as a user sees it: fill the form, click tiles and buttons, read the status."""

    def __init__(self, driver, url):
        self.d = driver
        self.url = url

    def open(self):
        self.d.get(self.url)
        self.wait(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        return self

    def wait(self, cond, timeout=20):
        WebDriverWait(self.d, timeout).until(cond)
        # ... and until every request it started has been answered and drawn.
        WebDriverWait(self.d, timeout).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-pending") in (None, "0"))

    def el(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def text(self, css):
        return self.el(css).text

    def set_problem(self, **fields):
        for key, value in fields.items():
            e = self.el("#" + key)
            if e.tag_name == "select":
                self.d.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'))",
                                      e, str(value))
            else:
                e.clear()
                e.send_keys(str(value))
        before = self.layouts()
        self.el("#apply").click()
        # Wait until the server answered: a new layout, or an error.
        self.wait(lambda d: self.layouts() != before or self.text("#error"))

    def select_order(self, name):
        self.d.execute_script("arguments[0].value = arguments[1]", self.el("#order-name"), name)
        assert self.el("#order-name").get_attribute("value") == name, f"no order '{name}' in the list"

    def layouts(self):
        return self.d.execute_script("return window.__layouts || 0")

    def steps(self):
        return int(self.text("#step-count"))

    def traffic(self):
        return int(self.el("#traffic").get_attribute("data-bytes"))

    def tile(self, op, tm, tn):
        return self.el(f'rect.tile[data-op="{op}"][data-tm="{tm}"][data-tn="{tn}"]')

    def click_tile(self, op, tm, tn):
        """Clicks a tile and waits until the server answered (a new step, or a message)."""
        before = (self.steps(), self.text("#message"))
        self.tile(op, tm, tn).click()
        self.wait(lambda d: (self.steps(), self.text("#message")) != before)

    def press(self, button_id):
        before = (self.steps(), self.text("#message"), self.layouts())
        self.el("#" + button_id).click()
        self.wait(lambda d: (self.steps(), self.text("#message"), self.layouts()) != before)

    def screenshot(self, name):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        # The whole page, not only the window: widen the window to the document first.
        w = self.d.execute_script("return document.documentElement.scrollWidth")
        h = self.d.execute_script("return document.documentElement.scrollHeight")
        self.d.set_window_size(max(1500, w), max(1000, h + 150))
        self.d.save_screenshot(str(path))
        return path


@pytest.fixture
def page(browser, server):
    return Page(browser, server).open()

"""Headless Chromium driven by Playwright, for pictures and checks of served pages.

Playwright (`playwright` on PyPI) drives Debian's `chromium` package through `executable_path`, so no
browser is downloaded. Used by the tests (JupyterLab runs the doctor; Netron draws the exported graph)
and by notebooks/img/06_make_figures.py (the screenshot in lesson 06).
"""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # Netron's page asks ipinfo.io for the country and sends usage statistics to Google Analytics;
    # resolving no host but 127.0.0.1 keeps pages off the network.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


def available() -> str | None:
    """Why a browser cannot run here, or None when Chromium and Playwright are both installed."""
    if CHROMIUM is None:
        return "needs Chromium (Debian: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs Playwright (pip install playwright; no browser download: Debian's Chromium is used)"
    return None


@contextmanager
def page(*, width: int = 1400, height: int = 1000, scale: float = 1.0) -> Iterator:
    """A fresh Playwright page in headless Chromium; the browser is closed on exit."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # bypass_csp: a page that forbids eval (Netron does) still lets the test wait on an expression
            context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale,
                                          bypass_csp=True)
            yield context.new_page()
        finally:
            browser.close()


@dataclass
class Drawn:
    png: bytes  # a screenshot of the page
    labels: list[str]  # the text of every graph node
    places: list[str | None]  # each node's SVG transform: "translate(...)" once laid out


def render_netron(url: str, *, width: int = 1400, height: int = 1000, scale: float = 1.0,
                  timeout: float = 30) -> Drawn:
    """Open a Netron page served at `url`, wait until its graph is drawn, and capture it."""
    with page(width=width, height=height, scale=scale) as tab:
        # Without a "consent" cookie Netron waits for a click on its cookie notice before it opens the model.
        tab.context.add_cookies([{"name": "consent", "value": "1", "url": url}])
        tab.goto(url)
        # Netron marks the body "default" once the graph is laid out and drawn (its layout runs in a Web Worker,
        # in real time). Netron replaces window.eval, so the page is read through locators, never evaluate().
        tab.locator("body.default g.graph-node").first.wait_for(timeout=timeout * 1000)
        nodes = tab.locator("g.graph-node")
        labels = [node.text_content() or "" for node in nodes.all()]
        places = [node.get_attribute("transform") for node in nodes.all()]
        return Drawn(tab.screenshot(), labels, places)

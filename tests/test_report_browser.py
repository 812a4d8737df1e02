"""index.html in a real headless Chromium: it loads with no console error and shows the verdict.

The browser is the system's Chromium (Debian: `apt-get install chromium`), driven by playwright
(the `report` extra). Without either this test fails, so CI cannot pass without looking at the
page; locally, HARNESS_ALLOW_NO_BROWSER=1 turns that into a skip.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from test_reports import finding, full_folder, summary, telemetry, write_folder

from reports.cli import render_folder
from reports.merge import merge_folders

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ALLOW_NO_BROWSER = "HARNESS_ALLOW_NO_BROWSER"


def _missing(what: str):
    message = f"{what}; install it, or set {ALLOW_NO_BROWSER}=1 to skip this test locally"
    if os.environ.get(ALLOW_NO_BROWSER) == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[report]')")
    executable = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
    if executable is None:
        _missing("no Chromium on PATH (Debian: apt-get install -y chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_page(browser, path: Path):
    """The page and what it logged: console errors and warnings, uncaught exceptions, failed requests."""
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(path.resolve().as_uri(), wait_until="load")
    return page, problems


def test_report_page_loads_clean_and_shows_the_verdict(browser, tmp_path):
    written, verdict = render_folder(full_folder(tmp_path))
    page, problems = open_page(browser, written[-1])
    try:
        assert page.locator("#verdict").is_visible()
        assert page.locator("#verdict").inner_text() == verdict.status == "FOUND"
        assert "finding(s)" in page.locator("#verdict-reason").inner_text()
        assert page.locator("figure svg").count() == 5 and page.locator("figure svg").first.is_visible()
        page.locator("button.copy").first.click()  # the copy script runs without raising
        page.wait_for_function("document.querySelector('button.copy').textContent !== 'copy'")
        assert problems == []
    finally:
        page.close()


def test_the_check_sees_a_broken_page(browser, tmp_path):
    """The same check on a page with a script error, a console error and a fetch: it reports all three."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><div id='verdict'>CLEAN</div><img src='missing.png'>"
                   "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    page, problems = open_page(browser, bad)
    page.close()
    assert any("console.error: boom" in p for p in problems)
    assert any(p.startswith("uncaught:") and "undefinedFunction" in p for p in problems)
    assert any("missing.png" in p for p in problems)


def test_a_missing_browser_fails_unless_allowed_locally(monkeypatch):
    monkeypatch.delenv(ALLOW_NO_BROWSER, raising=False)
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        _missing("no Chromium on PATH (Debian: apt-get install -y chromium)")
    monkeypatch.setenv(ALLOW_NO_BROWSER, "1")
    with pytest.raises(pytest.skip.Exception):
        _missing("no Chromium on PATH")


def test_a_merged_page_of_two_shards_loads_clean_and_lists_each_worker(browser, tmp_path):
    for k in (1, 2):
        write_folder(tmp_path / f"shard{k}", summary_json={
            **summary([finding()], telemetry=telemetry()), "shard": {"index": k, "count": 2},
            "cuda_visible_devices": str(k - 1)})
    written, verdict, _ = merge_folders([tmp_path / "shard1", tmp_path / "shard2"], tmp_path / "merged")
    page, problems = open_page(browser, tmp_path / "merged" / "index.html")
    try:
        assert page.locator("#verdict").inner_text() == verdict.status == "FOUND"
        assert page.locator("#workers").is_visible()
        rows = page.locator("#workers + table tr")
        assert rows.count() == 3 and "NVIDIA H200" in rows.nth(1).inner_text()
        assert "1 finding(s) in 8 cases" in page.locator("#verdict-reason").inner_text()
        assert page.locator("figure svg").count() >= 2
        assert problems == []
    finally:
        page.close()

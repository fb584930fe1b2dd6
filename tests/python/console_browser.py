"""Drives the swelake console in headless Chromium (Debian's, through Playwright) and prints
what each page showed as one JSON line; tests/it/console.rs compares it with `swelake sql`.

argv: DEMO_URL HOURS_URL SCREENSHOT_DIR QUERY XSS_QUERY INSTANCE_ID
"""
import json
import os
import sys
import urllib.parse

from playwright.sync_api import sync_playwright

demo, hours, shots, query, xss_query, instance = sys.argv[1:7]
seen = {}

# The flags Chromium needs on a machine without a network (and as root, without a sandbox).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ["SWELAKE_CHROMIUM"], headless=True, args=ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def shot(name):
        page.screenshot(path=os.path.join(shots, name + ".png"))

    # Status: every job and table.
    page.goto(demo + "/status")
    page.wait_for_selector("#jobs tbody tr")
    seen["status"] = {
        "jobs": page.eval_on_selector_all("#jobs tbody tr", "rs => rs.map(r => r.dataset.job)"),
        "tables": page.eval_on_selector_all("#tables tbody tr", "rs => rs.map(r => r.dataset.table)"),
    }
    shot("status")

    # Sources of a lake no repository was read into through GitHub's API: its section says so.
    page.goto(demo + "/sources")
    page.wait_for_selector("#github-none")
    seen["sources_without_api"] = {
        "none": page.inner_text("#github-none"),
        "rows": page.eval_on_selector_all("#github-repos tbody tr", "rs => rs.length"),
    }

    # Sources: the heatmap of the crafted hours.
    page.goto(hours + "/sources")
    page.wait_for_selector("#heatmap .cell")

    def cell(hour):
        return page.eval_on_selector(
            f'#heatmap .cell[data-hour="{hour}"]',
            "c => ({verdict: c.dataset.verdict, title: c.title, color: getComputedStyle(c).backgroundColor})")

    seen["sources"] = {
        "cells": page.eval_on_selector_all('#heatmap .cell:not([data-verdict="outside"])', "cs => cs.length"),
        "low": cell("2025-11-03-14"),
        "missing": cell("2025-11-03-12"),
        "complete": cell("2025-11-03-13"),
        "expected": page.inner_text("#expected"),
        "github_summary": page.inner_text("#github-summary"),
        "github": page.eval_on_selector_all(
            "#github-repos tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"),
    }
    page.hover('#heatmap .cell[data-hour="2025-11-03-14"]')
    shot("sources")

    # SQL: a query typed into the editor and run.
    def result():
        page.wait_for_selector("#result-table, #error")
        return {
            "rows": page.eval_on_selector_all(
                "#result-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"),
            "types": page.eval_on_selector_all("#result-table th .type", "ts => ts.map(t => t.textContent)"),
            "url": page.url,
        }

    page.goto(demo + "/sql")
    page.wait_for_selector("#table-list details")
    page.fill("#editor", query)
    page.click("#run")
    seen["sql"] = result()
    page.click('#table-list details[data-table="pull_requests"] summary')
    shot("sql")
    # The same query from a shared link runs on load.
    page.goto(seen["sql"]["url"])
    seen["sql_from_link"] = result()
    page.fill("#editor", "SELECT no_such_column FROM events")
    page.click("#run")
    page.wait_for_selector("#error")
    seen["sql_error"] = page.inner_text("#error")

    # Dataset: the card and the instance browser, then one instance.
    page.goto(demo + "/dataset")
    page.wait_for_selector("#instance-list tbody tr")
    page.wait_for_selector("#card table, #card .error")
    shot("dataset")
    page.goto(demo + "/instances/" + urllib.parse.quote(instance))
    page.wait_for_selector("#oracle-patch")
    page.click('#files details summary')
    page.evaluate("window.scrollTo(0, 0)")
    shot("instance")
    page.fill("#answer", "an answer with no solution block")
    page.click("#score-button")
    page.wait_for_selector("#score")
    seen["instance"] = {"oracle_patch": page.eval_on_selector("#oracle-patch", "e => e.textContent"), "score": page.inner_text("#score")}
    shot("score")

    # A PR whose title and body hold script payloads, shown by the SQL page: nothing runs.
    page.goto(hours + "/sql?q=" + urllib.parse.quote(xss_query))
    page.wait_for_selector("#result-table tbody tr")
    page.wait_for_timeout(500)
    seen["xss"] = {
        "cells": page.eval_on_selector_all("#result-table tbody td", "cs => cs.map(c => c.textContent)"),
        "dialogs": len(dialogs),
        "pwned": page.evaluate("window.__pwned === undefined ? null : window.__pwned"),
        "injected": page.evaluate("document.querySelectorAll('#injected, img[src=\"x\"]').length"),
        "scripts": page.evaluate("document.querySelectorAll('script').length"),
    }
    shot("xss")
    seen["page_errors"] = errors
    browser.close()

print(json.dumps(seen))

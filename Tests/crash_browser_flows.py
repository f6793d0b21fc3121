"""The crash browser as a user sees it, in Debian's chromium driven by Playwright.

Run by CrashBrowserTests with one argument: a JSON file naming the collectors to visit (SQLite and
ClickHouse, one after the other, in this one process) and what their pages must show. Prints one
JSON line: {"ok": true} or {"ok": false, "failures": [...]}. Any dialog, page error or console
error is a failure: a hostile crash must not run anything.
"""
import json
import os
import sys

config = json.load(open(sys.argv[1]))
sys.path.insert(0, config["python_packages"])
from playwright.sync_api import sync_playwright  # noqa: E402

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def visit(browser, target):
    name, base = target["name"], target["base"]
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems, requests = [], []
    page.on("console", lambda m: problems.append("console %s: %s" % (m.type, m.text)) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append("page error: %s" % e))

    def on_dialog(dialog):
        problems.append("dialog: %s" % dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("request", lambda r: requests.append(r.url))
    shots = target.get("screenshots")

    def shot(file):
        if shots:
            page.screenshot(path=os.path.join(shots, file), full_page=False)

    def rows():
        return {
            row.get_attribute("data-fingerprint"): int(row.locator("td.events").text_content())
            for row in page.locator("tr.group").all()
        }

    # The list, then filtered by version through the form: the URL says so, Back comes here.
    page.goto(base + "/")
    check(rows() == config["expected_all"], "%s: list %s" % (name, rows()))
    shot("crash-browser-list.png")
    page.select_option("select[name=version]", "2.0")
    page.click("form.filters button[type=submit]")
    page.wait_for_load_state()
    check("version=2.0" in page.url, "%s: filtered URL %s" % (name, page.url))
    check(rows() == config["expected_2_0"], "%s: 2.0 list %s" % (name, rows()))
    filtered_url = page.url
    # A group, under the filter; a thread expanded.
    page.click('tr[data-fingerprint="%s"] td.title a' % config["threaded"])
    page.wait_for_load_state()
    check("/groups/" + config["threaded"] in page.url, "%s: group URL %s" % (name, page.url))
    count = page.text_content("#count-events")
    check(count == str(config["expected_2_0"][config["threaded"]]), "%s: group count %s" % (name, count))
    thread = page.locator("details.thread").first
    check(not thread.evaluate("d => d.open"), "%s: other threads start collapsed" % name)
    thread.locator("xpath=./summary").click()
    check(thread.evaluate("d => d.open"), "%s: a thread opens" % name)
    check(thread.locator("ol.frames li").count() > 0, "%s: its frames show" % name)
    shot("crash-browser-group.png")
    group_url = page.url
    # Its whole report, then back twice to the filtered list.
    page.click("#latest-report")
    page.wait_for_load_state()
    check("/reports/" in page.url, "%s: report URL %s" % (name, page.url))
    check(page.locator("#raw").count() == 1, "%s: raw JSON" % name)
    check(page.get_by_text("Registers").count() >= 1, "%s: registers" % name)
    shot("crash-browser-report.png")
    page.go_back()
    check(page.url == group_url, "%s: back to the group, at %s" % (name, page.url))
    page.go_back()
    check(page.url == filtered_url, "%s: back to the list, at %s" % (name, page.url))
    check(page.input_value("select[name=version]") == "2.0", "%s: the form still says 2.0" % name)
    # Hangs and top crashers.
    page.goto(base + "/?kind=hang")
    check(rows() == config["expected_hangs"], "%s: hangs %s" % (name, rows()))
    shot("crash-browser-hangs.png")
    page.goto(base + "/top?app=crash-sample-c&version=2.0")
    check(page.locator("table.top tr").count() > 1, "%s: top crashers" % name)
    shot("crash-browser-top.png")
    # The hostile crash: its text shows as text, and nothing of it runs or loads.
    for path in ["/groups/" + config["hostile"], config["hostile_report"]]:
        page.goto(base + path)
        page.wait_for_timeout(300)
        check(page.evaluate("document.scripts.length") == 0, "%s %s: a script element" % (name, path))
        check(page.evaluate("document.images.length") == 0, "%s %s: an img element" % (name, path))
        check(config["hostile_text"] in page.text_content("main"), "%s %s: the text is shown" % (name, path))
        bad = page.evaluate("[...document.querySelectorAll('a')].map(a => a.href).filter(h => !h.startsWith(location.origin))")
        check(bad == [], "%s %s: links elsewhere %s" % (name, path, bad))
    shot("crash-browser-hostile.png")
    check(problems == [], "%s: %s" % (name, problems))
    elsewhere = [url for url in requests if not url.startswith(base + "/") and not url.startswith("data:")]
    check(elsewhere == [], "%s: requests to another host %s" % (name, elsewhere))
    context.close()


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    for target in config["targets"]:
        try:
            visit(browser, target)
        except Exception as error:  # a missing element is a failure with its message, not a crash
            failures.append("%s: %s" % (target["name"], error))
    browser.close()
print(json.dumps({"ok": not failures, "failures": failures}))

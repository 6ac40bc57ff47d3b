"""Drives the seawall dashboard in headless Chromium.

Usage: dashboard_check.py BASE_URL TOKEN DEAD_LETTER_ID SCREENSHOT JOURNEY_SCREENSHOT STALE_ID

Loads the page, enters the token, checks that the cards show the numbers the
API reports; replays dead letter STALE_ID through the API behind the page's
back (another operator) and clicks its button on the page, which must show
the refusal (409, naming when it was replayed); then clicks the replay button
of the given dead letter and waits for the page to confirm it, a confirmation
still shown once the page has refreshed; then opens the replayed message's
journey and waits until it shows the message processed. Exits non-zero with a message on any mismatch.
"""
import json
import os
import sys
import urllib.request

from playwright.sync_api import sync_playwright

base, token, dead_letter_id, screenshot, journey_screenshot, stale_id = sys.argv[1:7]


def api(path, method="GET"):
    req = urllib.request.Request(base + "/api/v1" + path, method=method,
                                 headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req) as res:
        return json.load(res)


with sync_playwright() as p:
    browser = p.chromium.launch(
        executable_path=os.environ.get("SEAWALL_TEST_CHROMIUM", "/usr/bin/chromium"),
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    )
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.goto(base + "/")
    page.fill("#token", token)
    page.click("#save-token")
    page.wait_for_function("document.body.dataset.loaded !== undefined", timeout=15000)
    # Auto-refresh off, so the numbers compared below are from one moment.
    page.uncheck("#auto-refresh")
    # Read the refresh count before asking for a refresh: read after the
    # click, a refresh that finished first would leave nothing to wait for.
    before = page.evaluate("document.body.dataset.loaded")
    page.click("#save-token")
    page.wait_for_function(f"document.body.dataset.loaded !== '{before}'", timeout=15000)
    stats = api("/stats")
    shown = {
        "stat-outbox-pending": stats["outbox"]["pending"],
        "stat-outbox-published": stats["outbox"]["published"],
        "stat-outbox-dead": stats["outbox"]["dead"],
        "stat-inbox-processed": stats["inbox"]["processed"],
        "stat-inbox-expired": stats["inbox"]["expired_claims"],
        "stat-dead-letters": stats["dead_letters"],
    }
    for element, expected in shown.items():
        text = page.inner_text("#" + element)
        if text != str(expected):
            sys.exit(f"{element} shows {text!r}, the API reports {expected}")
    page.screenshot(path=screenshot, full_page=True)
    # Another operator replays STALE_ID; this page still lists it.
    stale = "#replay-dead-letter-" + stale_id
    page.wait_for_selector(stale, timeout=10000)
    api("/dead-letters/" + stale_id + "/replay", method="POST")
    page.click(stale)
    try:
        page.wait_for_function(
            "() => { const s = document.getElementById('status').textContent;"
            " return s.includes('Replay failed: 409') && s.includes('replayed at'); }",
            timeout=15000)
    except Exception:
        sys.exit("a second replay was not shown refused; the status says: "
                 + page.inner_text("#status"))
    # The refusal's own refresh has drawn the list without STALE_ID; from
    # here on only the next click refreshes the page.
    page.wait_for_selector(stale, state="detached", timeout=15000)
    before = page.evaluate("document.body.dataset.loaded")
    button = "#replay-dead-letter-" + dead_letter_id
    page.wait_for_selector(button, timeout=10000)
    page.click(button)
    # The confirmation outlives the refresh the replay starts: an operator
    # sees it after the page has redrawn, not for a few milliseconds.
    try:
        page.wait_for_function(
            "(before) => document.getElementById('status').textContent.includes('Replay done')"
            " && document.body.dataset.loaded !== before",
            arg=before, timeout=15000)
    except Exception:
        sys.exit("the replay was not confirmed after the page refreshed; the status says: "
                 + page.inner_text("#status"))
    # The replayed message's journey: searched by id, shown as a timeline
    # once its consumer has processed it.
    message_id = api("/dead-letters/" + dead_letter_id)["message_id"]
    page.fill("#journey-id", message_id)
    try:
        page.wait_for_function(
            "(id) => { const done = document.getElementById('journey').innerText.includes('processed ' + id);"
            " if (!done) showJourney(); return done; }",
            arg=message_id, polling=500, timeout=30000)
    except Exception:
        sys.exit("the journey of " + message_id + " never showed it processed; it shows:\n"
                 + page.inner_text("#journey"))
    page.locator("#journey").screenshot(path=journey_screenshot)
    browser.close()
print("dashboard ok")

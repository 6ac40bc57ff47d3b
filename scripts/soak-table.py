"""Prints a soak report (soak-report.json) as the Markdown table the README carries.

Reports written before the soak ran on the test kit's ledger domain (such as
the committed soak-report.json) name two counts after the example domain's
credits: "credits" for "entries" and "applied_events" for "recorded_events".
Both spellings are read; a row keeps the name its report uses."""
import json
import sys

r = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "soak-report.json"))
c = r["counts"]
# Each row: the key, then the older report's spelling of it.
ROWS = [("valid",), ("entries", "credits"), ("malformed",), ("missing_id",), ("dead_letters",), ("outbox_rows",),
        ("recorded_events", "applied_events"), ("republished_after_window",), ("process_restarts",), ("poison_rows",),
        ("commits_cut",), ("webhook_calls",), ("notified",)]
print("| what | count |")
print("|---|---|")
for names in ROWS:
    key = next((k for k in names if k in c), None)
    if key is not None:
        print(f"| {key.replace('_', ' ')} | {c[key]} |")
print()
print("| t (s) | what happened |")
print("|---|---|")
# Each fault, then what it recovered and when (a failover records several
# recovery times: writes routed, readyz, processing resumed).
for t, event, detail in r["faults"]:
    if event in ("fault", "recovered", "restart", "resume"):
        print(f"| {t} | {event} {detail} |")
thr = r["throughput_per_10s"]
if thr:
    rates = [v for _, v in thr]
    unit = "entries" if "entries" in c else "credits"  # an older report's wording
    print()
    print(f"Throughput: {min(rates):.0f} to {max(rates):.0f} {unit}/s per 10 s bucket "
          f"(mean {sum(rates) / len(rates):.0f}) over {thr[-1][0] + 10} s.")
print(f"Failures: {len(r['failures'])}")

"""Prints a soak report (soak-report.json) as the Markdown table the README carries."""
import json
import sys

r = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "soak-report.json"))
c = r["counts"]
print("| what | count |")
print("|---|---|")
for key in ["valid", "credits", "malformed", "missing_id", "dead_letters", "outbox_rows", "applied_events",
            "republished_after_window", "process_restarts", "poison_rows", "commits_cut", "webhook_calls", "notified"]:
    if key in c:
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
    print()
    print(f"Throughput: {min(rates):.0f} to {max(rates):.0f} credits/s per 10 s bucket "
          f"(mean {sum(rates) / len(rates):.0f}) over {thr[-1][0] + 10} s.")
print(f"Failures: {len(r['failures'])}")

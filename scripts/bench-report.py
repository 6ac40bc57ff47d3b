"""Renders BENCHMARKS.md from the JSON reports of `seawall bench --json`."""
import json
import sys

ORDER = ["inbox", "relay", "relay-memory", "latency", "e2e", "api"]
COMMANDS = {
    "inbox": "seawall bench inbox",
    "relay": "seawall bench relay",
    "relay-memory": "seawall bench relay-memory",
    "latency": "seawall bench latency",
    "e2e": "seawall bench e2e",
    "api": "seawall bench api",
}

reports = {}
for path in sys.argv[1:]:
    with open(path) as f:
        r = json.load(f)
    reports[r["scenario"]] = r

print("# seawall benchmarks\n")
print("Measured with `scripts/bench` (release build) on this project's CI machine kind; "
      "every figure below was produced by the command named above its table, and "
      "`python3 scripts/bench-report.py bench-results/*.json` regenerates this file.\n")
for name in ORDER:
    r = reports.get(name)
    if not r:
        continue
    print(f"## {name}\n")
    print(f"Command: `{COMMANDS[name]}` (with `--json` for the raw report)\n")
    versions = ", ".join(f"{k} {v}" for k, v in r["versions"])
    print(f"Machine: {r['cores']} cores; {versions}\n")
    for k, v in r["setup"]:
        print(f"- {k}: {v}")
    print()
    rows = r["rows"]
    if rows:
        cols = [k for k, _ in rows[0]["values"]]
        print("| | " + " | ".join(cols) + " |")
        print("|---|" + "|".join("---" for _ in cols) + "|")
        for row in rows:
            print(f"| {row['name']} | " + " | ".join(v for _, v in row["values"]) + " |")
        print()
    for note in r["notes"]:
        print(note + "\n")

import os
analysis = os.path.join(os.path.dirname(sys.argv[1]), "ANALYSIS.md") if len(sys.argv) > 1 else ""
if analysis and os.path.exists(analysis):
    print(open(analysis).read())

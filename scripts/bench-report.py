"""Renders BENCHMARKS.md from the JSON reports of `seawall-bench <scenario> --json`.

Each report carries its figures as numbers (the unit in the key) and the
columns of its table; a cell is printed the way `seawall-bench` prints it:
groups separated by " / ", each a total followed by its parts in parentheses.
"""
import json
import os
import sys

ORDER = ["inbox", "relay", "relay-memory", "latency", "e2e", "api"]


def cell(column, figures):
    """The text of one table cell (see `Column::cell` in bench/src/report.rs)."""
    decimals = column["decimals"]

    def number(value):
        return f"{value:.{decimals}f}"

    groups = []
    for keys in column["groups"]:
        if not keys or keys[0] not in figures:
            continue
        total = number(figures[keys[0]])
        parts = [number(figures[k]) for k in keys[1:] if k in figures]
        groups.append(f"{total} ({'+'.join(parts)})" if parts else total)
    return " / ".join(groups) if groups else "-"


def render(report):
    """One scenario's section of BENCHMARKS.md."""
    name = report["scenario"]
    print(f"## {name}\n")
    print(f"Command: `seawall-bench {name}` (with `--json` for the raw report)\n")
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"])
    print(f"Machine: {report['cores']} cores; {versions}\n")
    for k, v in report["setup"]:
        print(f"- {k}: {v}")
    print()
    columns = report["columns"]
    rows = report["rows"]
    if rows:
        print("| | " + " | ".join(c["header"] for c in columns) + " |")
        print("|---|" + "|".join("---" for _ in columns) + "|")
        for row in rows:
            cells = [cell(c, row["figures"]) for c in columns]
            print(f"| {row['name']} | " + " | ".join(cells) + " |")
        print()
    for note in report["notes"]:
        print(note + "\n")


def main(paths):
    reports = {}
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if "columns" not in report:
            sys.exit(f"{path}: figures as display strings, from before seawall-bench; "
                     "run scripts/bench to measure again")
        reports[report["scenario"]] = report

    print("# seawall benchmarks\n")
    print("Measured with `scripts/bench` (release build) on this project's CI machine kind; "
          "every figure below was produced by the command named above its table, and "
          "`python3 scripts/bench-report.py bench-results/*.json` regenerates this file.\n")
    for name in ORDER:
        if name in reports:
            render(reports[name])

    analysis = os.path.join(os.path.dirname(paths[0]), "ANALYSIS.md") if paths else ""
    if analysis and os.path.exists(analysis):
        with open(analysis) as f:
            print(f.read())


if __name__ == "__main__":
    main(sys.argv[1:])

//! Benchmark reports: the machine, the versions, the setup and the measured
//! figures.
//!
//! A figure is a number whose key names its unit (`messages_per_s`,
//! `p95_ms`, `cpu_ms_per_1k_total`), so the JSON can be compared across runs
//! and plotted without parsing text. Only the table printer turns figures
//! into text, following the report's [`Column`]s; the JSON carries the same
//! columns, so `seawall-bench report` renders BENCHMARKS.md from stored
//! reports with this same printer ([`document`]).

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};

/// Digits kept after the decimal point in a stored figure: finer than any
/// column prints, coarse enough to keep the JSON readable.
const STORED_DECIMALS: i32 = 3;

/// The measured figures of one row, in the order they were added (the JSON
/// object keeps that order).
#[derive(Debug, Clone, Default)]
pub struct Figures(Vec<(String, f64)>);

impl Figures {
    /// No figures yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a figure. A value that is not finite (a quantile of no samples, a
    /// rate over no time) is left out rather than written as `null`, so every
    /// figure in the JSON is a number; the table shows `-` in its place.
    #[must_use]
    pub fn with(mut self, key: &str, value: f64) -> Self {
        if value.is_finite() {
            let scale = 10f64.powi(STORED_DECIMALS);
            self.0
                .push((key.to_owned(), (value * scale).round() / scale));
        }
        self
    }

    /// The figure under `key`, if it was measured.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }
}

impl Serialize for Figures {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Figures {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Figures;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Figures, A::Error> {
                let mut figures = Vec::new();
                while let Some(entry) = map.next_entry::<String, f64>()? {
                    figures.push(entry);
                }
                Ok(Figures(figures))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// One column of the printed table: a header and the figures it shows.
///
/// A cell is one or more groups separated by ` / `; in a group the first key
/// is a total and the others its parts, printed as `total (part+part)`, so
/// that CPU per message reads with its split between processes and next to a
/// baseline's. Missing parts are skipped, a group without its total is
/// skipped, and a cell with no group left prints `-`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Column {
    /// What a reader sees above the column, with the unit in words.
    pub header: String,
    /// Digits printed after the decimal point.
    pub decimals: usize,
    /// Figure keys: groups of a total followed by its parts.
    pub groups: Vec<Vec<String>>,
}

impl Column {
    /// A column showing the figure `key`.
    pub fn figure(header: &str, key: &str, decimals: usize) -> Self {
        Self::breakdown(header, &[key], decimals)
    }

    /// A column showing `keys[0]` followed by the other keys as its parts.
    pub fn breakdown(header: &str, keys: &[&str], decimals: usize) -> Self {
        Self {
            header: header.to_owned(),
            decimals,
            groups: vec![keys.iter().map(|k| (*k).to_owned()).collect()],
        }
    }

    /// Adds a group after ` / ` (a baseline's figures beside the measured ones).
    #[must_use]
    pub fn then(mut self, keys: &[&str]) -> Self {
        self.groups
            .push(keys.iter().map(|k| (*k).to_owned()).collect());
        self
    }

    /// The text of this column's cell for `figures`.
    pub fn cell(&self, figures: &Figures) -> String {
        let number = |v: f64| format!("{v:.*}", self.decimals);
        let groups: Vec<String> = self
            .groups
            .iter()
            .filter_map(|group| {
                let (total, parts) = group.split_first()?;
                let total = number(figures.get(total)?);
                let parts: Vec<String> = parts
                    .iter()
                    .filter_map(|k| figures.get(k))
                    .map(number)
                    .collect();
                Some(if parts.is_empty() {
                    total
                } else {
                    format!("{total} ({})", parts.join("+"))
                })
            })
            .collect();
        if groups.is_empty() {
            "-".to_owned()
        } else {
            groups.join(" / ")
        }
    }
}

/// One measured line.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// What was measured ("PostgreSQL, 16 workers").
    pub name: String,
    /// The figures, each a number with its unit in the key.
    pub figures: Figures,
}

/// A scenario's report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The scenario's command-line name.
    pub scenario: String,
    /// Cores available to this process: the figures mean little without it,
    /// since the servers share them.
    pub cores: usize,
    /// Server and library versions, as (name, version).
    pub versions: Vec<(String, String)>,
    /// What was run, in words, as (topic, description).
    pub setup: Vec<(String, String)>,
    /// How the table shows the rows' figures.
    pub columns: Vec<Column>,
    /// The measurements.
    pub rows: Vec<Row>,
    /// Conclusions printed under the table.
    pub notes: Vec<String>,
}

impl Report {
    /// An empty report for this machine, printed with `columns`.
    pub fn new(scenario: &str, columns: Vec<Column>) -> Self {
        Self {
            scenario: scenario.to_owned(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            versions: Vec::new(),
            setup: Vec::new(),
            columns,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Records the version of a server or library the figures depend on.
    pub fn version(&mut self, name: &str, version: impl Into<String>) {
        self.versions.push((name.to_owned(), version.into()));
    }

    /// Whether the version of `name` is recorded already.
    pub fn has_version(&self, name: &str) -> bool {
        self.versions.iter().any(|(k, _)| k == name)
    }

    /// Describes part of the setup.
    pub fn setup(&mut self, topic: &str, description: impl Into<String>) {
        self.setup.push((topic.to_owned(), description.into()));
    }

    /// Adds a measured line.
    pub fn row(&mut self, name: impl Into<String>, figures: Figures) {
        self.rows.push(Row {
            name: name.into(),
            figures,
        });
    }

    /// The report's section of BENCHMARKS.md: the command, the machine,
    /// the setup, the table and the notes. `seawall-bench <scenario>`
    /// prints it, and [`document`] puts the stored reports' together.
    pub fn section(&self) -> String {
        let name = &self.scenario;
        let mut out = format!("## {name}\n\n");
        out += &format!("Command: `seawall-bench {name}` (with `--json` for the raw report)\n\n");
        let versions: Vec<String> = self
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        out += &format!("Machine: {} cores; {}\n\n", self.cores, versions.join(", "));
        for (k, v) in &self.setup {
            out += &format!("- {k}: {v}\n");
        }
        out.push('\n');
        if !self.rows.is_empty() {
            let headers: Vec<&str> = self.columns.iter().map(|c| c.header.as_str()).collect();
            out += &format!("| | {} |\n", headers.join(" | "));
            out += &format!("|---|{}|\n", vec!["---"; headers.len()].join("|"));
            for row in &self.rows {
                let cells: Vec<String> =
                    self.columns.iter().map(|c| c.cell(&row.figures)).collect();
                out += &format!("| {} | {} |\n", row.name, cells.join(" | "));
            }
            out.push('\n');
        }
        for note in &self.notes {
            out += &format!("{note}\n\n");
        }
        out
    }
}

/// The order of the scenarios in BENCHMARKS.md.
const ORDER: [&str; 6] = ["inbox", "relay", "relay-memory", "latency", "e2e", "api"];

/// BENCHMARKS.md from stored reports (`seawall-bench <scenario> --json`),
/// in [`ORDER`], followed by the `analysis` written by hand, if any.
pub fn document(reports: &[Report], analysis: Option<&str>) -> String {
    let mut out = String::from("# seawall benchmarks\n\n");
    out += "Measured with `scripts/bench` (release build) on this project's CI machine kind; \
            every figure below was produced by the command named above its table, and \
            `seawall-bench report bench-results/*.json` regenerates this file.\n\n";
    for name in ORDER {
        // The last report of a scenario wins, as a later run replaces it.
        if let Some(report) = reports.iter().rev().find(|r| r.scenario == name) {
            out += &report.section();
        }
    }
    if let Some(analysis) = analysis {
        out += analysis;
        out.push('\n');
    }
    out
}

/// The `q` quantile (0..=1) of sorted samples; NaN (left out of the report)
/// when there are none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_lists_the_parts_after_the_total_and_skips_what_is_missing() {
        let cpu = Column::breakdown("CPU", &["total", "a", "b"], 0).then(&["base", "base_a"]);
        let f = Figures::new()
            .with("total", 840.2)
            .with("a", 331.0)
            .with("b", 508.4)
            .with("base", 555.0)
            .with("base_a", 238.0);
        assert_eq!(cpu.cell(&f), "840 (331+508) / 555 (238)");
        let f = Figures::new().with("total", 45.44).with("b", 9.64);
        assert_eq!(cpu.cell(&f), "45 (10)");
        assert_eq!(Column::figure("x", "total", 1).cell(&f), "45.4");
        assert_eq!(Column::figure("x", "absent", 0).cell(&f), "-");
    }
}

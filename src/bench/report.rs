//! Benchmark reports: the machine, the versions, the figures.

use serde::Serialize;

/// One measured line.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Figures by column name.
    pub values: Vec<(String, String)>,
}

/// A scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub cores: usize,
    pub versions: Vec<(String, String)>,
    pub setup: Vec<(String, String)>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Report {
    /// A report for this machine.
    pub fn new(scenario: &str) -> Self {
        Self {
            scenario: scenario.to_owned(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            versions: Vec::new(),
            setup: Vec::new(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a measured line.
    pub fn row(&mut self, name: impl Into<String>, values: Vec<(&str, String)>) {
        self.rows.push(Row {
            name: name.into(),
            values: values.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        });
    }

    /// Prints the report as a Markdown table (pasteable into BENCHMARKS.md).
    pub fn print(&self) {
        println!("## seawall bench {}", self.scenario);
        println!();
        let versions: Vec<String> = self
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!("machine: {} cores; {}", self.cores, versions.join(", "));
        for (k, v) in &self.setup {
            println!("{k}: {v}");
        }
        println!();
        let Some(first) = self.rows.first() else {
            println!("(no rows)");
            return;
        };
        let headers: Vec<&str> = std::iter::once("")
            .chain(first.values.iter().map(|(k, _)| k.as_str()))
            .collect();
        println!("| {} |", headers.join(" | "));
        println!(
            "|{}|",
            headers.iter().map(|_| "---").collect::<Vec<_>>().join("|")
        );
        for row in &self.rows {
            let cells: Vec<&str> = std::iter::once(row.name.as_str())
                .chain(row.values.iter().map(|(_, v)| v.as_str()))
                .collect();
            println!("| {} |", cells.join(" | "));
        }
        for note in &self.notes {
            println!();
            println!("{note}");
        }
    }
}

/// The `q` quantile (0..=1) of sorted samples.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

//! CPU time spent by this process, PostgreSQL and nats-server during a
//! measurement, read from `/proc`. On a small machine the three share the
//! cores, so CPU per message tells where a throughput ceiling comes from and
//! what the ceiling is (cores / CPU per message), which wall-clock rates alone
//! cannot.

use std::time::Duration;

/// Kernel clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`, fixed at
/// 100 by the Linux user-space ABI).
const TICKS_PER_SECOND: u64 = 100;

/// CPU time so far, by party.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    /// This process (the relay or publisher under test).
    pub this: Duration,
    /// Every `postgres` process on the machine.
    pub postgres: Duration,
    /// Every `nats-server` process on the machine.
    pub nats: Duration,
}

impl CpuSample {
    /// Reads the counters now. Processes that cannot be read (gone, or other
    /// users' on a locked-down `/proc`) count as zero, so the figures are a
    /// lower bound and never an error.
    pub fn now() -> Self {
        let me = std::process::id().to_string();
        let mut sample = Self::default();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return sample;
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some((comm, time)) = parse_stat(&stat) else {
                continue;
            };
            if pid == me {
                sample.this += time;
            } else if comm == "postgres" {
                sample.postgres += time;
            } else if comm == "nats-server" {
                sample.nats += time;
            }
        }
        sample
    }

    /// CPU spent since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            this: self.this.saturating_sub(earlier.this),
            postgres: self.postgres.saturating_sub(earlier.postgres),
            nats: self.nats.saturating_sub(earlier.nats),
        }
    }

    /// Milliseconds of CPU per 1,000 of `messages`, by party.
    pub fn per_thousand(&self, messages: u64) -> PerThousand {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / messages.max(1) as f64;
        PerThousand {
            this: per(self.this),
            postgres: per(self.postgres),
            nats: per(self.nats),
        }
    }
}

/// Milliseconds of CPU per 1,000 messages, by party: the unit the reports
/// use, since a ceiling is cores / CPU per message.
#[derive(Debug, Clone, Copy)]
pub struct PerThousand {
    /// This process.
    pub this: f64,
    /// All `postgres` processes.
    pub postgres: f64,
    /// All `nats-server` processes.
    pub nats: f64,
}

impl PerThousand {
    /// All three parties together.
    pub fn total(&self) -> f64 {
        self.this + self.postgres + self.nats
    }
}

/// The command name and user + system CPU time from a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(&str, Duration)> {
    // "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // After comm: state is field 3 of the line, utime 14 and stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = utime + stime;
    Some((comm, Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_spaces_in_the_name() {
        let line =
            "4242 (nats server) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 12 0 100 0 0";
        let (comm, time) = parse_stat(line).expect("parsed");
        assert_eq!(comm, "nats server");
        assert_eq!(time, Duration::from_millis(3000));
    }

    #[test]
    fn a_truncated_line_is_skipped() {
        assert!(parse_stat("4242 (postgres) S 1 2").is_none());
    }

    #[test]
    fn this_process_is_counted() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(CpuSample::now().this > Duration::ZERO);
    }
}

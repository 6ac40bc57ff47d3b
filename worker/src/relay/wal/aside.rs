//! A relay whose own walsender PostgreSQL chose as a synchronous standby
//! (`synchronous_standby_names` matching its `application_name`): commits
//! would wait for the relay, which waits for a physical standby or for its
//! own records' commits. The session notices, lets its connection go and
//! stays aside, not ready, until PostgreSQL has a physical standby to wait
//! for (docs/outbox.md).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::WalRelay;
use super::slot::RESERVE_CHECK;

/// Longest a relay that stepped aside waits before it tries again while a
/// physical standby is synchronous (the setting unchanged): each try may
/// hold commits for up to [`ROLE_CHECK`].
pub(super) const ASIDE_MAX: Duration = Duration::from_secs(60);

/// How often a session asks whether its walsender became a synchronous
/// standby: how long commits may wait for it before it steps aside.
const ROLE_CHECK: Duration = Duration::from_millis(500);

impl WalRelay {
    /// Why the relay cannot relay now, asked at every `/readyz`: `Some`
    /// while it stays off as a synchronous standby would be.
    pub fn readiness(&self) -> Arc<dyn Fn() -> Option<String> + Send + Sync> {
        let problem = Arc::clone(&self.problem);
        Arc::new(move || problem.lock().ok().and_then(|p| p.clone()))
    }

    fn set_problem(&self, problem: Option<String>) {
        if let Ok(mut slot) = self.problem.lock() {
            *slot = problem;
        }
    }

    /// Says, as soon as the session finds it, that the relay steps aside
    /// as a synchronous standby: not ready first, so whoever reads the log
    /// finds `/readyz` agreeing.
    pub(super) fn announce_aside(&self, slot: &str, names: &str) {
        self.set_problem(Some(format!(
            "the WAL relay is off: its walsender for slot {slot} was a synchronous standby under synchronous_standby_names = '{names}'"
        )));
        tracing::error!(
            %slot,
            synchronous_standby_names = %names,
            "the WAL relay's walsender was chosen as a synchronous standby, and commits would wait for it: it disconnected, and stays off until synchronous_standby_names changes or a physical standby is the synchronous one; name the physical standbys there (e.g. FIRST 1 (standby1, standby2)) instead of a pattern the relay's application_name matches"
        );
    }

    /// Disconnected already (the session ended), stays off until
    /// `synchronous_standby_names` is no longer `names` or a physical
    /// standby is the synchronous one, but at least `pause`: PostgreSQL
    /// then has a physical standby to wait for, and commits go on.
    /// Connecting again with the same setting can make the relay the
    /// synchronous standby again (a walsender in a lower slot wins a tie of
    /// priorities), so `run` doubles `pause` each time in a row; the slot's
    /// reserve is still watched meanwhile.
    pub(super) async fn step_aside(
        &self,
        names: &str,
        pause: Duration,
        cancel: &CancellationToken,
    ) {
        let started = std::time::Instant::now();
        let mut checked = started;
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(self.config.standby_retry) => {}
            }
            if checked.elapsed() >= RESERVE_CHECK {
                self.warn_if_at_risk().await;
                checked = std::time::Instant::now();
            }
            match service::wal::relay::synchronous_standbys(&self.db).await {
                Ok((now, _)) if now != names => break,
                Ok((_, physical)) if physical && started.elapsed() >= pause => break,
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(error = %err, "could not read synchronous_standby_names")
                }
            }
        }
        self.set_problem(None);
    }

    /// Returns `synchronous_standby_names` once the walsender streaming the
    /// slot is a synchronous standby (asked every [`ROLE_CHECK`]; errors
    /// are left to the session, which meets them too).
    pub(super) async fn until_synchronous(&self) -> String {
        loop {
            tokio::time::sleep(ROLE_CHECK).await;
            match service::wal::relay::synchronous_role(&self.db, &self.config.slot).await {
                Ok(Some(names)) => return names,
                Ok(None) => {}
                Err(err) => {
                    tracing::debug!(error = %err, "could not ask whether the WAL relay is a synchronous standby");
                }
            }
        }
    }
}

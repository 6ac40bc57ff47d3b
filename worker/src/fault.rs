//! Fault points: places where a crash test or the soak makes the process
//! abort on purpose, to prove what survives a crash exactly there. The binary
//! reads which one (if any) from its configuration and hands it in; the
//! library reads no environment.

/// Where to abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultPoint {
    /// The relay, right after a batch's PubAcks and before recording them
    /// (`relay-after-puback`).
    RelayAfterPuback,
    /// The claim path, after the claim committed and before the effect
    /// (`claim-after-commit`).
    ClaimAfterCommit,
    /// The claim path, after the effect and before its record
    /// (`claim-after-call`).
    ClaimAfterCall,
}

impl FaultPoint {
    /// Every point, by its configuration name.
    pub const ALL: [(&'static str, FaultPoint); 3] = [
        ("relay-after-puback", FaultPoint::RelayAfterPuback),
        ("claim-after-commit", FaultPoint::ClaimAfterCommit),
        ("claim-after-call", FaultPoint::ClaimAfterCall),
    ];

    /// The point named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }

    /// Aborts the process when `armed` is this point.
    pub(crate) fn hit(self, armed: Option<FaultPoint>) {
        if armed == Some(self) {
            tracing::error!(point = ?self, "fault injection: aborting");
            std::process::abort();
        }
    }
}

//! Exhaustive check of the claim/lease state machine under every interleaving.
//!
//! Each step below is one SQL statement of `service::claim` and
//! `service::sweep`, with exactly the predicates their `WHERE` clauses use;
//! the database runs each statement atomically, so exploring every order of
//! the statements of several actors explores every schedule the database can
//! produce. Actors: contenders taking over an expired claim (read, then the
//! conditional update on the attempt count), the crashed owner coming back to
//! complete, and a sweeper (read, then conditional release or quarantine).

use std::collections::BTreeSet;

/// The inbox row of one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    attempts: u32,
    owner: Option<u8>,
    /// Lease in the past (the scenario starts after the first owner's lease ran out).
    lease_expired: bool,
    processed_by: Option<u8>,
    quarantined: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `take_over`: read the row.
    Read,
    /// `take_over`: UPDATE ... WHERE attempts = read AND processed IS NULL AND quarantined IS NULL.
    TakeOver,
    /// `ClaimGuard::complete`: UPDATE ... WHERE claimed_by = me AND attempts = mine AND processed IS NULL.
    Complete,
    /// sweeper: read the row.
    SweepRead,
    /// sweeper: release (attempts below the limit) or quarantine, conditional on the read.
    Sweep,
}

#[derive(Debug, Clone)]
struct Actor {
    id: u8,
    steps: Vec<Step>,
    next: usize,
    /// What the actor read (attempts, lease expired, open).
    seen: Option<(u32, bool, bool)>,
    /// The attempt this actor owns, if any.
    owns: Option<u32>,
}

const MAX_ATTEMPTS: u32 = 3;

fn apply(row: &mut Row, actor: &mut Actor, step: Step, winners: &mut Vec<(u8, u32)>) {
    match step {
        Step::Read | Step::SweepRead => {
            let open = row.processed_by.is_none() && !row.quarantined;
            actor.seen = Some((row.attempts, row.lease_expired, open));
        }
        Step::TakeOver => {
            let Some((attempts, expired, open)) = actor.seen else {
                return;
            };
            // The Rust side decides on the read; the UPDATE re-checks what matters.
            if open
                && expired
                && attempts < MAX_ATTEMPTS
                && row.attempts == attempts
                && row.processed_by.is_none()
                && !row.quarantined
            {
                row.attempts += 1;
                row.owner = Some(actor.id);
                row.lease_expired = false;
                actor.owns = Some(row.attempts);
                winners.push((actor.id, row.attempts));
            }
        }
        Step::Complete => {
            if let Some(mine) = actor.owns
                && row.owner == Some(actor.id)
                && row.attempts == mine
                && row.processed_by.is_none()
            {
                row.processed_by = Some(actor.id);
                row.lease_expired = false;
            }
        }
        Step::Sweep => {
            let Some((attempts, expired, open)) = actor.seen else {
                return;
            };
            if !open || !expired {
                return;
            }
            if attempts >= MAX_ATTEMPTS {
                if row.attempts == attempts && row.processed_by.is_none() && !row.quarantined {
                    row.quarantined = true;
                }
            } else if row.attempts == attempts && row.processed_by.is_none() && row.lease_expired {
                row.owner = None;
            }
        }
    }
}

/// Who recorded the effect: (actor, the claim attempt it held), in order.
type Winners = [(u8, u32)];

/// A check run on each finished schedule, besides the invariants.
type Check<'a> = &'a dyn Fn(&Row, &Winners);

/// Runs every interleaving of `actors` from `row`, checking the invariants at the end of each.
fn explore(
    row: Row,
    actors: Vec<Actor>,
    winners: Vec<(u8, u32)>,
    schedules: &mut u64,
    extra: Check<'_>,
) {
    let mut progressed = false;
    for i in 0..actors.len() {
        if actors[i].next >= actors[i].steps.len() {
            continue;
        }
        progressed = true;
        let (mut row, mut actors, mut winners) = (row.clone(), actors.clone(), winners.clone());
        let step = actors[i].steps[actors[i].next];
        actors[i].next += 1;
        apply(&mut row, &mut actors[i], step, &mut winners);
        explore(row, actors, winners, schedules, extra);
    }
    if !progressed {
        *schedules += 1;
        check(&row, &winners);
        extra(&row, &winners);
    }
}

fn check(row: &Row, winners: &[(u8, u32)]) {
    // One owner per attempt: a takeover is won by exactly one contender.
    let attempts: BTreeSet<u32> = winners.iter().map(|(_, a)| *a).collect();
    assert_eq!(
        attempts.len(),
        winners.len(),
        "two contenders own the same attempt: {winners:?}"
    );
    // Whoever completed was the owner of the final attempt (a stale owner cannot).
    if let Some(done) = row.processed_by {
        assert_eq!(row.owner, Some(done), "{row:?} completed by a non-owner");
    }
    // Never both done and quarantined.
    assert!(!(row.quarantined && row.processed_by.is_some()), "{row:?}");
    assert!(row.attempts <= MAX_ATTEMPTS);
}

fn actor(id: u8, steps: &[Step]) -> Actor {
    Actor {
        id,
        steps: steps.to_vec(),
        next: 0,
        seen: None,
        owns: None,
    }
}

#[test]
fn every_interleaving_of_takeovers_a_stale_owner_and_a_sweeper_keeps_one_owner() {
    use Step::*;
    // The first owner (actor 0) claimed attempt 1, its lease ran out, and it
    // comes back to complete while three contenders take over and a sweeper runs.
    let row = Row {
        attempts: 1,
        owner: Some(0),
        lease_expired: true,
        processed_by: None,
        quarantined: false,
    };
    let mut stale = actor(0, &[Complete]);
    stale.owns = Some(1);
    let actors = vec![
        stale,
        actor(1, &[Read, TakeOver, Complete]),
        actor(2, &[Read, TakeOver, Complete]),
        actor(9, &[SweepRead, Sweep]),
    ];
    let mut schedules = 0;
    explore(row, actors, Vec::new(), &mut schedules, &|_, _| {});
    // 9 steps in groups of 1, 3, 3, 2: 9! / (1! 3! 3! 2!) schedules.
    assert_eq!(schedules, 5_040);
}

#[test]
fn at_the_attempt_limit_every_interleaving_quarantines_instead_of_taking_over() {
    use Step::*;
    let row = Row {
        attempts: MAX_ATTEMPTS,
        owner: Some(0),
        lease_expired: true,
        processed_by: None,
        quarantined: false,
    };
    let actors = vec![
        actor(1, &[Read, TakeOver]),
        actor(2, &[Read, TakeOver]),
        actor(9, &[SweepRead, Sweep]),
    ];
    let mut schedules = 0;
    explore(row, actors, Vec::new(), &mut schedules, &|row, winners| {
        assert!(
            winners.is_empty(),
            "nobody takes over a claim at its attempt limit"
        );
        assert!(row.quarantined, "the sweeper quarantined it");
    });
    assert_eq!(schedules, 90);
}

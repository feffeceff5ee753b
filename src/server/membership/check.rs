//! etcd's strict reconfiguration checks (etcd 3.4 `mayAddMember`, `mayRemoveMember`,
//! `mayPromoteMember`), as rules over what is known of each voter.
//!
//! Invariants:
//! - A voter set about to take effect needs a quorum of its voters started (their attributes
//!   published) and a quorum active (heard from within the health interval), except that a
//!   one-member cluster may grow to two, as etcd allows when a cluster is restored from one
//!   member.
//! - A learner needs only a quorum of the current voters active: it takes no part in quorum,
//!   so whether the voters have published does not matter. Checking "started" there refused a
//!   learner added right after the cluster started, before every member had published.

use crate::server::error::ApiError;

/// What the checks know of one voter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Voter {
    /// Its attributes are published (etcd: the member has started).
    pub started: bool,
    /// It answered within the health interval.
    pub active: bool,
}

pub(crate) use crate::raft::quorum;

/// The check for `voters`, the voter set a change would make. `growing` is true when the
/// change adds a voter.
pub(crate) fn admit_voters(voters: &[Voter], growing: bool) -> Result<(), ApiError> {
    let n = voters.len();
    let started = voters.iter().filter(|v| v.started).count();
    let active = voters.iter().filter(|v| v.active).count();
    let growing_from_one = growing && n == 2 && started == 1;
    if growing_from_one {
        return Ok(());
    }
    if started < quorum(n) {
        return Err(ApiError::NotEnoughStartedMembers);
    }
    if active < quorum(n) {
        return Err(ApiError::Unhealthy);
    }
    Ok(())
}

/// The check before adding a learner to a cluster whose voters are `voters`.
pub(crate) fn admit_learner(voters: &[Voter]) -> Result<(), ApiError> {
    let active = voters.iter().filter(|v| v.active).count();
    if active < quorum(voters.len()) {
        return Err(ApiError::Unhealthy);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: Voter = Voter {
        started: true,
        active: true,
    };
    /// Connected, not yet published: every member for a moment after a cluster starts.
    const UNPUBLISHED: Voter = Voter {
        started: false,
        active: true,
    };
    const DOWN: Voter = Voter {
        started: true,
        active: false,
    };
    /// Added as a voter, never started.
    const NEW: Voter = Voter {
        started: false,
        active: false,
    };

    #[test]
    fn a_learner_needs_connected_voters_not_published_ones() {
        let voters = [UP, UNPUBLISHED, UNPUBLISHED];
        assert!(admit_learner(&voters).is_ok());
        // The voter check on the same cluster refuses: the learner check used to be this one.
        assert!(matches!(
            admit_voters(&voters, false),
            Err(ApiError::NotEnoughStartedMembers)
        ));
    }

    #[test]
    fn a_learner_is_refused_without_a_connected_quorum() {
        assert!(matches!(
            admit_learner(&[UP, DOWN, DOWN]),
            Err(ApiError::Unhealthy)
        ));
        assert!(admit_learner(&[UP, DOWN, UP]).is_ok());
        assert!(admit_learner(&[UP]).is_ok());
    }

    #[test]
    fn a_voter_set_needs_a_started_and_an_active_quorum() {
        assert!(admit_voters(&[UP, UP, NEW], true).is_ok());
        assert!(matches!(
            admit_voters(&[UP, UP, NEW, NEW], true),
            Err(ApiError::NotEnoughStartedMembers)
        ));
        assert!(matches!(
            admit_voters(&[UP, DOWN, NEW], true),
            Err(ApiError::Unhealthy)
        ));
        assert!(matches!(
            admit_voters(&[UP, DOWN], false),
            Err(ApiError::Unhealthy)
        ));
    }

    #[test]
    fn one_member_may_grow_to_two() {
        assert!(admit_voters(&[UP, NEW], true).is_ok());
        // Not when no voter joins: two voters need both.
        assert!(matches!(
            admit_voters(&[UP, NEW], false),
            Err(ApiError::NotEnoughStartedMembers)
        ));
    }
}

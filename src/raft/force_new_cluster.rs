//! `--force-new-cluster`: after a quorum loss, one surviving member restarts as the only voter
//! of its cluster, with every write it applied and every revision (etcd's
//! `restartAsStandaloneNode`).
//!
//! Before Raft starts on the stored log:
//! 1. The log is cut after the newest index known committed here: the WAL's committed id or
//!    the state machine's last applied one, whichever is newer. Later entries are discarded, as
//!    etcd discards entries above its HardState's commit: they may never have committed.
//! 2. A membership entry with only this member as voter (no learners) is appended at a new term
//!    (one above the vote's and the log's), with a vote for this member at that term, and the
//!    committed id is moved to it. On start, openraft applies it (the state machine marks the
//!    other members removed, as etcd's apply of the conf changes does) and, the only voter,
//!    elects itself.
//!
//! Each step is durable before the next, and the whole is idempotent: a crash midway, and a
//! restart that still has the flag, do it again on the log as it is then (a half-done forced
//! entry is uncommitted and cut in step 1). A member that is already the only voter only gets
//! step 1. Left set on later restarts, the flag removes members added since again, as etcd's
//! does: the member warns about it every time.

use std::collections::{BTreeMap, BTreeSet};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::vote::RaftLeaderId;

use crate::raft::error::StoreError;
use crate::raft::log::log_store::LogStore;
use crate::raft::sm::state_machine::StateMachine;
use crate::raft::types::{Entry, LogId, Membership, NodeId, Vote};

/// What forcing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    /// The last index kept (known committed here).
    pub kept: u64,
    /// Entries discarded after it.
    pub discarded: u64,
    /// Members no longer in the configuration.
    pub removed: Vec<NodeId>,
    /// The term of the forced configuration (`None`: this member was already alone).
    pub term: Option<u64>,
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e)
}

/// Rewrites the log in `log` so that member `me` is the only voter (see the module doc). Runs
/// before Raft starts on `log` and `sm`.
pub async fn force_new_cluster(
    log: &LogStore,
    sm: &StateMachine,
    me: NodeId,
) -> Result<Forced, StoreError> {
    let mut log = log.clone();
    let state = log.get_log_state().await.map_err(io)?;
    let Some(last) = state.last_log_id else {
        // Nothing stored: a fresh member bootstraps as usual (etcd ignores the flag then).
        return Ok(Forced {
            kept: 0,
            discarded: 0,
            removed: Vec::new(),
            term: None,
        });
    };
    let committed = log.read_committed().await.map_err(io)?;
    let applied = sm.last_applied()?;
    let known = committed
        .max(applied)
        .map_or(0, |l| l.index)
        .min(last.index);
    let kept = log_id_at(&mut log, sm, state.last_purged_log_id, known).await?;
    let discarded = last.index - known;
    if discarded > 0 {
        tracing::warn!(
            kept = known,
            discarded,
            "--force-new-cluster: discarding log entries after the last index known committed"
        );
        log.truncate_after(kept).await.map_err(io)?;
    }

    let current = membership_upto(&mut log, sm, known).await?;
    let mine = current
        .get_node(&me)
        .cloned()
        .ok_or_else(|| StoreError::Inconsistent {
            what: "membership",
            reason: format!("member {me:x} is not in its own cluster configuration"),
        })?;
    let removed: Vec<NodeId> = current
        .nodes()
        .map(|(id, _)| *id)
        .filter(|id| *id != me)
        .collect();
    let voters: Vec<NodeId> = current.voter_ids().collect();
    if removed.is_empty() && voters == [me] {
        tracing::warn!(
            "--force-new-cluster is set but this member is already the only one of its \
             cluster; restart without the flag"
        );
        return Ok(Forced {
            kept: known,
            discarded,
            removed,
            term: None,
        });
    }

    let vote = log.read_vote().await.map_err(io)?;
    let term = vote
        .map_or(0, |v| v.leader_id.term())
        .max(last.leader_id.term())
        + 1;
    let leader = <LogId as LogIdLeader>::leader(term, me);
    let id = LogId::new(leader, known + 1);
    let config = Membership::new(vec![BTreeSet::from([me])], BTreeMap::from([(me, mine)]))
        .map_err(|source| StoreError::Membership {
            what: "the forced single-member configuration",
            source,
        })?;
    let entry = Entry::new_membership(id, config);

    // Made durable by the vote's write below, which the WAL orders after it.
    log.append([entry], IOFlushed::noop()).await.map_err(io)?;
    log.save_vote(&Vote::new_committed(term, me))
        .await
        .map_err(io)?;
    log.save_committed(Some(id)).await.map_err(io)?;
    log.flush_committed().await?;
    tracing::warn!(
        kept = known,
        term,
        removed = ?removed.iter().map(|id| format!("{id:x}")).collect::<Vec<_>>(),
        "--force-new-cluster: this member is now the only voter of its cluster; restart it \
         without the flag once recovered (left set, it removes members added since again)"
    );
    Ok(Forced {
        kept: known,
        discarded,
        removed,
        term: Some(term),
    })
}

/// Builds log ids' leader part from a term and a node.
trait LogIdLeader {
    type Leader;
    fn leader(term: u64, node: NodeId) -> Self::Leader;
}

impl LogIdLeader for LogId {
    type Leader = <crate::raft::types::LeaderId as RaftLeaderId>::Committed;
    fn leader(term: u64, node: NodeId) -> Self::Leader {
        <crate::raft::types::LeaderId as RaftLeaderId>::new(term, node).to_committed()
    }
}

/// The log id at `index`: from the log, the purge point or the state machine.
async fn log_id_at(
    log: &mut LogStore,
    sm: &StateMachine,
    purged: Option<LogId>,
    index: u64,
) -> Result<Option<LogId>, StoreError> {
    if index == 0 {
        return Ok(None);
    }
    if let Some(e) = log
        .try_get_log_entries(index..index + 1)
        .await
        .map_err(io)?
        .into_iter()
        .next()
    {
        return Ok(Some(e.log_id()));
    }
    for id in [purged, sm.last_applied()?].into_iter().flatten() {
        if id.index == index {
            return Ok(Some(id));
        }
    }
    Err(StoreError::Inconsistent {
        what: "log",
        reason: format!("no log id for index {index}"),
    })
}

/// The configuration in force at `index`: the last membership entry up to it in the log, or
/// the state machine's.
async fn membership_upto(
    log: &mut LogStore,
    sm: &StateMachine,
    index: u64,
) -> Result<Membership, StoreError> {
    let applied = sm.last_applied()?.map_or(0, |l| l.index);
    let from = applied + 1;
    if from <= index {
        let entries = log.try_get_log_entries(from..index + 1).await.map_err(io)?;
        if let Some(m) = entries.iter().rev().find_map(|e| e.get_membership()) {
            return Ok(m);
        }
    }
    Ok(sm.membership()?.membership().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::Member;
    use openraft::storage::RaftLogReader;

    fn member(i: u64) -> Member {
        Member {
            peer_urls: vec![format!("http://127.0.0.1:{}", 2380 + i)],
        }
    }

    fn id(term: u64, node: NodeId, index: u64) -> LogId {
        LogId::new(<LogId as LogIdLeader>::leader(term, node), index)
    }

    /// A log of three members led by 2 in term 3: the configuration at 1, blanks at 2..=4,
    /// committed (durably) up to 3.
    async fn three_member_log(dir: &std::path::Path) -> (LogStore, StateMachine) {
        let mut log = LogStore::open(&dir.join("wal")).unwrap();
        let sm = StateMachine::open(&dir.join("sm")).unwrap();
        let all = Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            BTreeMap::from([(1, member(1)), (2, member(2)), (3, member(3))]),
        )
        .unwrap();
        let mut entries = vec![Entry::new_membership(id(3, 2, 1), all)];
        entries.extend((2..=4).map(|i| Entry::new_blank(id(3, 2, i))));
        log.append(entries, IOFlushed::noop()).await.unwrap();
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        log.save_committed(Some(id(3, 2, 3))).await.unwrap();
        log.flush_committed().await.unwrap();
        (log, sm)
    }

    #[tokio::test]
    async fn forced_log_keeps_the_committed_prefix_and_ends_with_a_one_voter_config() {
        let d = tempfile::tempdir().unwrap();
        let (log, sm) = three_member_log(d.path()).await;
        let forced = force_new_cluster(&log, &sm, 1).await.unwrap();
        assert_eq!(
            forced,
            Forced {
                kept: 3,
                discarded: 1,
                removed: vec![2, 3],
                term: Some(4),
            }
        );
        drop((log, sm));

        // Durable: a reopened log holds exactly that.
        let mut log = LogStore::open(&d.path().join("wal")).unwrap();
        let sm = StateMachine::open(&d.path().join("sm")).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(id(4, 1, 4)));
        let last = log.try_get_log_entries(4..5).await.unwrap();
        let m = last[0].get_membership().expect("a configuration");
        assert_eq!(m.voter_ids().collect::<Vec<_>>(), [1]);
        assert_eq!(m.nodes().count(), 1);
        assert_eq!(log.read_committed().await.unwrap(), Some(id(4, 1, 4)));
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(4, 1))
        );
        assert_eq!(
            log.try_get_log_entries(3..4).await.unwrap()[0].log_id(),
            id(3, 2, 3),
            "the committed prefix is untouched"
        );

        // The flag left set: already alone, nothing more to do.
        let again = force_new_cluster(&log, &sm, 1).await.unwrap();
        assert_eq!(again.term, None);
        assert_eq!(again.discarded, 0);
        assert_eq!(
            log.get_log_state().await.unwrap().last_log_id,
            Some(id(4, 1, 4))
        );
    }

    #[tokio::test]
    async fn a_half_done_force_is_redone_at_a_newer_term() {
        let d = tempfile::tempdir().unwrap();
        let (mut log, sm) = three_member_log(d.path()).await;
        // As if a first attempt crashed after appending its entry and saving its vote, before
        // moving the committed id: that entry is uncommitted and gets cut.
        let solo =
            Membership::new(vec![BTreeSet::from([1])], BTreeMap::from([(1, member(1))])).unwrap();
        log.truncate_after(Some(id(3, 2, 3))).await.unwrap();
        log.append(
            [Entry::new_membership(id(4, 1, 4), solo)],
            IOFlushed::noop(),
        )
        .await
        .unwrap();
        log.save_vote(&Vote::new_committed(4, 1)).await.unwrap();

        let forced = force_new_cluster(&log, &sm, 1).await.unwrap();
        assert_eq!(
            (forced.kept, forced.discarded, forced.term),
            (3, 1, Some(5))
        );
        assert_eq!(
            log.get_log_state().await.unwrap().last_log_id,
            Some(id(5, 1, 4))
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(id(5, 1, 4)));
    }

    #[tokio::test]
    async fn an_empty_log_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let log = LogStore::open(&d.path().join("wal")).unwrap();
        let sm = StateMachine::open(&d.path().join("sm")).unwrap();
        let forced = force_new_cluster(&log, &sm, 1).await.unwrap();
        assert_eq!((forced.kept, forced.term), (0, None));
    }
}

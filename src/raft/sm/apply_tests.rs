//! Applying entries this build cannot apply (they stop the apply, never skipped), and random
//! accepted requests (they always apply).

use bytes::Bytes;
use futures::stream;
use openraft::entry::RaftEntry;
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;
use prost::Message;

use super::*;
use crate::proto::etcdserverpb::{PutRequest, RangeRequest};
use crate::raft::types::Entry;

fn put(key: &str) -> Command {
    let req = InternalRequest {
        request: Some(internal_request::Request::Put(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    Command(Bytes::from(req.encode_to_vec()))
}

/// A command nested far beyond what any member decodes: 100,000 levels of groups.
fn too_deep() -> Command {
    Command(Bytes::from(vec![0x0b_u8; 100_000]))
}

pub(super) async fn apply(sm: &mut StateMachine, cmds: Vec<Command>, first: u64) {
    let entries: Vec<Result<EntryResponder<TypeConfig>, io::Error>> = cmds
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let id = log_id::<TypeConfig>(1, 1, first + i as u64);
            Ok((Entry::new_normal(id, c), None))
        })
        .collect();
    sm.apply(stream::iter(entries)).await.expect("apply");
}

/// Opens the state machine again once the last handle's background threads let go of the
/// engine's lock (they end shortly after the handle is dropped); the last error if it never opens.
pub(super) fn reopen(dir: &Path) -> Result<StateMachine, StoreError> {
    let mut last = None;
    for _ in 0..300 {
        match StateMachine::open(dir) {
            Ok(sm) => return Ok(sm),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(last.expect("tried"))
}

fn keys(sm: &StateMachine) -> Vec<(Vec<u8>, i64)> {
    let r = sm
        .shared
        .mvcc
        .range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .expect("range");
    r.kvs
        .into_iter()
        .map(|kv| (kv.key, kv.mod_revision))
        .collect()
}

/// An entry this build cannot apply (it does not decode, or needs a newer log format) stops
/// the apply before it: the entries before it in the batch are applied, it is not skipped, the
/// member says why, and a restart (on a build that can apply it) goes on from there.
#[tokio::test]
async fn an_entry_this_build_cannot_apply_stops_the_apply_before_it() {
    let newer = || {
        let req = InternalRequest {
            request: Some(internal_request::Request::Put(PutRequest {
                key: b"n".to_vec(),
                ..Default::default()
            })),
            log_format: super::LOG_FORMAT + 1,
            ..Default::default()
        };
        Command(Bytes::from(req.encode_to_vec()))
    };
    // What a member older than the cluster meets when it joins: the cluster's format, raised
    // past its own.
    let raised = || {
        let mut req = InternalRequest {
            request: Some(internal_request::Request::ClusterFormat(
                crate::proto::kvdpb::ClusterFormat {
                    format: super::LOG_FORMAT + 1,
                },
            )),
            ..Default::default()
        };
        crate::raft::log_format::mark(&mut req);
        Command(Bytes::from(req.encode_to_vec()))
    };
    let cases: Vec<(&str, Command)> = vec![
        ("a newer cluster format", raised()),
        ("garbage", Command(Bytes::from_static(b"\xff\xff\xff\xff"))),
        ("too deep", too_deep()),
        ("unknown kind", Command(Bytes::from_static(b"\x8a\x01\x00"))),
        ("newer format", newer()),
    ];
    for (what, bad) in cases {
        let dir = tempfile::tempdir().unwrap();
        let sm = StateMachine::open(dir.path()).unwrap();
        let mut stuck = sm.clone();
        let cmds = vec![put("a"), bad, put("b")];
        let entries: Vec<Result<EntryResponder<TypeConfig>, io::Error>> = cmds
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                Ok((
                    Entry::new_normal(log_id::<TypeConfig>(1, 1, 1 + i as u64), c),
                    None,
                ))
            })
            .collect();
        let applying = tokio::spawn(async move { stuck.apply(stream::iter(entries)).await });
        for _ in 0..200 {
            if sm.needs_upgrade().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let why = sm
            .needs_upgrade()
            .unwrap_or_else(|| panic!("{what}: apply did not stop"));
        assert!(why.contains("log entry 2"), "{what}: {why}");
        assert!(
            !applying.is_finished(),
            "{what}: a stopped apply waits for the member to stop"
        );
        assert_eq!(
            sm.last_applied().unwrap().map(|l| l.index),
            Some(1),
            "{what}"
        );
        assert_eq!(
            keys(&sm),
            vec![(b"a".to_vec(), 2)],
            "{what}: nothing past the stop"
        );
        sm.close();
        assert!(applying.await.unwrap().is_err(), "{what}");
        sm.shared.mvcc.flush().unwrap();
        drop(sm);

        // A newer build applies the entry (here: one that decodes) and goes on.
        let mut sm = reopen(dir.path()).expect("reopen");
        assert_eq!(
            sm.last_applied().unwrap().map(|l| l.index),
            Some(1),
            "{what}"
        );
        assert!(sm.needs_upgrade().is_none());
        apply(&mut sm, vec![put("x"), put("b")], 2).await;
        assert_eq!(
            keys(&sm),
            vec![(b"a".to_vec(), 2), (b"b".to_vec(), 4), (b"x".to_vec(), 3)],
            "{what}"
        );
    }
}

#[test]
fn decode_command_refuses_what_the_log_bound_refuses() {
    assert!(decode_command(&too_deep()).is_err());
    assert!(decode_command(&Command(Bytes::from_static(b"\xff"))).is_err());
    assert!(decode_command(&put("k")).is_ok());
}

/// Random well-formed requests of every kind the server proposes, kept only when they pass
/// the server's own checks (`mvcc::check_*`, the lease TTL bound, a chosen lease id), are
/// applied through the state machine in random batches: apply must never fail for them (a
/// failure stops the member, and every member, on every restart). Per-request errors (a
/// compacted revision, a missing lease) are answers, not failures, and are allowed.
mod fuzz {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::proto::etcdserverpb::compare::{CompareTarget, TargetUnion};
    use crate::proto::etcdserverpb::request_op::Request as Op;
    use crate::proto::etcdserverpb::{
        CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest,
        RequestOp, TxnRequest,
    };
    use internal_request::Request as R;

    fn key(rng: &mut StdRng) -> Vec<u8> {
        match rng.gen_range(0..10) {
            0 => vec![0],
            1 => vec![0xff; rng.gen_range(1..4)],
            _ => format!("k{}", rng.gen_range(0..12)).into_bytes(),
        }
    }

    fn range_end(rng: &mut StdRng) -> Vec<u8> {
        match rng.gen_range(0..4) {
            0 => Vec::new(),
            1 => vec![0],
            _ => key(rng),
        }
    }

    fn lease(rng: &mut StdRng) -> i64 {
        if rng.gen_bool(0.7) {
            0
        } else {
            rng.gen_range(-2..6)
        }
    }

    fn put(rng: &mut StdRng) -> PutRequest {
        PutRequest {
            key: key(rng),
            value: vec![b'v'; rng.gen_range(0..64)],
            lease: lease(rng),
            prev_kv: rng.gen(),
            ignore_value: rng.gen_bool(0.1),
            ignore_lease: rng.gen_bool(0.1),
        }
    }

    fn range(rng: &mut StdRng) -> RangeRequest {
        RangeRequest {
            key: key(rng),
            range_end: range_end(rng),
            limit: rng.gen_range(-1..4),
            revision: rng.gen_range(-1..40),
            sort_order: rng.gen_range(-1..4),
            sort_target: rng.gen_range(-1..6),
            serializable: rng.gen(),
            keys_only: rng.gen(),
            count_only: rng.gen(),
            min_mod_revision: rng.gen_range(-1..20),
            max_mod_revision: rng.gen_range(-1..20),
            min_create_revision: rng.gen_range(-1..20),
            max_create_revision: rng.gen_range(-1..20),
        }
    }

    fn delete(rng: &mut StdRng) -> DeleteRangeRequest {
        DeleteRangeRequest {
            key: key(rng),
            range_end: range_end(rng),
            prev_kv: rng.gen(),
        }
    }

    fn compare(rng: &mut StdRng) -> Compare {
        let target = rng.gen_range(-1..6);
        let n = rng.gen_range(-2..30);
        let target_union = match CompareTarget::try_from(target) {
            Ok(CompareTarget::Version) => Some(TargetUnion::Version(n)),
            Ok(CompareTarget::Create) => Some(TargetUnion::CreateRevision(n)),
            Ok(CompareTarget::Mod) => Some(TargetUnion::ModRevision(n)),
            Ok(CompareTarget::Value) => Some(TargetUnion::Value(vec![b'v'; n.max(0) as usize])),
            Ok(CompareTarget::Lease) => Some(TargetUnion::Lease(n)),
            Err(_) => None,
        };
        Compare {
            result: if rng.gen_bool(0.9) {
                rng.gen_range(0..4)
            } else {
                rng.gen_range(-1..8)
            },
            target,
            key: key(rng),
            range_end: range_end(rng),
            target_union: if rng.gen_bool(0.9) {
                target_union
            } else {
                None
            },
        }
    }

    fn txn(rng: &mut StdRng, depth: usize) -> TxnRequest {
        let ops = |rng: &mut StdRng| -> Vec<RequestOp> {
            (0..rng.gen_range(0..4))
                .map(|_| RequestOp {
                    request: match rng.gen_range(0..if depth < 3 { 5 } else { 4 }) {
                        0 => Some(Op::RequestRange(range(rng))),
                        1 => Some(Op::RequestPut(put(rng))),
                        2 => Some(Op::RequestDeleteRange(delete(rng))),
                        3 if rng.gen_bool(0.1) => None,
                        3 => Some(Op::RequestPut(put(rng))),
                        _ => Some(Op::RequestTxn(txn(rng, depth + 1))),
                    },
                })
                .collect()
        };
        TxnRequest {
            compare: (0..rng.gen_range(0..3)).map(|_| compare(rng)).collect(),
            success: ops(rng),
            failure: ops(rng),
        }
    }

    /// A request as the server would propose it, or `None` if the server refuses it first.
    fn request(rng: &mut StdRng, next_lease: &mut i64) -> Option<R> {
        let req = match rng.gen_range(0..12) {
            0..=3 => R::Put(put(rng)),
            4 | 5 => R::DeleteRange(delete(rng)),
            6..=8 => R::Txn(txn(rng, 0)),
            9 => R::Compaction(CompactionRequest {
                revision: rng.gen_range(-1..40),
                physical: rng.gen(),
            }),
            10 => {
                // The server picks an id when none is given and raises the TTL to its minimum.
                let id = match rng.gen_range(0..3) {
                    0 => rng.gen_range(1..6),
                    _ => {
                        *next_lease += 1;
                        *next_lease
                    }
                };
                R::LeaseGrant(LeaseGrantRequest {
                    ttl: rng.gen_range(-5..100).max(1),
                    id,
                })
            }
            _ => R::LeaseRevoke(LeaseRevokeRequest {
                id: rng.gen_range(-1..8),
            }),
        };
        let ok = match &req {
            R::Put(p) => crate::mvcc::check_put(p).is_ok(),
            R::DeleteRange(d) => crate::mvcc::check_delete_range(d).is_ok(),
            R::Txn(t) => crate::mvcc::check_txn(t, crate::mvcc::DEFAULT_MAX_TXN_OPS).is_ok(),
            _ => true,
        };
        ok.then_some(req)
    }

    async fn run(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachine::open(dir.path()).unwrap();
        let mut index = 1;
        let mut next_lease = 100;
        for _ in 0..40 {
            let batch: Vec<Command> = (0..rng.gen_range(1..8))
                .filter_map(|_| request(&mut rng, &mut next_lease))
                .map(|req| {
                    let ir = InternalRequest {
                        request: Some(req),
                        ..Default::default()
                    };
                    Command(Bytes::from(ir.encode_to_vec()))
                })
                .collect();
            let n = batch.len() as u64;
            apply(&mut sm, batch, index).await;
            index += n;
        }
        sm.shared.mvcc.flush().unwrap();
        let applied = sm.last_applied().unwrap();
        drop(sm);
        let sm = reopen(dir.path()).expect("reopen");
        assert_eq!(sm.last_applied().unwrap(), applied, "seed {seed}");
    }

    #[tokio::test]
    async fn accepted_requests_always_apply() {
        let base: u64 = std::env::var("KVD_APPLY_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let runs = std::env::var("KVD_APPLY_FUZZ_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20u64);
        eprintln!("apply fuzz: seed {base} (KVD_APPLY_FUZZ_SEED), {runs} runs");
        for seed in base..base + runs {
            run(seed).await;
        }
    }
}

//! Deterministic apply as a property: the same log gives the same state at every index,
//! however it is cut into batches, and across restarts and snapshot installs.
//!
//! A random log of client and server entries (puts with leases, revokes by users with and
//! without permission on the lease's keys, txns, deletes, auth changes, compactions, lease
//! expiry) is applied one entry at a time to a reference state machine, and to others in
//! random batches, restarted at random points, or given the reference's snapshot at random
//! points. After every batch each must show the reference's state at that index: data and
//! HashKV, leases and the keys they hold, and the auth state.
//!
//! `KVD_DETERMINISM_SEED` picks the first seed, `KVD_DETERMINISM_RUNS` the number of logs.

use std::path::Path;

use bytes::Bytes;
use openraft::storage::RaftStateMachine;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::proto::authpb::{permission::Type as PermType, Permission, UserAddOptions};
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::{
    AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use crate::proto::kvdpb::{auth_request::Request as A, AuthRequest, LeaseRevokeManyRequest};
use crate::raft::sm::snapshot_data::SnapshotData;
use crate::raft::sm::snapshot_file_install::SnapshotFile;
use crate::raft::sm::state_machine::apply_tests::{apply, reopen};
use internal_request::Request as R;

/// Users of the generated log: root, two users with write access to one prefix each (until
/// the log changes that), and one with no role.
const USERS: [&str; 4] = ["root", "alice", "bob", "carol"];
/// A token checked at a revision no change reaches in a generated log.
const FRESH: u64 = u64::MAX / 2;

struct Gen {
    rng: StdRng,
    leases: Vec<i64>,
    /// The prefix most keys of the current entry use: the one its user may write, mostly,
    /// so that most writes apply and the state grows.
    prefer: u8,
}

// The default keeps compiling as the entry message gains fields (log formats add them).
#[allow(clippy::needless_update)]
fn entry(req: R, user: &str, auth_revision: u64) -> InternalRequest {
    InternalRequest {
        request: Some(req),
        username: user.to_string(),
        auth_revision,
        ..Default::default()
    }
}

fn auth(a: A) -> R {
    R::Auth(AuthRequest { request: Some(a) })
}

fn role_perm(role: &str, prefix: u8) -> R {
    auth(A::RoleGrantPermission(AuthRoleGrantPermissionRequest {
        name: role.into(),
        perm: Some(Permission {
            perm_type: PermType::Readwrite as i32,
            key: vec![prefix],
            range_end: vec![prefix + 1],
        }),
    }))
}

/// Users, roles and permissions, auth still off.
fn prelude() -> Vec<InternalRequest> {
    let mut out = Vec::new();
    for u in USERS {
        out.push(auth(A::UserAdd(AuthUserAddRequest {
            name: u.into(),
            options: Some(UserAddOptions { no_password: true }),
            ..Default::default()
        })));
    }
    for (role, user) in [("root", "root"), ("ra", "alice"), ("rb", "bob")] {
        out.push(auth(A::RoleAdd(AuthRoleAddRequest { name: role.into() })));
        out.push(auth(A::UserGrantRole(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })));
    }
    out.push(role_perm("ra", b'a'));
    out.push(role_perm("rb", b'b'));
    out.push(auth(A::Enable(AuthEnableRequest {})));
    out.into_iter().map(|r| entry(r, "root", FRESH)).collect()
}

impl Gen {
    fn key(&mut self) -> Vec<u8> {
        let p = if self.rng.gen_bool(0.7) {
            self.prefer
        } else {
            [b'a', b'b'][self.rng.gen_range(0..2)]
        };
        vec![p, b'0' + self.rng.gen_range(0..4)]
    }

    fn user(&mut self) -> (&'static str, u64) {
        let u = USERS[self.rng.gen_range(0..USERS.len())];
        // Now and then a token checked before the latest auth change.
        let rev = if self.rng.gen_bool(0.1) { 1 } else { FRESH };
        (u, rev)
    }

    fn lease(&mut self) -> i64 {
        if self.leases.is_empty() || self.rng.gen_bool(0.2) {
            0
        } else {
            self.leases[self.rng.gen_range(0..self.leases.len())]
        }
    }

    fn put(&mut self) -> PutRequest {
        PutRequest {
            key: self.key(),
            value: vec![b'v'; self.rng.gen_range(0..8)],
            lease: self.lease(),
            prev_kv: self.rng.gen_bool(0.2),
            ..Default::default()
        }
    }

    fn txn(&mut self) -> TxnRequest {
        let key = self.key();
        let n = self.rng.gen_range(0..4);
        let ops = |g: &mut Gen| -> Vec<RequestOp> {
            (0..g.rng.gen_range(0..3))
                .map(|_| RequestOp {
                    request: Some(match g.rng.gen_range(0..3) {
                        0 => Op::RequestPut(g.put()),
                        1 => Op::RequestDeleteRange(DeleteRangeRequest {
                            key: g.key(),
                            ..Default::default()
                        }),
                        _ => Op::RequestRange(RangeRequest {
                            key: g.key(),
                            ..Default::default()
                        }),
                    }),
                })
                .collect()
        };
        let mut success = ops(self);
        let failure = ops(self);
        // No two writes of one key in a branch (the server refuses those before proposing).
        let mut seen = std::collections::HashSet::new();
        success.retain(|op| match &op.request {
            Some(Op::RequestPut(p)) => seen.insert(p.key.clone()),
            Some(Op::RequestDeleteRange(d)) => seen.insert(d.key.clone()),
            _ => true,
        });
        let mut seen = std::collections::HashSet::new();
        let failure = failure
            .into_iter()
            .filter(|op| match &op.request {
                Some(Op::RequestPut(p)) => seen.insert(p.key.clone()),
                Some(Op::RequestDeleteRange(d)) => seen.insert(d.key.clone()),
                _ => true,
            })
            .collect();
        TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key,
                target_union: Some(TargetUnion::Version(n)),
                ..Default::default()
            }],
            success,
            failure,
        }
    }

    fn next(&mut self, index: u64) -> InternalRequest {
        let (user, rev) = self.user();
        self.prefer = match user {
            "alice" => b'a',
            "bob" => b'b',
            _ => [b'a', b'b'][self.rng.gen_range(0..2)],
        };
        let r = match self.rng.gen_range(0..100) {
            0..=29 => R::Put(self.put()),
            30..=39 => {
                let id = 1000 + index as i64;
                self.leases.push(id);
                return entry(R::LeaseGrant(LeaseGrantRequest { id, ttl: 60 }), "", 0);
            }
            40..=56 => R::LeaseRevoke(LeaseRevokeRequest { id: self.lease() }),
            57..=61 => {
                // Expiry, proposed by the leader itself: no identity, no check.
                let ids = (0..self.rng.gen_range(1..3))
                    .map(|_| self.lease())
                    .collect();
                return entry(R::LeaseRevokeMany(LeaseRevokeManyRequest { ids }), "", 0);
            }
            62..=67 => R::DeleteRange(DeleteRangeRequest {
                key: self.key(),
                range_end: if self.rng.gen_bool(0.3) {
                    vec![b'c']
                } else {
                    Vec::new()
                },
                prev_kv: self.rng.gen_bool(0.2),
            }),
            68..=77 => R::Txn(self.txn()),
            78..=80 => {
                return entry(
                    R::Compaction(CompactionRequest {
                        revision: index as i64 / 2,
                        physical: false,
                    }),
                    "root",
                    FRESH,
                )
            }
            81..=86 => {
                let (role, p) = [("ra", b'a'), ("rb", b'b')][self.rng.gen_range(0..2)];
                let a = if self.rng.gen_bool(0.5) {
                    role_perm(role, p)
                } else {
                    auth(A::RoleRevokePermission(AuthRoleRevokePermissionRequest {
                        role: role.into(),
                        key: vec![p],
                        range_end: vec![p + 1],
                    }))
                };
                return entry(a, "root", FRESH);
            }
            87..=90 => {
                let (u, role) =
                    [("alice", "ra"), ("bob", "rb"), ("carol", "ra")][self.rng.gen_range(0..3)];
                let a = if self.rng.gen_bool(0.5) {
                    A::UserGrantRole(AuthUserGrantRoleRequest {
                        user: u.into(),
                        role: role.into(),
                    })
                } else {
                    A::UserRevokeRole(AuthUserRevokeRoleRequest {
                        role: role.into(),
                        name: u.into(),
                    })
                };
                return entry(auth(a), "root", FRESH);
            }
            91 | 92 => {
                let a = if self.rng.gen_bool(0.7) {
                    A::Enable(AuthEnableRequest {})
                } else {
                    A::Disable(AuthDisableRequest {})
                };
                return entry(auth(a), "root", FRESH);
            }
            _ => R::Put(PutRequest {
                key: self.key(),
                value: b"x".to_vec(),
                ..Default::default()
            }),
        };
        entry(r, user, rev)
    }
}

/// A random log of `n` entries after the prelude.
fn log(seed: u64, n: usize) -> Vec<Command> {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        leases: Vec::new(),
        prefer: b'a',
    };
    let mut out = prelude();
    while out.len() < n {
        let e = g.next(out.len() as u64 + 1);
        out.push(e);
    }
    out.into_iter()
        .map(|e| Command(Bytes::from(e.encode_to_vec())))
        .collect()
}

/// What every member must agree on after applying the same prefix of the log.
// Plain tuples: the digest is only ever compared whole, and printed when it differs.
#[allow(clippy::type_complexity)]
#[derive(Debug, PartialEq)]
struct Digest {
    applied: u64,
    revision: i64,
    compacted: i64,
    hash_kv: u32,
    kvs: Vec<(Vec<u8>, i64, i64, i64, i64, Vec<u8>)>,
    leases: Vec<(i64, Option<i64>, Vec<Vec<u8>>)>,
    auth: (
        bool,
        u64,
        Vec<(String, Vec<String>)>,
        Vec<(String, Vec<Permission>)>,
    ),
}

fn digest(sm: &StateMachine, lease_ids: &[i64]) -> Digest {
    let mvcc = &sm.shared.mvcc;
    let kvs = mvcc
        .range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| {
            (
                kv.key,
                kv.create_revision,
                kv.mod_revision,
                kv.version,
                kv.lease,
                kv.value,
            )
        })
        .collect();
    let auth = sm.auth();
    let users = auth
        .user_list()
        .into_iter()
        .map(|u| {
            let roles = auth.user_get(&u).expect("listed user");
            (u, roles)
        })
        .collect();
    let roles = auth
        .role_list()
        .into_iter()
        .map(|r| {
            let perms = auth.role_get(&r).expect("listed role");
            (r, perms)
        })
        .collect();
    Digest {
        applied: sm.last_applied().unwrap().map_or(0, |l| l.index),
        revision: mvcc.current_revision(),
        compacted: mvcc.compacted_revision(),
        hash_kv: mvcc.hash_kv(0).expect("hash").hash,
        kvs,
        leases: lease_ids
            .iter()
            .map(|&id| (id, mvcc.lease_ttl(id).unwrap(), mvcc.lease_keys(id)))
            .filter(|(_, ttl, keys)| ttl.is_some() || !keys.is_empty())
            .collect(),
        auth: (auth.is_enabled(), auth.revision(), users, roles),
    }
}

/// Every lease id the log can name (granted or not).
fn lease_ids(n: usize) -> Vec<i64> {
    (0..=n as i64).map(|i| 1000 + i).collect()
}

/// Writes the current snapshot of `sm` to a file in `dir`, as a leader sends it.
async fn save_snapshot(sm: &mut StateMachine, dir: &Path) -> (SnapshotMeta, std::path::PathBuf) {
    let snap = sm.get_current_snapshot().await.unwrap().unwrap();
    let SnapshotData::Live(live) = snap.snapshot else {
        panic!("a member's current snapshot is read from its engine");
    };
    std::fs::create_dir_all(dir).unwrap();
    let dir = dir.to_path_buf();
    let path = tokio::task::spawn_blocking(move || {
        live.write_file(&crate::wal::real_fs(), &dir)
            .unwrap()
            .publish()
    })
    .await
    .unwrap()
    .unwrap();
    (snap.meta, path)
}

/// How a follower's apply is disturbed.
#[derive(Clone, Copy, Debug)]
enum Variant {
    Batches,
    Restarts,
    Installs,
}

async fn run(seed: u64, n: usize) {
    let cmds = log(seed, n);
    let ids = lease_ids(n);
    let work = tempfile::tempdir().unwrap();

    // The reference, one entry per apply; its snapshots at a few random indexes.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let snap_at: Vec<u64> = {
        let mut v: Vec<u64> = (0..3).map(|_| rng.gen_range(5..n as u64)).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut snaps = Vec::new();
    let mut want = vec![Some(digest(
        &StateMachine::open(&work.path().join("empty")).unwrap(),
        &ids,
    ))];
    {
        let mut sm = StateMachine::open(&work.path().join("ref")).unwrap();
        for (i, c) in cmds.iter().enumerate() {
            let index = i as u64 + 1;
            apply(&mut sm, vec![c.clone()], index).await;
            want.push(Some(digest(&sm, &ids)));
            if snap_at.contains(&index) {
                let dir = work.path().join(format!("snap-{index}"));
                snaps.push((index, save_snapshot(&mut sm, &dir).await));
            }
        }
    }

    for variant in [Variant::Batches, Variant::Restarts, Variant::Installs] {
        let dir = work.path().join(format!("{variant:?}"));
        let mut sm = StateMachine::open(&dir).unwrap();
        let mut next = 1u64;
        let mut pending_snaps = snaps.iter();
        while next <= n as u64 {
            let ctx = format!("seed {seed}, {variant:?}");
            match variant {
                Variant::Restarts if rng.gen_bool(0.2) => {
                    drop(sm);
                    sm = reopen(&dir).expect("reopen");
                    next = sm.last_applied().unwrap().map_or(0, |l| l.index) + 1;
                    let got = digest(&sm, &ids);
                    assert_eq!(
                        Some(&got),
                        want[(next - 1) as usize].as_ref(),
                        "{ctx}: restart"
                    );
                }
                Variant::Installs if rng.gen_bool(0.3) => {
                    if let Some((at, (meta, path))) = pending_snaps.next() {
                        if *at >= next {
                            let file = SnapshotData::File(SnapshotFile::open(path).unwrap().1);
                            sm.install_snapshot(meta, file).await.unwrap();
                            next = at + 1;
                            let got = digest(&sm, &ids);
                            assert_eq!(Some(&got), want[*at as usize].as_ref(), "{ctx}: install");
                        }
                    }
                }
                _ => {}
            }
            let len = rng.gen_range(1..10).min(n as u64 + 1 - next);
            let batch = cmds[(next - 1) as usize..(next - 1 + len) as usize].to_vec();
            apply(&mut sm, batch, next).await;
            next += len;
            let got = digest(&sm, &ids);
            assert_eq!(
                Some(&got),
                want[(next - 1) as usize].as_ref(),
                "{ctx}: after a batch ending at {}",
                next - 1
            );
        }
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

async fn runs(default_runs: u64, len: usize) {
    let base = env("KVD_DETERMINISM_SEED").unwrap_or_else(rand::random);
    let runs = env("KVD_DETERMINISM_RUNS").unwrap_or(default_runs);
    eprintln!("determinism: seed {base} (KVD_DETERMINISM_SEED), {runs} runs of {len} entries");
    for seed in base..base + runs {
        run(seed, len).await;
    }
}

#[tokio::test]
async fn the_same_log_gives_the_same_state_however_it_is_applied() {
    runs(6, 120).await;
}

/// The long form, run by CI.
#[tokio::test]
#[ignore]
async fn the_same_log_gives_the_same_state_however_it_is_applied_long() {
    runs(60, 300).await;
}

/// The divergence this property is about, pinned: a put under a lease and a revoke of that
/// lease by a user who may not write the key, in one batch, are refused as they are one by one.
#[tokio::test]
async fn a_revoke_is_checked_against_the_keys_put_earlier_in_its_batch() {
    let mut cmds: Vec<Command> = prelude()
        .into_iter()
        .map(|e| Command(Bytes::from(e.encode_to_vec())))
        .collect();
    let tail = [
        entry(R::LeaseGrant(LeaseGrantRequest { id: 7, ttl: 60 }), "", 0),
        entry(
            R::Put(PutRequest {
                key: b"a1".to_vec(),
                value: b"v".to_vec(),
                lease: 7,
                ..Default::default()
            }),
            "alice",
            FRESH,
        ),
        entry(R::LeaseRevoke(LeaseRevokeRequest { id: 7 }), "bob", FRESH),
    ];
    cmds.extend(tail.iter().map(|e| Command(Bytes::from(e.encode_to_vec()))));
    let ids = [7];
    let mut states = Vec::new();
    for split in [1, cmds.len()] {
        let d = tempfile::tempdir().unwrap();
        let mut sm = StateMachine::open(d.path()).unwrap();
        for (i, chunk) in cmds.chunks(split).enumerate() {
            apply(&mut sm, chunk.to_vec(), (i * split) as u64 + 1).await;
        }
        let got = digest(&sm, &ids);
        assert_eq!(got.kvs.len(), 1, "bob may not delete a1: {got:?}");
        states.push(got);
    }
    assert_eq!(states[0], states[1]);
}

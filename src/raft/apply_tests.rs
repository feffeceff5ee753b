//! Applying entries that do not decode: a no-op on every member, never a storage error.

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
    };
    Command(Bytes::from(req.encode_to_vec()))
}

/// A command nested far beyond what any member decodes: 100,000 levels of groups.
fn too_deep() -> Command {
    Command(Bytes::from(vec![0x0b_u8; 100_000]))
}

async fn apply(sm: &mut StateMachine, cmds: Vec<Command>, first: u64) {
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

#[tokio::test]
async fn undecodable_entries_are_applied_as_no_ops_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachine::open(dir.path()).unwrap();
    let garbage = Command(Bytes::from_static(b"\xff\xff\xff\xff"));
    apply(
        &mut sm,
        vec![
            put("a"),
            garbage,
            too_deep(),
            put("b"),
            Command(Bytes::new()),
        ],
        1,
    )
    .await;
    assert_eq!(sm.last_applied().unwrap().map(|l| l.index), Some(5));
    // The two bad entries took no revision: "a" at 2, "b" at 3.
    assert_eq!(keys(&sm), vec![(b"a".to_vec(), 2), (b"b".to_vec(), 3)]);
    apply(&mut sm, vec![put("c")], 6).await;
    sm.shared.mvcc.flush().unwrap();
    drop(sm);

    let sm = StateMachine::open(dir.path()).unwrap();
    assert_eq!(sm.last_applied().unwrap().map(|l| l.index), Some(6));
    assert_eq!(
        keys(&sm),
        vec![(b"a".to_vec(), 2), (b"b".to_vec(), 3), (b"c".to_vec(), 4)]
    );
}

#[test]
fn decode_command_refuses_what_the_log_bound_refuses() {
    assert!(decode_command(&too_deep()).is_err());
    assert!(decode_command(&Command(Bytes::from_static(b"\xff"))).is_err());
    assert!(decode_command(&put("k")).is_ok());
}

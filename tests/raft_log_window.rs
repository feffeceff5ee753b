//! A member that keeps (almost) none of its Raft log in memory
//! (`--experimental-raft-log-cache-bytes=0`) reads entries back from its WAL: a follower that
//! was down catches up from the leader's WAL, and a whole-cluster crash replays them.

mod common;

use std::time::{Duration, Instant};

use common::{put, Cluster};
use kvd::proto::etcdserverpb::RangeRequest;

async fn wait_for_key(c: &Cluster, i: usize, key: &str, want: &str) {
    let t = Instant::now();
    let mut kv = c.kv(i).await;
    loop {
        let r = kv
            .range(RangeRequest {
                key: key.as_bytes().to_vec(),
                serializable: true,
                ..Default::default()
            })
            .await;
        if r.is_ok_and(|r| {
            r.into_inner()
                .kvs
                .first()
                .is_some_and(|kv| kv.value == want.as_bytes())
        }) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "member {i} never saw {key}\n{}",
            c.log_of(i)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_outside_the_memory_window_replicate_and_replay() {
    let mut c = Cluster::start_custom(3, false, |_| {
        vec!["--experimental-raft-log-cache-bytes=0".to_string()]
    })
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (leader + 1) % 3;
    let mut kv = c.kv(leader).await;
    put(&mut kv, "before", "1").await.unwrap();

    // The follower misses 300 writes of 1 KiB: it catches up from entries the leader holds
    // only in its WAL (no snapshot: far below --snapshot-count).
    c.kill(f);
    let value = "v".repeat(1024);
    for i in 0..300 {
        put(&mut kv, &format!("k{i:03}"), &value).await.unwrap();
    }
    put(&mut kv, "last", "1").await.unwrap();
    c.spawn(f);
    wait_for_key(&c, f, "last", "1").await;
    wait_for_key(&c, f, "k000", &value).await;

    // A whole-cluster crash: every member replays its WAL into a window of one entry.
    c.kill_all_and_restart();
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let mut kv = c.kv(leader).await;
    put(&mut kv, "after", "2").await.unwrap();
    for i in 0..3 {
        wait_for_key(&c, i, "after", "2").await;
        wait_for_key(&c, i, "k299", &value).await;
    }
}

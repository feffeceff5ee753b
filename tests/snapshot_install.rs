//! A follower killed (kill -9) again and again while it installs a snapshot from the leader
//! ends up with exactly the keys, revisions and leases of the other members.
//!
//! Each round the follower is down while the leader takes enough writes (some under leases,
//! one lease revoked every other round) to snapshot and purge its log past the follower, so
//! the follower can only catch up by installing a snapshot. The follower is restarted and
//! killed as soon as a new engine generation appears in its state-machine directory (a
//! received snapshot is written into one as it arrives, then switched to), after a delay that
//! varies by round: before, during or after the switch. Rounds: `KVD_SNAP_KILL_ROUNDS`
//! (default 5, about 20 s).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::Cluster;
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::{
    HashKvRequest, LeaseGrantRequest, LeaseLeasesRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest,
};

/// What a member serves: revision, every key as (key, value, create, mod, version, lease),
/// and the lease ids.
type State = (i64, Vec<(String, String, i64, i64, i64, i64)>, Vec<i64>);

async fn state(c: &Cluster, i: usize) -> Result<State, tonic::Status> {
    let r = c
        .kv(i)
        .await
        .range(RangeRequest {
            key: vec![0],
            range_end: vec![0],
            serializable: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let kvs = r
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.create_revision,
                kv.mod_revision,
                kv.version,
                kv.lease,
            )
        })
        .collect();
    let mut leases: Vec<i64> = LeaseClient::new(common::channel(&c.members[i].client_url()).await)
        .lease_leases(LeaseLeasesRequest {})
        .await?
        .into_inner()
        .leases
        .into_iter()
        .map(|l| l.id)
        .collect();
    leases.sort();
    Ok((r.header.map_or(0, |h| h.revision), kvs, leases))
}

/// The newest engine generation in member `i`'s state-machine directory (`db` is 0, `db.N`
/// is N; -1 if none).
fn newest_generation(c: &Cluster, i: usize) -> i64 {
    std::fs::read_dir(c.members[i].data_dir.join("member/sm"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|n| match n.as_str() {
                    "db" => Some(0),
                    _ => n.strip_prefix("db.")?.parse().ok(),
                })
                .max()
                .unwrap_or(-1)
        })
        .unwrap_or(-1)
}

/// The generation member `i`'s pointer names (`db` when it has none).
fn current_generation(c: &Cluster, i: usize) -> String {
    std::fs::read_to_string(c.members[i].data_dir.join("member/sm/db.current"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "db".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_killed_during_snapshot_installs_ends_with_every_key_and_lease() {
    let rounds: usize = std::env::var("KVD_SNAP_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut c = Cluster::start_opts(
        3,
        false,
        &[
            "--snapshot-count=50",
            "--experimental-snapshot-catchup-entries=20",
        ],
    )
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = (0..3).find(|&i| i != leader).unwrap();
    let mut kv = c.kv(leader).await;
    let mut lease = LeaseClient::new(common::channel(&c.members[leader].client_url()).await);
    let value = "x".repeat(512);
    let mut want_keys = BTreeMap::new();
    let mut want_leases = BTreeSet::new();
    let (mut seen, mut before_switch) = (0, 0);
    for round in 0..rounds {
        c.kill(f);
        let id = round as i64 + 1;
        lease
            .lease_grant(LeaseGrantRequest { id, ttl: 3600 })
            .await
            .unwrap();
        want_leases.insert(id);
        for k in 0..150 {
            let key = format!("r{round}/k{k:03}");
            let on = if k % 5 == 0 { id } else { 0 };
            kv.put(PutRequest {
                key: key.clone().into(),
                value: value.clone().into(),
                lease: on,
                ..Default::default()
            })
            .await
            .unwrap();
            want_keys.insert(key, on);
        }
        if round % 2 == 1 {
            lease.lease_revoke(LeaseRevokeRequest { id }).await.unwrap();
            want_leases.remove(&id);
            want_keys.retain(|_, l| *l != id);
        }
        // Not the newest directory: one staged and not switched to is removed at the start.
        let before = current_generation(&c, f)
            .strip_prefix("db.")
            .map_or(0, |n| n.parse().unwrap());
        c.spawn(f);
        let deadline = Instant::now() + Duration::from_secs(15);
        while newest_generation(&c, f) <= before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let staged = newest_generation(&c, f);
        if staged > before {
            seen += 1;
        }
        tokio::time::sleep(Duration::from_millis([0, 3, 10, 30, 60][round % 5])).await;
        c.kill(f);
        if staged > before && current_generation(&c, f) != format!("db.{staged}") {
            before_switch += 1;
        }
    }
    eprintln!(
        "{rounds} rounds: a snapshot was being received in {seen}, the kill came before its \
         switch in {before_switch}"
    );
    assert!(seen > 0, "the follower never received a snapshot");
    c.spawn(f);

    let deadline = Instant::now() + Duration::from_secs(30);
    let want = state(&c, leader).await.unwrap();
    let keys: BTreeMap<String, i64> = want.1.iter().map(|k| (k.0.clone(), k.5)).collect();
    assert_eq!(keys, want_keys, "the leader's keys");
    assert_eq!(want.2, want_leases.into_iter().collect::<Vec<_>>());
    for i in 0..3 {
        loop {
            let got = state(&c, i).await;
            match got {
                Ok(got) if got == want => break,
                got if Instant::now() > deadline => {
                    let got = got.map(|g| (g.0, g.1.len(), g.2));
                    panic!(
                        "member {i} (follower {f}): {got:?}, leader: {:?}\n{}",
                        (want.0, want.1.len(), &want.2),
                        c.log_of(i)
                    );
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    // The same history too: etcd's HashKV at that revision is equal on every member, the ones
    // that installed snapshots included.
    let mut hashes = Vec::new();
    for i in 0..3 {
        let h = c
            .maintenance(i)
            .await
            .hash_kv(HashKvRequest { revision: want.0 })
            .await
            .unwrap()
            .into_inner();
        hashes.push((h.hash, h.compact_revision));
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "HashKV: {hashes:?}"
    );
    // The sends and installs are counted, under etcd's metric names, per peer.
    let counted = |body: &str, name: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let leader_metrics = common::http_get(c.members[leader].client_port, "/metrics")
        .await
        .1;
    let sent = counted(&leader_metrics, "etcd_network_snapshot_send_success");
    let failed = counted(&leader_metrics, "etcd_network_snapshot_send_failures");
    eprintln!("snapshot sends counted by the leader: {sent} whole, {failed} failed");
    // Each whole send is timed too (etcd's send duration histogram).
    let timed = counted(
        &leader_metrics,
        "etcd_network_snapshot_send_total_duration_seconds_count",
    );
    assert_eq!(timed, sent, "whole sends timed:\n{leader_metrics}");
    // Every install the follower began was a send; most were cut by the kill.
    assert!(
        sent + failed >= seen as f64,
        "{sent} + {failed} sends counted, {seen} installs seen"
    );
}

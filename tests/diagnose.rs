//! `kvctl endpoint diagnose` on real clusters losing members: the verdict (healthy, degraded
//! with the tolerance left, quorum lost with the member to rebuild from) and its exit code.

mod common;

use common::Cluster;

fn diagnose(c: &Cluster) -> (i32, String) {
    let eps: Vec<String> = c.members.iter().map(|m| m.client_url()).collect();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"))
        .args(["--endpoints", &eps.join(","), "--dial-timeout", "1s"])
        .args(["--command-timeout", "2s", "endpoint", "diagnose"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_healthy_then_degraded_then_quorum_lost() {
    let mut c = Cluster::start(3).await;
    let (rc, out) = diagnose(&c);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("HEALTHY"), "{out}");

    let leader = c.leader().await.unwrap();
    let other = (0..3).find(|i| *i != leader).unwrap();
    c.kill(other);
    let (rc, out) = diagnose(&c);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("DEGRADED") && out.contains("One more voter lost costs quorum"),
        "{out}"
    );
    assert!(
        out.contains(&format!("down: {}", c.members[other].name)),
        "{out}"
    );

    let third = (0..3).find(|i| *i != leader && *i != other).unwrap();
    c.kill(third);
    let (rc, out) = diagnose(&c);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("QUORUM LOST: 1 of 3 voters answer"), "{out}");
    assert!(out.contains("until 1 of the missing voters"), "{out}");
    assert!(
        out.contains(&format!("rebuild from {}", c.members[leader].name)),
        "{out}"
    );
    assert!(
        out.contains("--force-new-cluster") && out.contains("member add"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_tolerate_two_losses_and_need_one_back_after_three() {
    let mut c = Cluster::start(5).await;
    c.kill(3);
    let (_, out) = diagnose(&c);
    assert!(out.contains("survives 1 more voter loss"), "{out}");
    c.kill(4);
    let (_, out) = diagnose(&c);
    assert!(out.contains("One more voter lost costs quorum"), "{out}");
    c.kill(2);
    let (rc, out) = diagnose(&c);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("QUORUM LOST: 2 of 5 voters answer, 3 are needed"),
        "{out}"
    );
    assert!(out.contains("until 1 of the missing voters"), "{out}");
}

/// Runs diagnose until its report contains `want` (the members' views of each other change
/// within a few probe rounds), or panics with the last report.
async fn diagnose_until(c: &Cluster, want: &str) -> (i32, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (rc, out) = diagnose(c);
        if out.contains(want) {
            return (rc, out);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {want:?} in:\n{out}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// A voter cut off from the others by a partition still answers the tool; it is named as cut
/// off and counted as lost (one more loss costs quorum), whether it was a follower or the
/// leader, and the cluster is healthy again once the partition heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_voter_answers_but_counts_as_lost() {
    let pc = common::faults::ProxiedCluster::start(3, &[]).await;
    let leader = pc.c.leader().await.unwrap();
    let follower = (0..3).find(|i| *i != leader).unwrap();
    pc.isolate(follower);
    let cut = format!("{} is cut off from the leader", pc.c.members[follower].name);
    let (rc, out) = diagnose_until(&pc.c, &cut).await;
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("DEGRADED"), "{out}");
    assert!(out.contains("One more voter lost costs quorum"), "{out}");
    assert!(!out.contains("down:"), "nobody is down: {out}");

    pc.heal();
    let (rc, out) = diagnose_until(&pc.c, "HEALTHY").await;
    assert_eq!(rc, 0, "{out}");

    // The leader cut off: the two others elect one of them, and the old leader is named.
    pc.isolate(leader);
    let cut = format!("{} is cut off from the leader", pc.c.members[leader].name);
    let (rc, out) = diagnose_until(&pc.c, &cut).await;
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("One more voter lost costs quorum"), "{out}");
    pc.heal();
}

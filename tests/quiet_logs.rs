//! What members log in ordinary operation and on a graceful stop, with kvd's default log
//! filter: TLS client load (mutual TLS for peers and clients, connections opened and closed),
//! then SIGTERM to the leader, then to the two others at once. No ERROR line at all (a graceful
//! stop is not a failure), and at most one warning per peer that went away.

mod common;

use std::time::{Duration, Instant};

use common::{get, put, Cluster};

/// The lines of `log` at `level` (kvd's text format: timestamp, level, target, message).
fn lines_at<'a>(log: &'a str, level: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_load_and_a_graceful_stop_log_no_error_and_a_warning_per_departed_peer() {
    let mut c = Cluster::start_tls(3, true, |_| Vec::new()).await;

    let mut writers = Vec::new();
    for t in 0..4 {
        let mut kv = c.kv(t % 3).await;
        writers.push(tokio::spawn(async move {
            for n in 0..150 {
                put(&mut kv, &format!("k{t}-{n}"), "v").await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    // Short-lived TLS connections, as scripts and health checks open them.
    for n in 0..30 {
        let mut kv = c.kv(n % 3).await;
        assert_eq!(get(&mut kv, "k0-0").await.unwrap().as_deref(), Some("v"));
    }

    let leader = c.leader().await.expect("a leader");
    let t = Instant::now();
    assert!(c.stop(leader).success(), "{}", c.log_of(leader));
    let leader_stop = t.elapsed();
    // The survivors elect a leader, and then stop together.
    c.wait_for_leader(Duration::from_secs(20)).await;
    let rest: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let t = Instant::now();
    for &i in &rest {
        c.signal(i, libc::SIGTERM);
    }
    for &i in &rest {
        assert!(c.stop(i).success(), "{}", c.log_of(i));
    }
    let rest_stop = t.elapsed();
    println!("leader stopped in {leader_stop:?}, the other two together in {rest_stop:?}");

    let mut failures = Vec::new();
    for i in 0..3 {
        let log = c.log_of(i);
        let errors = lines_at(&log, "ERROR");
        let warnings = lines_at(&log, "WARN");
        if !errors.is_empty() {
            failures.push(format!("m{i} logged errors:\n{}", errors.join("\n")));
        }
        // At most one per peer that stopped while this member ran: two.
        if warnings.len() > 2 {
            failures.push(format!(
                "m{i} logged {} warnings:\n{}",
                warnings.len(),
                warnings.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

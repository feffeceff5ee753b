//! Thousands of idle or half-open client connections: the member keeps
//! serving other clients promptly and its memory stays bounded, while they are open and after
//! they go away.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{get, put, Cluster};

/// Resident set of a process, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_open_connections_do_not_stop_a_member() {
    let c = Cluster::start(1).await;
    let url = c.members[0].client_url();
    let addr = url.trim_start_matches("http://").to_string();
    let pid = c.members[0].pid();
    let mut kv = c.kv(0).await;
    put(&mut kv, "before", "1").await.unwrap();
    let rss_before = rss_kib(pid);

    // 1,500 connections that never send a byte, 1,000 that send HTTP/2's preface and stop,
    // 500 that send half an HTTP/1.1 request (the gateway's side of the port).
    let mut conns = Vec::new();
    for i in 0..3_000 {
        let mut s = TcpStream::connect(&addr).expect("connect");
        if i % 3 == 1 && i < 2_000 {
            let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        } else if i % 6 == 5 {
            let _ = s.write_all(
                b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
            );
        }
        conns.push(s);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Other clients are served at once, writes and reads.
    for i in 0..20 {
        let t = Instant::now();
        let k = format!("during/{i}");
        put(&mut kv, &k, "v").await.unwrap();
        assert_eq!(get(&mut kv, &k).await.unwrap().as_deref(), Some("v"));
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "put+get took {:?} with 3,000 idle connections",
            t.elapsed()
        );
    }
    let rss_during = rss_kib(pid);
    // About 20 KiB of buffers per connection is generous (etcd: a goroutine and buffers).
    assert!(
        rss_during < rss_before + 3_000 * 20 + 64 * 1024,
        "RSS {rss_before} KiB -> {rss_during} KiB with 3,000 idle connections"
    );

    drop(conns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut fresh = c.kv(0).await;
    put(&mut fresh, "after", "1").await.unwrap();
    assert_eq!(
        get(&mut fresh, "before").await.unwrap().as_deref(),
        Some("1")
    );
    eprintln!(
        "connections: RSS {rss_before} KiB before, {rss_during} KiB with 3,000 idle connections, \
         {} KiB after they closed",
        rss_kib(pid)
    );
}

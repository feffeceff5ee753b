//! The health endpoints on real members, judged against etcd's semantics: `/livez` and
//! `/readyz` as etcd 3.5.11+ answers them (kubeadm's probes), `/health` as etcd 3.4 answers it
//! (with 3.5's `?serializable=true`), on the client port and on `--listen-metrics-urls`.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, Cluster};
use kvd::proto::etcdserverpb::alarm_request::AlarmAction;
use kvd::proto::etcdserverpb::{AlarmRequest, AlarmType};

/// A reply: status code, the headers (lower-cased names) and the body.
struct Reply {
    code: u16,
    head: String,
    body: String,
}

/// One plain HTTP/1.0 request (no client crate: the exact bytes matter here).
async fn http(method: &str, port: u16, path: &str) -> Reply {
    let (code, head, body) = common::http_request(method, "127.0.0.1", port, path).await;
    Reply {
        code,
        head: head.to_lowercase(),
        body,
    }
}

async fn get(port: u16, path: &str) -> (u16, String) {
    let r = http("GET", port, path).await;
    (r.code, r.body)
}

/// Polls `path` until it answers `code`, or panics after `within`.
async fn wait_for(port: u16, path: &str, code: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (c, body) = get(port, path).await;
        if c == code {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} still answers {c}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn set_alarm(c: &Cluster, action: AlarmAction, kind: AlarmType) {
    let member_id = c.status(0).await.header.unwrap().member_id;
    c.maintenance(0)
        .await
        .alarm(AlarmRequest {
            action: action as i32,
            member_id,
            alarm: kind as i32,
        })
        .await
        .unwrap();
}

const READY_VERBOSE: &str = "[+]data_corruption ok\n[+]serializable_read ok\n\
                             [+]linearizable_read ok\n[+]non_learner ok\nok\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_as_etcd_and_readyz_fails_without_quorum_while_livez_holds() {
    let metrics: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut c = Cluster::start_custom(3, false, |i| {
        vec![format!(
            "--listen-metrics-urls=http://127.0.0.1:{}",
            metrics[i]
        )]
    })
    .await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let s = (leader + 1) % 3;
    let client = c.members[s].client_port;

    for port in [client, metrics[s]] {
        assert_eq!(get(port, "/livez").await, (200, "ok\n".into()));
        assert_eq!(get(port, "/readyz").await, (200, "ok\n".into()));
        assert_eq!(
            get(port, "/livez?verbose").await,
            (200, "[+]serializable_read ok\nok\n".into())
        );
        assert_eq!(
            get(port, "/readyz?verbose").await,
            (200, READY_VERBOSE.into())
        );
        // `verbose` needs no value; excluded checks are left out, unknown ones ignored.
        assert_eq!(
            get(
                port,
                "/readyz?verbose=1&exclude=non_learner&exclude=data_corruption&exclude=nope"
            )
            .await,
            (
                200,
                "[+]serializable_read ok\n[+]linearizable_read ok\nok\n".into()
            )
        );
        assert_eq!(
            get(port, "/readyz/linearizable_read?verbose").await,
            (200, "[+]linearizable_read ok\nok\n".into())
        );
        assert_eq!(get(port, "/livez/serializable_read").await.0, 200);
        // A check of the other registry is not served there.
        assert_eq!(
            get(port, "/livez/linearizable_read").await,
            (404, "404 page not found\n".into())
        );
        assert_eq!(
            get(port, "/health").await,
            (200, r#"{"health":"true"}"#.into())
        );

        let r = http("POST", port, "/readyz").await;
        assert_eq!((r.code, r.body.as_str()), (405, "Method Not Allowed\n"));
        assert!(r.head.contains("\r\nallow: get"), "{}", r.head);
        let r = http("GET", port, "/livez").await;
        assert!(
            r.head.contains("content-type: text/plain; charset=utf-8")
                && r.head.contains("x-content-type-options: nosniff"),
            "{}",
            r.head
        );
    }

    // Without a quorum: the survivor is alive (it serves local reads) but not ready.
    for i in 0..3 {
        if i != s {
            c.kill(i);
        }
    }
    let body = wait_for(client, "/readyz", 503, Duration::from_secs(30)).await;
    assert!(
        body.starts_with("[+]data_corruption ok\n[+]serializable_read ok\n[-]linearizable_read failed: etcdserver: "),
        "{body}"
    );
    assert!(body.ends_with("\n[+]non_learner ok\n\n"), "{body}");
    assert_eq!(get(client, "/livez").await, (200, "ok\n".into()));
    assert_eq!(get(metrics[s], "/livez").await, (200, "ok\n".into()));
    assert_eq!(
        get(client, "/readyz?exclude=linearizable_read").await,
        (200, "ok\n".into())
    );
    assert_eq!(get(metrics[s], "/readyz/linearizable_read").await.0, 503);
    assert_eq!(
        wait_for(client, "/health", 503, Duration::from_secs(10)).await,
        "{\"health\":\"false\"}\n"
    );
    assert_eq!(get(metrics[s], "/health").await.0, 503);
    // etcd 3.5's serializable health asks this process, not the cluster.
    assert_eq!(
        get(client, "/health?serializable=true").await,
        (200, r#"{"health":"true"}"#.into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_fail_health_unless_excluded_and_corrupt_fails_readyz() {
    let c = Cluster::start(1).await;
    let port = c.members[0].client_port;
    assert_eq!(get(port, "/health").await.0, 200);

    // NOSPACE: /health fails unless told to ignore it; readiness is not about space.
    set_alarm(&c, AlarmAction::Activate, AlarmType::Nospace).await;
    assert_eq!(
        get(port, "/health").await,
        (503, "{\"health\":\"false\"}\n".into())
    );
    assert_eq!(
        get(port, "/health?exclude=NOSPACE").await,
        (200, r#"{"health":"true"}"#.into())
    );
    assert_eq!(get(port, "/health?exclude=CORRUPT").await.0, 503);
    assert_eq!(get(port, "/readyz").await, (200, "ok\n".into()));
    set_alarm(&c, AlarmAction::Deactivate, AlarmType::Nospace).await;

    // CORRUPT: not ready, with the alarm named; still alive.
    set_alarm(&c, AlarmAction::Activate, AlarmType::Corrupt).await;
    let (code, body) = get(port, "/readyz").await;
    assert_eq!(code, 503);
    assert!(
        body.starts_with("[-]data_corruption failed: alarm activated: CORRUPT\n"),
        "{body}"
    );
    assert_eq!(
        get(port, "/readyz/data_corruption").await,
        (
            503,
            "[-]data_corruption failed: alarm activated: CORRUPT\n\n".into()
        )
    );
    assert_eq!(get(port, "/readyz?exclude=data_corruption").await.0, 200);
    assert_eq!(get(port, "/livez").await, (200, "ok\n".into()));
    assert_eq!(get(port, "/health").await.0, 503);
    assert_eq!(get(port, "/health?exclude=CORRUPT").await.0, 200);

    set_alarm(&c, AlarmAction::Deactivate, AlarmType::Corrupt).await;
    assert_eq!(
        get(port, "/readyz?verbose").await,
        (200, READY_VERBOSE.into())
    );
}

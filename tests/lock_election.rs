//! etcd's Lock and Election services against real `kvd` processes: a lock passes to the next
//! waiter on unlock, on lease revocation and after its holder's member dies; an election
//! hands over on resign and refuses a stale leader; errors carry etcd's code (`Unknown`) and
//! text; the JSON gateway serves both services. Also Maintenance.Downgrade and MoveLeader to
//! the current leader, as etcd 3.5 answers them.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use kvd::proto::etcdserverpb::downgrade_request::DowngradeAction;
use kvd::proto::etcdserverpb::lease_client::LeaseClient;
use kvd::proto::etcdserverpb::{
    DowngradeRequest, LeaseGrantRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
    MoveLeaderRequest, RangeRequest,
};
use kvd::proto::v3electionpb::election_client::ElectionClient;
use kvd::proto::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest, ResignRequest,
};
use kvd::proto::v3lockpb::lock_client::LockClient;
use kvd::proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest};
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;

async fn locks(c: &Cluster, i: usize) -> LockClient<Channel> {
    LockClient::new(common::channel(&c.members[i].client_url()).await)
}

/// A Lock call on member `i` in its own task (it blocks while another session holds `name`).
async fn spawn_lock(
    c: &Cluster,
    i: usize,
    name: &[u8],
    lease: i64,
) -> tokio::task::JoinHandle<Result<tonic::Response<LockResponse>, tonic::Status>> {
    let mut l = locks(c, i).await;
    let name = name.to_vec();
    tokio::spawn(async move { l.lock(LockRequest { name, lease }).await })
}

async fn elections(c: &Cluster, i: usize) -> ElectionClient<Channel> {
    ElectionClient::new(common::channel(&c.members[i].client_url()).await)
}

async fn grant(c: &Cluster, i: usize, ttl: i64) -> i64 {
    LeaseClient::new(common::channel(&c.members[i].client_url()).await)
        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id
}

/// Asserts that `f` is still pending after `wait`, and hands it back.
async fn still_waiting<T>(
    mut f: tokio::task::JoinHandle<T>,
    wait: Duration,
) -> tokio::task::JoinHandle<T> {
    assert!(
        tokio::time::timeout(wait, &mut f).await.is_err(),
        "finished while it should wait"
    );
    f
}

async fn within<T>(d: Duration, f: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(d, f)
        .await
        .expect("finished in time")
        .unwrap()
}

async fn keys_under(c: &Cluster, prefix: &str) -> Vec<String> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    c.kv(0)
        .await
        .range(RangeRequest {
            key: prefix.into(),
            range_end: end,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .kvs
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn second_locker_gets_the_lock_only_after_unlock() {
    let c = Cluster::start(1).await;
    let (l1, l2) = (grant(&c, 0, 30).await, grant(&c, 0, 30).await);
    let mut a = locks(&c, 0).await;
    let held = a
        .lock(LockRequest {
            name: b"job".to_vec(),
            lease: l1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.key, format!("job/{l1:x}").into_bytes());

    let waiter = spawn_lock(&c, 0, b"job", l2).await;
    let waiter = still_waiting(waiter, Duration::from_millis(800)).await;
    // Locking again on the same lease is the same session: it holds at once.
    let again = a
        .lock(LockRequest {
            name: b"job".to_vec(),
            lease: l1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.key, held.key);

    let unlocked = a
        .unlock(UnlockRequest {
            key: held.key.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let got = within(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.key, format!("job/{l2:x}").into_bytes());
    assert!(got.header.unwrap().revision >= unlocked.header.unwrap().revision);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_passes_on_when_its_lease_is_revoked_and_errors_are_etcds() {
    let c = Cluster::start(1).await;
    let (l1, l2) = (grant(&c, 0, 30).await, grant(&c, 0, 30).await);
    let mut a = locks(&c, 0).await;
    a.lock(LockRequest {
        name: b"r".to_vec(),
        lease: l1,
    })
    .await
    .unwrap();
    let waiter = spawn_lock(&c, 0, b"r", l2).await;
    let waiter = still_waiting(waiter, Duration::from_millis(500)).await;
    LeaseClient::new(common::channel(&c.members[0].client_url()).await)
        .lease_revoke(LeaseRevokeRequest { id: l1 })
        .await
        .unwrap();
    let got = within(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.key, format!("r/{l2:x}").into_bytes());

    // A lease that does not exist: etcd's text, with code Unknown (etcd's lock server returns
    // its client's error as a plain error).
    let e = a
        .lock(LockRequest {
            name: b"r".to_vec(),
            lease: 0x1234,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::Unknown, "etcdserver: requested lease not found")
    );

    // Lease 0: a 60 s lease is granted for the key.
    let mut z = locks(&c, 0).await;
    let zk = z
        .lock(LockRequest {
            name: b"zero".to_vec(),
            lease: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .key;
    let hex = std::str::from_utf8(&zk[b"zero/".len()..]).unwrap();
    let id = i64::from_str_radix(hex, 16).unwrap();
    let ttl = LeaseClient::new(common::channel(&c.members[0].client_url()).await)
        .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.granted_ttl, 60);
    assert_eq!(ttl.keys, vec![zk]);

    // A waiter whose client goes away has its key deleted, as etcd's Mutex does.
    let l3 = grant(&c, 0, 30).await;
    let gone = spawn_lock(&c, 0, b"zero", l3).await;
    let waiter_key = format!("zero/{l3:x}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !keys_under(&c, "zero/").await.contains(&waiter_key) {
        assert!(Instant::now() < deadline, "waiter key never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gone.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    while keys_under(&c, "zero/").await.contains(&waiter_key) {
        assert!(Instant::now() < deadline, "abandoned waiter's key stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(keys_under(&c, "zero/").await, vec![format!("zero/{id:x}")]);

    // A waiter whose own lease ends while it waits is told so once its turn comes (etcd 3.5's
    // Mutex), instead of being answered a lock nobody holds.
    let l4 = grant(&c, 0, 30).await;
    let expired = spawn_lock(&c, 0, b"zero", l4).await;
    let expired = still_waiting(expired, Duration::from_millis(500)).await;
    let mut leases = LeaseClient::new(common::channel(&c.members[0].client_url()).await);
    leases
        .lease_revoke(LeaseRevokeRequest { id: l4 })
        .await
        .unwrap();
    leases
        .lease_revoke(LeaseRevokeRequest { id })
        .await
        .unwrap();
    let e = within(Duration::from_secs(5), expired).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::Unknown, "mutex: session is expired")
    );
}

async fn next(o: &mut tonic::Streaming<LeaderResponse>) -> LeaderResponse {
    tokio::time::timeout(Duration::from_secs(5), o.message())
        .await
        .expect("observe answers")
        .unwrap()
        .unwrap()
}

fn value_of(r: &LeaderResponse) -> Vec<u8> {
    r.kv.as_ref().unwrap().value.clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn election_hands_over_on_resign_and_refuses_a_stale_leader() {
    let c = Cluster::start(1).await;
    let mut e = elections(&c, 0).await;
    let e404 = e
        .leader(LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e404.code(), e404.message()),
        (Code::Unknown, "election: no leader")
    );

    // An observer started before anyone campaigns sees the first leader.
    let mut obs = e
        .observe(LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();

    let (la, lb) = (grant(&c, 0, 30).await, grant(&c, 0, 30).await);
    let a = e
        .campaign(CampaignRequest {
            name: b"el".to_vec(),
            lease: la,
            value: b"a".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    let a_key = a.leader.clone().unwrap();
    assert_eq!(a_key.key, format!("el/{la:x}").into_bytes());
    assert_eq!(a_key.lease, la);
    assert_eq!(a_key.rev, a.header.unwrap().revision);

    assert_eq!(value_of(&next(&mut obs).await), b"a");

    let mut eb = elections(&c, 0).await;
    let b = tokio::spawn(async move {
        eb.campaign(CampaignRequest {
            name: b"el".to_vec(),
            lease: lb,
            value: b"b".to_vec(),
        })
        .await
    });
    let b = still_waiting(b, Duration::from_millis(800)).await;
    let leader = e
        .leader(LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(value_of(&leader), b"a");

    // B is not leader: proclaiming with its key fails with etcd's error.
    let b_key = LeaderKey {
        name: b"el".to_vec(),
        key: format!("el/{lb:x}").into_bytes(),
        rev: a_key.rev + 1000,
        lease: lb,
    };
    let err = e
        .proclaim(ProclaimRequest {
            leader: Some(b_key),
            value: b"x".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::Unknown, "election: not leader")
    );
    let err = e
        .proclaim(ProclaimRequest {
            leader: None,
            value: b"x".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.message(), "\"leader\" field must be provided");

    // The leader proclaims: observers see the new value.
    e.proclaim(ProclaimRequest {
        leader: Some(a_key.clone()),
        value: b"a2".to_vec(),
    })
    .await
    .unwrap();
    assert_eq!(value_of(&next(&mut obs).await), b"a2");

    e.resign(ResignRequest {
        leader: Some(a_key.clone()),
    })
    .await
    .unwrap();
    let b = within(Duration::from_secs(5), b)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.leader.unwrap().key, format!("el/{lb:x}").into_bytes());
    assert_eq!(value_of(&next(&mut obs).await), b"b");
    let leader = e
        .leader(LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(value_of(&leader), b"b");

    // The old leadership is gone: proclaiming with it fails.
    let err = e
        .proclaim(ProclaimRequest {
            leader: Some(a_key),
            value: b"late".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.message(), "election: not leader");
}

/// The lock holder reached the cluster through member 0, which dies: its lease (not kept
/// alive) expires on the leader, and the waiter on another member gets the lock.
#[tokio::test(flavor = "multi_thread")]
async fn lock_hands_over_after_the_holders_member_dies() {
    let mut c = Cluster::start(3).await;
    let l1 = grant(&c, 0, 3).await;
    let l2 = grant(&c, 1, 60).await;
    locks(&c, 0)
        .await
        .lock(LockRequest {
            name: b"ha".to_vec(),
            lease: l1,
        })
        .await
        .unwrap();
    let waiter = spawn_lock(&c, 1, b"ha", l2).await;
    let waiter = still_waiting(waiter, Duration::from_millis(300)).await;
    c.kill(0);
    let started = Instant::now();
    let got = within(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.key, format!("ha/{l2:x}").into_bytes());
    eprintln!("lock handed over {:?} after the kill", started.elapsed());
}

/// The JSON gateway's lock and election routes, with etcd's bodies.
#[tokio::test(flavor = "multi_thread")]
async fn gateway_serves_lock_and_election() {
    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine;
    let c = Cluster::start(1).await;
    let base = c.members[0].client_url();
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let req = http.post(format!("{base}{path}")).body(body.to_string());
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            (status, serde_json::from_str::<Value>(&text).unwrap())
        }
    };

    let (st, v) = post("/v3/lock/lock", json!({"name": B64.encode("gw")})).await;
    assert_eq!(st, 200, "{v}");
    let key = B64.decode(v["key"].as_str().unwrap()).unwrap();
    assert!(key.starts_with(b"gw/"), "{v}");
    assert!(v["header"]["revision"].is_string(), "{v}");
    let (st, v) = post("/v3/lock/unlock", json!({"key": B64.encode(&key)})).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(
        "/v3/lock/lock",
        json!({"name": B64.encode("gw"), "lease": "4660"}),
    )
    .await;
    assert_eq!(st, 500);
    assert_eq!(
        v,
        json!({"error": "etcdserver: requested lease not found",
               "message": "etcdserver: requested lease not found", "code": 2})
    );

    let (st, v) = post("/v3/election/leader", json!({"name": B64.encode("ge")})).await;
    assert_eq!(
        (st, v),
        (
            500,
            json!({"error": "election: no leader", "message": "election: no leader", "code": 2})
        )
    );
    let (st, camp) = post(
        "/v3/election/campaign",
        json!({"name": B64.encode("ge"), "value": B64.encode("v1")}),
    )
    .await;
    assert_eq!(st, 200, "{camp}");
    let leader = camp["leader"].clone();
    assert_eq!(leader["name"], json!(B64.encode("ge")));

    // Observe streams the current leader first.
    let mut obs = http
        .post(format!("{base}/v3/election/observe"))
        .body(json!({"name": B64.encode("ge")}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(obs.status().as_u16(), 200);
    let chunk = tokio::time::timeout(Duration::from_secs(5), obs.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let first: Value = serde_json::from_slice(&chunk).unwrap();
    assert_eq!(first["result"]["kv"]["value"], json!(B64.encode("v1")));

    let (st, v) = post(
        "/v3/election/proclaim",
        json!({"leader": leader, "value": B64.encode("v2")}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let chunk = tokio::time::timeout(Duration::from_secs(5), obs.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let second: Value = serde_json::from_slice(&chunk).unwrap();
    assert_eq!(second["result"]["kv"]["value"], json!(B64.encode("v2")));

    let (st, v) = post("/v3/election/resign", json!({})).await;
    assert_eq!((st, v["code"].clone()), (500, json!(2)));
    assert_eq!(v["message"], json!("\"leader\" field must be provided"));
    let (st, v) = post("/v3/election/resign", json!({ "leader": leader })).await;
    assert_eq!(st, 200, "{v}");
    let (st, _) = post("/v3/election/leader", json!({"name": B64.encode("ge")})).await;
    assert_eq!(st, 500);
}

#[tokio::test(flavor = "multi_thread")]
async fn downgrade_and_move_leader_answer_as_etcd_3_5() {
    let c = Cluster::start(1).await;
    let mut m = c.maintenance(0).await;
    let req = |action: DowngradeAction, version: &str| DowngradeRequest {
        action: action as i32,
        version: version.into(),
    };
    let ok = m
        .downgrade(req(DowngradeAction::Validate, "3.4"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.version, "3.5.0");
    assert!(ok.header.is_some());
    let cases = [
        (
            req(DowngradeAction::Validate, "3.3.0"),
            Code::InvalidArgument,
            "etcdserver: invalid downgrade target version",
        ),
        (
            req(DowngradeAction::Validate, "three"),
            Code::InvalidArgument,
            "etcdserver: wrong downgrade target version format",
        ),
        (
            req(DowngradeAction::Enable, "3.5"),
            Code::InvalidArgument,
            "etcdserver: invalid downgrade target version",
        ),
        (
            req(DowngradeAction::Enable, "3.4"),
            Code::Unimplemented,
            "etcdserver: downgrade is not supported by kvd",
        ),
        (
            req(DowngradeAction::Cancel, ""),
            Code::FailedPrecondition,
            "etcdserver: no inflight downgrade job",
        ),
        (
            DowngradeRequest {
                action: 7,
                version: String::new(),
            },
            Code::Unknown,
            "etcdserver: unknown method",
        ),
    ];
    for (r, code, msg) in cases {
        let e = m.downgrade(r.clone()).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (code, msg), "{r:?}");
    }

    // MoveLeader to the member that leads: success, and no header (etcd fills none).
    let id = c.status(0).await.header.unwrap().member_id;
    let r = m
        .move_leader(MoveLeaderRequest { target_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.header, None);
}

/// `kvctl lock`: the holder prints its key and holds until SIGINT; a command run under the
/// lock waits for it and sees the key in `ETCD_LOCK_KEY`.
#[tokio::test(flavor = "multi_thread")]
async fn kvctl_lock_holds_until_interrupted_and_runs_commands_under_it() {
    use std::process::{Command, Stdio};
    let c = Cluster::start(1).await;
    let ep = c.members[0].client_url();
    let kvctl = env!("CARGO_BIN_EXE_kvctl");
    let mut holder = tokio::process::Command::new(kvctl)
        .args(["--endpoints", &ep, "lock", "cli"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = holder.stdout.take().unwrap();
    let mut first = vec![0u8; 4];
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_exact(&mut out, &mut first),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(&first, b"cli/");

    let ep2 = ep.clone();
    let runner = tokio::task::spawn_blocking(move || {
        Command::new(kvctl)
            .args(["--endpoints", &ep2, "lock", "cli", "--"])
            .args(["sh", "-c", "echo \"$ETCD_LOCK_KEY\"; exit 3"])
            .output()
            .unwrap()
    });
    let runner = still_waiting(runner, Duration::from_millis(800)).await;
    unsafe {
        libc::kill(holder.id().unwrap() as i32, libc::SIGINT);
    }
    let st = tokio::time::timeout(Duration::from_secs(10), holder.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "{st:?}");
    let ran = within(Duration::from_secs(10), runner).await;
    let stdout = String::from_utf8(ran.stdout).unwrap();
    assert!(stdout.starts_with("cli/"), "{stdout}");
    assert_eq!(
        String::from_utf8(ran.stderr).unwrap(),
        "Error: exit status 3\n"
    );
    assert_eq!(ran.status.code(), Some(1));
    // Unlocked after the command: no key is left under the lock's name.
    assert!(keys_under(&c, "cli/").await.is_empty());
}

/// A failed call's code and message.
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> (Code, String) {
    let s = r.unwrap_err();
    (s.code(), s.message().to_string())
}

/// `msg` carrying `token` as etcd's clients send it.
fn as_user<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("token", token.parse().unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_run_as_the_caller_with_auth() {
    use kvd::proto::authpb::{permission::Type as PermType, Permission};
    use kvd::proto::etcdserverpb::auth_client::AuthClient;
    use kvd::proto::etcdserverpb::*;
    let c = Cluster::start_opts(3, false, &["--bcrypt-cost=4"]).await;
    c.wait_for_leader(Duration::from_secs(10)).await;
    let mut a = AuthClient::new(common::channel(&c.members[0].client_url()).await);
    for u in ["root", "alice", "bob"] {
        a.user_add(AuthUserAddRequest {
            name: u.into(),
            password: "pw".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    a.user_grant_role(AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    })
    .await
    .unwrap();
    // alice: readwrite on the lock's and the election's prefixes; bob: nothing.
    a.role_add(AuthRoleAddRequest { name: "rw".into() })
        .await
        .unwrap();
    for (k, e) in [("mylock/", "mylock0"), ("el/", "el0")] {
        a.role_grant_permission(AuthRoleGrantPermissionRequest {
            name: "rw".into(),
            perm: Some(Permission {
                perm_type: PermType::Readwrite as i32,
                key: k.into(),
                range_end: e.into(),
            }),
        })
        .await
        .unwrap();
    }
    a.user_grant_role(AuthUserGrantRoleRequest {
        user: "alice".into(),
        role: "rw".into(),
    })
    .await
    .unwrap();
    a.auth_enable(AuthEnableRequest {}).await.unwrap();
    let mut tokens = Vec::new();
    for u in ["alice", "bob"] {
        let r = a
            .authenticate(AuthenticateRequest {
                name: u.into(),
                password: "pw".into(),
            })
            .await
            .unwrap();
        tokens.push(r.into_inner().token);
    }
    let (alice, bob) = (&tokens[0], &tokens[1]);

    // On another member than the one that issued the tokens.
    let mut l = locks(&c, 1).await;
    let held = l
        .lock(as_user(
            LockRequest {
                name: b"mylock".to_vec(),
                lease: 0,
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(held.key.starts_with(b"mylock/"));
    l.unlock(as_user(UnlockRequest { key: held.key }, alice))
        .await
        .unwrap();
    let denied = (Code::Unknown, "etcdserver: permission denied".to_string());
    let lock = |t: &str| {
        as_user(
            LockRequest {
                name: b"mylock".to_vec(),
                lease: 0,
            },
            t,
        )
    };
    assert_eq!(refused(l.lock(lock(bob)).await), denied);
    assert_eq!(
        refused(
            l.lock(tonic::Request::new(LockRequest {
                name: b"mylock".to_vec(),
                lease: 0,
            }))
            .await
        ),
        (Code::Unknown, "etcdserver: user name is empty".to_string())
    );
    assert_eq!(
        refused(l.lock(lock("bogus.1")).await),
        (Code::Unknown, "etcdserver: invalid auth token".to_string())
    );

    let mut e = elections(&c, 2).await;
    let camp = |name: &[u8], t: &str| {
        as_user(
            CampaignRequest {
                name: name.to_vec(),
                lease: 0,
                value: b"me".to_vec(),
            },
            t,
        )
    };
    let leader = e.campaign(camp(b"el", alice)).await.unwrap().into_inner();
    let got = e
        .leader(as_user(
            LeaderRequest {
                name: b"el".to_vec(),
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.kv.unwrap().value, b"me");
    assert_eq!(refused(e.campaign(camp(b"el", bob)).await), denied);
    assert_eq!(
        refused(
            e.leader(as_user(
                LeaderRequest {
                    name: b"el".to_vec()
                },
                bob
            ))
            .await
        ),
        denied
    );
    assert_eq!(refused(e.campaign(camp(b"other", alice)).await), denied);
    e.resign(as_user(
        ResignRequest {
            leader: leader.leader,
        },
        alice,
    ))
    .await
    .unwrap();
}

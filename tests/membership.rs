//! Run-time membership changes on real `kvd` processes: etcd's strict reconfiguration checks
//! (refused and allowed cases), replacing a dead member through a learner, removing the leader,
//! the removed member's exit (also when it was removed while down), changes allowed at once by
//! a new leader, a second voter added before it starts (answered at once, as etcd), and
//! membership changes under client load without losing an acknowledged write.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{get, put, Cluster};
use kvd::proto::etcdserverpb::{
    MemberAddRequest, MemberAddResponse, MemberListRequest, MemberPromoteRequest,
    MemberRemoveRequest, MemberUpdateRequest, MoveLeaderRequest, RangeRequest,
};
use tonic::Code;

/// Past etcd's 5 s health interval, so every live link counts as active.
const SETTLE: Duration = Duration::from_millis(5500);

async fn member_id(c: &Cluster, i: usize) -> u64 {
    let st = c.status(i).await;
    st.header.unwrap().member_id
}

async fn add(
    c: &Cluster,
    via: usize,
    urls: &[String],
    learner: bool,
) -> Result<MemberAddResponse, tonic::Status> {
    c.cluster(via)
        .await
        .member_add(MemberAddRequest {
            peer_ur_ls: urls.to_vec(),
            is_learner: learner,
        })
        .await
        .map(|r| r.into_inner())
}

async fn remove(c: &Cluster, via: usize, id: u64) -> Result<(), tonic::Status> {
    c.cluster(via)
        .await
        .member_remove(MemberRemoveRequest { id })
        .await
        .map(|_| ())
}

async fn promote(c: &Cluster, via: usize, id: u64) -> Result<(), tonic::Status> {
    c.cluster(via)
        .await
        .member_promote(MemberPromoteRequest { id })
        .await
        .map(|_| ())
}

fn assert_refused(r: Result<impl std::fmt::Debug, tonic::Status>, code: Code, msg: &str) {
    let e = r.expect_err("change should be refused");
    assert_eq!((e.code(), e.message()), (code, msg), "{e:?}");
}

fn followers(c: &Cluster, leader: usize) -> Vec<usize> {
    (0..c.members.len())
        .filter(|i| *i != leader && c.members[*i].child.is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_member_refusals_then_replace_it_through_a_learner() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = followers(&c, leader);
    let (dead, healthy) = (f[0], f[1]);
    let dead_id = member_id(&c, dead).await;
    let healthy_id = member_id(&c, healthy).await;
    let mut w = c.kv(leader).await;
    for i in 0..30 {
        put(&mut w, &format!("k{i}"), "v").await.unwrap();
    }
    c.kill(dead);
    tokio::time::sleep(SETTLE).await;

    // Removing a healthy member would leave one active voter of two.
    assert_refused(
        remove(&c, healthy, healthy_id).await,
        Code::Unavailable,
        "etcdserver: unhealthy cluster",
    );
    // A fourth voter needs three active voters; only two are.
    let spare = format!("http://127.0.0.1:{}", common::free_port());
    assert_refused(
        add(&c, healthy, std::slice::from_ref(&spare), false).await,
        Code::Unavailable,
        "etcdserver: unhealthy cluster",
    );
    assert_refused(
        remove(&c, leader, 0x1234).await,
        Code::NotFound,
        "etcdserver: member not found",
    );
    assert_refused(
        promote(&c, leader, healthy_id).await,
        Code::FailedPrecondition,
        "etcdserver: can only promote a learner member",
    );
    assert_refused(
        add(&c, leader, &[c.members[healthy].peer_url()], true).await,
        Code::FailedPrecondition,
        "etcdserver: Peer URLs already exists",
    );

    // The dead member is not part of the active quorum: removing it is allowed.
    remove(&c, healthy, dead_id).await.unwrap();

    // Replace it: add as learner, start it as an existing-cluster member, promote.
    let n = c.new_member("m3");
    let resp = add(&c, healthy, &[c.members[n].peer_url()], true)
        .await
        .unwrap();
    let new = resp.member.clone().unwrap();
    assert!(new.is_learner);
    assert_eq!(resp.members.len(), 3);
    assert!(resp
        .members
        .iter()
        .any(|m| m.id == new.id && m.name.is_empty()));
    c.members[n].join = Some(common::initial_cluster_for(&resp, "m3"));
    c.spawn(n);
    learner_serves_only_status_and_serializable_range(&c, n).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match promote(&c, leader, new.id).await {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                assert!(
                    e.message().contains("in sync with leader")
                        || e.message().contains("not enough started")
                        || e.message().contains("unhealthy"),
                    "{e:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("promote: {e:?}\n{}", c.log_of(n)),
        }
    }

    // The new member serves: a write through it is readable on the leader.
    let mut nw = c.kv(n).await;
    put(&mut nw, "via-new", "yes").await.unwrap();
    assert_eq!(
        get(&mut w, "via-new").await.unwrap().as_deref(),
        Some("yes")
    );
    assert_eq!(get(&mut nw, "k29").await.unwrap().as_deref(), Some("v"));

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = c
            .cluster(leader)
            .await
            .member_list(MemberListRequest { linearizable: true })
            .await
            .unwrap()
            .into_inner();
        let names: Vec<_> = list.members.iter().map(|m| m.name.clone()).collect();
        if list.members.len() == 3
            && list
                .members
                .iter()
                .all(|m| !m.is_learner && !m.name.is_empty())
        {
            assert!(names.contains(&"m3".to_string()), "{names:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{list:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// etcd 3.4's rule (`isRPCSupportedForLearner`): a learner answers Maintenance.Status and
/// serializable ranges; everything else, over gRPC or the JSON gateway, gets "etcdserver: rpc
/// not supported for learner" (Unavailable).
async fn learner_serves_only_status_and_serializable_range(c: &Cluster, n: usize) {
    const REFUSED: &str = "etcdserver: rpc not supported for learner";
    let mut kv = c.kv(n).await;
    let serializable = RangeRequest {
        key: "k29".into(),
        serializable: true,
        ..Default::default()
    };
    // Serializable reads are served (once the learner has caught up with the write).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = kv.range(serializable.clone()).await.unwrap().into_inner();
        if !r.kvs.is_empty() {
            assert_eq!(r.kvs[0].value, b"v");
            break;
        }
        assert!(Instant::now() < deadline, "learner never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.status(n).await;
    assert_refused(get(&mut kv, "k29").await, Code::Unavailable, REFUSED);
    assert_refused(put(&mut kv, "k", "v").await, Code::Unavailable, REFUSED);
    let list = c
        .cluster(n)
        .await
        .member_list(MemberListRequest {
            linearizable: false,
        })
        .await;
    assert_refused(list, Code::Unavailable, REFUSED);
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/v3/kv/put", c.members[n].client_url()))
        .body(r#"{"key":"aw==","value":"dg=="}"#)
        .send()
        .await
        .unwrap();
    let (code, body) = (resp.status(), resp.text().await.unwrap());
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(REFUSED), "{body}");
    let resp = http
        .post(format!("{}/v3/kv/range", c.members[n].client_url()))
        .body(r#"{"key":"azI5","serializable":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_rules_update_and_move_leader() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = followers(&c, leader);
    let mut w = c.kv(leader).await;
    for i in 0..50 {
        put(&mut w, &format!("k{i}"), "v").await.unwrap();
    }
    tokio::time::sleep(SETTLE).await;

    // A learner that never started is not in sync: promotion is refused.
    let url = format!("http://127.0.0.1:{}", common::free_port());
    let resp = add(&c, f[0], std::slice::from_ref(&url), true)
        .await
        .unwrap();
    let learner = resp.member.unwrap().id;
    assert_refused(
        promote(&c, f[0], learner).await,
        Code::FailedPrecondition,
        "etcdserver: can only promote a learner member which is in sync with leader",
    );
    // One learner at a time.
    let url2 = format!("http://127.0.0.1:{}", common::free_port());
    assert_refused(
        add(&c, f[1], std::slice::from_ref(&url2), true).await,
        Code::FailedPrecondition,
        "etcdserver: too many learner members in cluster",
    );
    assert_refused(
        add(&c, f[1], &["not a url".into()], true).await,
        Code::InvalidArgument,
        "etcdserver: given member URLs are invalid",
    );

    // Update the learner's peer URLs.
    let up = c
        .cluster(f[1])
        .await
        .member_update(MemberUpdateRequest {
            id: learner,
            peer_ur_ls: vec![url2.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    let m = up.members.iter().find(|m| m.id == learner).unwrap();
    assert_eq!(m.peer_ur_ls, vec![url2]);

    // MoveLeader: only the leader serves it, and only to a voter.
    let target = member_id(&c, f[0]).await;
    let e = c
        .maintenance(f[1])
        .await
        .move_leader(MoveLeaderRequest { target_id: target })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::FailedPrecondition, "etcdserver: not leader")
    );
    let e = c
        .maintenance(leader)
        .await
        .move_leader(MoveLeaderRequest { target_id: learner })
        .await
        .unwrap_err();
    assert_eq!(e.message(), "etcdserver: bad leader transferee");
    c.maintenance(leader)
        .await
        .move_leader(MoveLeaderRequest { target_id: target })
        .await
        .unwrap();
    assert_eq!(c.wait_for_leader(Duration::from_secs(5)).await, f[0]);

    // Removing a learner is always allowed.
    remove(&c, leader, learner).await.unwrap();
    let list = c
        .cluster(f[0])
        .await
        .member_list(MemberListRequest { linearizable: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.members.len(), 3);
    assert!(list.members.iter().all(|m| !m.is_learner));

    // kvctl prints what etcdctl 3.4 prints.
    let eps = format!("--endpoints={}", c.members[f[1]].client_url());
    let url3 = format!("http://127.0.0.1:{}", common::free_port());
    let out = kvctl(&[
        &eps,
        "member",
        "add",
        "m9",
        &format!("--peer-urls={url3}"),
        "--learner",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("Member ") && lines[0].contains(" added to cluster "),
        "{out}"
    );
    assert_eq!(lines[1], "");
    assert_eq!(lines[2], "ETCD_NAME=\"m9\"");
    assert!(
        lines[3].starts_with("ETCD_INITIAL_CLUSTER=\"") && lines[3].contains(&format!("m9={url3}")),
        "{out}"
    );
    assert_eq!(
        lines[4],
        format!("ETCD_INITIAL_ADVERTISE_PEER_URLS=\"{url3}\"")
    );
    assert_eq!(lines[5], "ETCD_INITIAL_CLUSTER_STATE=\"existing\"");
    let id = lines[0].split_whitespace().nth(1).unwrap().to_string();
    let out = kvctl(&[&eps, "member", "remove", &id]);
    assert!(
        out.starts_with(&format!("Member {id:>16} removed from cluster ")),
        "{out}"
    );
    let out = kvctl(&[
        &format!(
            "--endpoints={},{}",
            c.members[f[1]].client_url(),
            c.members[f[0]].client_url()
        ),
        "move-leader",
        &format!("{:x}", member_id(&c, f[1]).await),
    ]);
    assert_eq!(
        out,
        format!(
            "Leadership transferred from {:x} to {:x}\n",
            target,
            member_id(&c, f[1]).await
        )
    );
}

fn kvctl(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"))
        .args(args)
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ETCDCTL_WRITE_OUT")
        .output()
        .expect("run kvctl");
    assert!(
        out.status.success(),
        "kvctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_follower_and_removed_leader_exit() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = followers(&c, leader);
    tokio::time::sleep(SETTLE).await;

    // A removed follower is told so by the leader and exits.
    let fid = member_id(&c, f[0]).await;
    remove(&c, f[1], fid).await.unwrap();
    let st = c.wait_exit(f[0], Duration::from_secs(10));
    assert!(
        st.is_some(),
        "removed follower still runs\n{}",
        c.log_of(f[0])
    );
    assert!(c
        .log_of(f[0])
        .contains("the member has been permanently removed from the cluster"));

    // Removing the leader (through the other member): leadership moves, the old leader exits.
    let lid = member_id(&c, leader).await;
    remove(&c, f[1], lid).await.unwrap();
    let st = c.wait_exit(leader, Duration::from_secs(10));
    assert!(
        st.is_some(),
        "removed leader still runs\n{}",
        c.log_of(leader)
    );
    assert!(c
        .log_of(leader)
        .contains("the member has been permanently removed from the cluster"));
    assert_eq!(c.wait_for_leader(Duration::from_secs(10)).await, f[1]);
    let mut w = c.kv(f[1]).await;
    put(&mut w, "after", "1").await.unwrap();
    let list = c
        .cluster(f[1])
        .await
        .member_list(MemberListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.members.len(), 1);
}

/// etcd tracks peer activity on streams that exist between all members whatever their roles, so
/// a member that has just been elected can already tell which peers have been up for 5 s, even
/// peers it never exchanged a Raft message with (here: a promoted learner and the followers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_leader_allows_membership_changes_at_once() {
    let mut c = Cluster::start(3).await;
    let old = c.wait_for_leader(Duration::from_secs(10)).await;
    let old_id = member_id(&c, old).await;
    tokio::time::sleep(SETTLE).await;
    let n = c.new_member("m3");
    let resp = add(&c, old, &[c.members[n].peer_url()], true)
        .await
        .unwrap();
    let new_id = resp.member.clone().unwrap().id;
    c.members[n].join = Some(common::initial_cluster_for(&resp, "m3"));
    c.spawn(n);
    until_allowed("promote", || promote(&c, old, new_id)).await;
    tokio::time::sleep(SETTLE).await;

    c.kill(old);
    let leader = c.wait_for_leader(Duration::from_secs(15)).await;
    let known = Instant::now();

    // Three of four voters are active: adding a learner is allowed (it needs both other
    // survivors active), and so is removing the dead member; neither may wait for the new
    // leader's own links to age 5 s.
    let spare = format!("http://127.0.0.1:{}", common::free_port());
    let learner = add(&c, leader, std::slice::from_ref(&spare), true)
        .await
        .unwrap_or_else(|e| panic!("add learner {:?} after election: {e:?}", known.elapsed()))
        .member
        .unwrap()
        .id;
    remove(&c, leader, old_id)
        .await
        .unwrap_or_else(|e| panic!("remove dead {:?} after election: {e:?}", known.elapsed()));
    let took = known.elapsed();
    assert!(took < Duration::from_secs(2), "changes took {took:?}");
    remove(&c, leader, learner).await.unwrap();
}

/// Adding a second voter to a one-member cluster: etcd 3.4 answers at once (its conf change
/// commits under the old configuration), though from then on the cluster needs the new member
/// for a quorum. kvd answers as soon, before the new member is started (openraft cannot commit
/// the change without it: the answer waits only for the old voters), lists it unstarted, keeps
/// the change when the leader is killed right after answering, and once the new member has
/// started and caught up by a snapshot both members serve linearizable reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_second_voter_answers_before_the_new_member_starts() {
    let flags = [
        "--snapshot-count=500",
        "--experimental-snapshot-catchup-entries=100",
    ];
    let mut c = Cluster::start_opts(1, false, &flags).await;
    let mut w = c.kv(0).await;
    for i in 0..1500 {
        put(&mut w, &format!("k{i:04}"), &"v".repeat(1024))
            .await
            .unwrap();
    }
    let n = c.new_member("m1");
    let asked = Instant::now();
    let resp = add(&c, 0, &[c.members[n].peer_url()], false)
        .await
        .unwrap_or_else(|e| panic!("member add after {:?}: {e:?}", asked.elapsed()));
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(1), "member add took {took:?}");
    let new = resp.member.clone().unwrap();
    assert!(!new.is_learner);
    assert_eq!(resp.members.len(), 2, "{resp:?}");

    let list = c
        .cluster(0)
        .await
        .member_list(MemberListRequest {
            linearizable: false,
        })
        .await
        .unwrap()
        .into_inner();
    let listed = list.members.iter().find(|m| m.id == new.id);
    let listed = listed.unwrap_or_else(|| panic!("not listed: {list:?}"));
    assert!(listed.name.is_empty() && listed.client_ur_ls.is_empty() && !listed.is_learner);

    // The answer means the change is durable: killed now (the commit still waits for m1), the
    // leader restarts with it and the cluster needs m1 to elect.
    c.kill(0);
    c.spawn(0);
    c.members[n].join = Some(common::initial_cluster_for(&resp, "m1"));
    c.spawn(n);
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in [0, n] {
        loop {
            let got = match tokio::time::timeout(Duration::from_secs(3), c.kv(i)).await {
                Ok(mut kv) => tokio::time::timeout(Duration::from_secs(3), get(&mut kv, "k1499"))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten(),
                Err(_) => None,
            };
            if let Some(v) = got {
                assert_eq!(v, "v".repeat(1024));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "member {i} serves no linearizable read\n{}",
                c.log_of(n)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(
        c.log_of(n).contains("installed snapshot"),
        "the new member did not catch up by a snapshot\n{}",
        c.log_of(n)
    );
    let list = c
        .cluster(n)
        .await
        .member_list(MemberListRequest { linearizable: true })
        .await
        .unwrap()
        .into_inner();
    assert!(
        list.members
            .iter()
            .all(|m| !m.name.is_empty() && !m.is_learner),
        "{list:?}"
    );
}

/// A member removed while it was down learns of it from its peers when restarted, logs what
/// etcd logs and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_removed_while_down_exits_when_restarted() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = followers(&c, leader);
    let gone = f[0];
    let gone_id = member_id(&c, gone).await;
    c.kill(gone);
    remove(&c, f[1], gone_id).await.unwrap();
    let mut w = c.kv(leader).await;
    put(&mut w, "after-removal", "1").await.unwrap();
    // Past the leader's best-effort removal notice (10 s): only its peers can tell it now.
    tokio::time::sleep(Duration::from_secs(11)).await;

    c.spawn(gone);
    let st = c
        .wait_exit(gone, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("removed member still runs\n{}", c.log_of(gone)));
    assert!(st.success(), "{st:?}\n{}", c.log_of(gone));
    assert!(
        c.log_of(gone)
            .contains("the member has been permanently removed from the cluster"),
        "{}",
        c.log_of(gone)
    );
    // The cluster is unaffected: two members, writes go on.
    put(&mut w, "after-restart", "1").await.unwrap();
    let list = c
        .cluster(leader)
        .await
        .member_list(MemberListRequest { linearizable: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.members.len(), 2, "{list:?}");
    assert!(list.members.iter().all(|m| m.id != gone_id));
}

/// What one writer got acknowledged: key -> (value, revision of the put).
type Acked = Arc<Mutex<BTreeMap<String, (String, i64)>>>;

/// Writes unique keys in a loop, each through the next member of `targets`, recording every
/// acknowledged put; failures (a member leaving, a leader change) are retried with a new key.
async fn writer(w: usize, targets: Arc<Mutex<Vec<String>>>, acked: Acked, stop: Arc<AtomicBool>) {
    let mut clients = BTreeMap::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let url = {
            let t = targets.lock().unwrap();
            t[(w + n) % t.len()].clone()
        };
        if !clients.contains_key(&url) {
            match common::try_channel(&url).await {
                Ok(ch) => {
                    clients.insert(
                        url.clone(),
                        kvd::proto::etcdserverpb::kv_client::KvClient::new(ch),
                    );
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let kv = clients.get_mut(&url).unwrap();
        let (k, v) = (format!("load/{w:02}/{n:06}"), format!("v{w}.{n}"));
        match tokio::time::timeout(Duration::from_secs(10), put(kv, &k, &v)).await {
            Ok(Ok(rev)) => {
                acked.lock().unwrap().insert(k, (v, rev));
            }
            _ => {
                clients.remove(&url);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Retries a membership change while it is refused for a reason that time fixes.
async fn until_allowed<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                assert!(
                    e.message().contains("in sync with leader")
                        || e.message().contains("unhealthy")
                        || e.message().contains("not enough started")
                        || e.message().contains("timed out")
                        || e.message().contains("leader"),
                    "{what}: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_change_during_client_load_no_acked_write_lost() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let f = followers(&c, leader);
    let targets = Arc::new(Mutex::new(
        c.members.iter().map(|m| m.client_url()).collect::<Vec<_>>(),
    ));
    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| tokio::spawn(writer(w, targets.clone(), acked.clone(), stop.clone())))
        .collect();
    let count = || acked.lock().unwrap().len();
    let mut progress = vec![];
    tokio::time::sleep(SETTLE).await;
    progress.push(count());

    // Add a learner, start it, promote it: under load.
    let n = c.new_member("m3");
    let resp = add(&c, f[0], &[c.members[n].peer_url()], true)
        .await
        .unwrap();
    let new_id = resp.member.clone().unwrap().id;
    c.members[n].join = Some(common::initial_cluster_for(&resp, "m3"));
    c.spawn(n);
    until_allowed("promote", || promote(&c, f[1], new_id)).await;
    targets.lock().unwrap().push(c.members[n].client_url());
    progress.push(count());

    // Remove an original follower.
    let fid = member_id(&c, f[0]).await;
    until_allowed("remove follower", || remove(&c, leader, fid)).await;
    targets
        .lock()
        .unwrap()
        .retain(|u| *u != c.members[f[0]].client_url());
    assert!(
        c.wait_exit(f[0], Duration::from_secs(15)).is_some(),
        "{}",
        c.log_of(f[0])
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    progress.push(count());

    // Second round: remove the leader (the new member must have been active 5 s first).
    let lid = member_id(&c, leader).await;
    until_allowed("remove leader", || remove(&c, f[1], lid)).await;
    targets
        .lock()
        .unwrap()
        .retain(|u| *u != c.members[leader].client_url());
    assert!(
        c.wait_exit(leader, Duration::from_secs(15)).is_some(),
        "{}",
        c.log_of(leader)
    );
    c.wait_for_leader(Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    progress.push(count());

    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    // Writes were acknowledged in every phase, not only before the first change.
    assert!(
        progress.windows(2).all(|p| p[1] > p[0]) && progress[0] > 0,
        "acked writes per phase: {progress:?}"
    );

    let acked = acked.lock().unwrap().clone();
    for i in [f[1], n] {
        let resp = c
            .kv(i)
            .await
            .range(RangeRequest {
                key: b"load/".to_vec(),
                range_end: b"load0".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let have: BTreeMap<String, (String, i64)> = resp
            .kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8(kv.key.clone()).unwrap(),
                    (
                        String::from_utf8(kv.value.clone()).unwrap(),
                        kv.mod_revision,
                    ),
                )
            })
            .collect();
        for (k, want) in &acked {
            assert_eq!(have.get(k), Some(want), "member {i}: acked put of {k} lost");
        }
    }
    eprintln!(
        "{} acknowledged puts, all readable on both remaining members; per phase {progress:?}",
        acked.len()
    );
}

//! etcd's JSON gateway on the client port, hit with a plain HTTP/1.1 client against three real
//! `kvd` processes: KV, watch, lease, cluster and maintenance calls, the `/v3beta` alias,
//! etcd's error bodies (unary and streamed), `/version` and `/health`. The expected bodies are
//! what etcd 3.4's gateway answers to the same requests, but for `/version`'s own kvd fields.

mod common;

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use common::Cluster;
use serde_json::{json, Value};

/// A plain HTTP client for one member's client URL.
struct Gw {
    base: String,
    http: reqwest::Client,
}

fn b64(s: &str) -> String {
    B64.encode(s)
}

fn unb64(v: &Value) -> String {
    String::from_utf8(B64.decode(v.as_str().expect("base64 string")).unwrap()).unwrap()
}

impl Gw {
    fn new(c: &Cluster, i: usize) -> Gw {
        Gw {
            base: c.members[i].client_url(),
            http: reqwest::Client::new(),
        }
    }

    /// POSTs a raw body; returns the HTTP status, content type and body.
    async fn post_raw(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .body(body.to_string());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (status, text) = self.post_raw(path, &body.to_string(), &[]).await;
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, v)
    }

    /// POSTs and expects 200.
    async fn ok(&self, path: &str, body: Value) -> Value {
        let (status, v) = self.post(path, body).await;
        assert_eq!(status, 200, "{path}: {v}");
        v
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    /// Opens a streamed call; returns the HTTP status and a reader of its JSON chunks.
    async fn stream(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Chunks) {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .body(body.to_string());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r.send().await.unwrap();
        (
            resp.status().as_u16(),
            Chunks {
                resp,
                buf: Vec::new(),
            },
        )
    }
}

/// The newline-delimited chunks of a streamed response.
struct Chunks {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Chunks {
    /// The next chunk; `None` when the stream ends. A last chunk without a newline (an error
    /// chunk) is returned at the end of the stream.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(n) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=n).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.resp.chunk())
                .await
                .expect("stream chunk within 10s")
                .unwrap();
            match chunk {
                Some(c) => self.buf.extend_from_slice(&c),
                None if self.buf.is_empty() => return None,
                None => {
                    let rest = std::mem::take(&mut self.buf);
                    return Some(serde_json::from_slice(&rest).unwrap());
                }
            }
        }
    }

    async fn result(&mut self) -> Value {
        let c = self.next().await.expect("a chunk");
        c.get("result")
            .unwrap_or_else(|| panic!("not a result chunk: {c}"))
            .clone()
    }
}

fn rev(v: &Value) -> i64 {
    v["header"]["revision"].as_str().unwrap().parse().unwrap()
}

fn unary_error(v: &Value, code: i64, msg: &str) {
    assert_eq!(v, &json!({"error": msg, "message": msg, "code": code}));
}

#[tokio::test]
async fn kv_calls_and_their_errors() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let gw = Gw::new(&c, follower);

    let p = gw
        .ok(
            "/v3/kv/put",
            json!({"key": b64("foo"), "value": b64("bar")}),
        )
        .await;
    let r1 = rev(&p);
    let hdr = &p["header"];
    assert!(hdr["cluster_id"].is_string() && hdr["member_id"].is_string());
    assert!(hdr["raft_term"].is_string());

    let r = gw.ok("/v3/kv/range", json!({"key": b64("foo")})).await;
    assert_eq!(r["count"], "1");
    let kv = &r["kvs"][0];
    assert_eq!(
        kv,
        &json!({"key": b64("foo"), "create_revision": r1.to_string(),
                "mod_revision": r1.to_string(), "version": "1", "value": b64("bar")})
    );

    // Optimistic update: compare by mod revision (enum by name) succeeds once.
    let txn = |modrev: i64| {
        json!({
            "compare": [{"key": b64("foo"), "target": "MOD", "result": "EQUAL",
                         "mod_revision": modrev.to_string()}],
            "success": [{"request_put": {"key": b64("foo"), "value": b64("baz")}}],
            "failure": [{"request_range": {"key": b64("foo")}}],
        })
    };
    let t = gw.ok("/v3/kv/txn", txn(r1)).await;
    assert_eq!(t["succeeded"], true);
    let r2 = rev(&t);
    assert_eq!(r2, r1 + 1);
    assert_eq!(
        t["responses"][0]["response_put"]["header"]["revision"],
        r2.to_string()
    );
    let t = gw.ok("/v3/kv/txn", txn(r1)).await;
    assert!(t.get("succeeded").is_none(), "false is left out: {t}");
    let got = &t["responses"][0]["response_range"]["kvs"][0];
    assert_eq!(unb64(&got["value"]), "baz");

    // Compare by value, with enum numbers (VALUE = 3, EQUAL = 0) as grpc-gateway accepts.
    let t = gw
        .ok(
            "/v3/kv/txn",
            json!({"compare": [{"key": b64("foo"), "target": 3, "result": 0, "value": b64("baz")}],
                   "success": [{"request_delete_range": {"key": b64("foo"), "prev_kv": true}}]}),
        )
        .await;
    assert_eq!(t["succeeded"], true);
    let d = &t["responses"][0]["response_delete_range"];
    assert_eq!(d["deleted"], "1");
    assert_eq!(unb64(&d["prev_kvs"][0]["value"]), "baz");

    // DeleteRange with prev_kv over a prefix.
    for k in ["p/a", "p/b"] {
        gw.ok("/v3/kv/put", json!({"key": b64(k), "value": b64(k)}))
            .await;
    }
    let d = gw
        .ok(
            "/v3/kv/deleterange",
            json!({"key": b64("p/"), "range_end": b64("p0"), "prev_kv": true}),
        )
        .await;
    assert_eq!(d["deleted"], "2");
    let prev: Vec<String> = d["prev_kvs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| unb64(&kv["key"]))
        .collect();
    assert_eq!(prev, ["p/a", "p/b"]);
    let now = rev(&d);

    // Compaction, then a read below it fails as etcd's gateway does.
    let cpt = gw
        .ok("/v3/kv/compaction", json!({"revision": now.to_string()}))
        .await;
    assert!(cpt["header"].is_object());
    let (status, e) = gw
        .post(
            "/v3/kv/range",
            json!({"key": b64("foo"), "revision": r1.to_string()}),
        )
        .await;
    assert_eq!(status, 400);
    unary_error(
        &e,
        11,
        "etcdserver: mvcc: required revision has been compacted",
    );

    // Other errors: empty key, too many ops, undecodable body; the leader's gateway agrees.
    let gl = Gw::new(&c, leader);
    let (status, e) = gl.post("/v3/kv/range", json!({"key": ""})).await;
    assert_eq!(status, 400);
    unary_error(&e, 3, "etcdserver: key is not provided");
    let ops: Vec<Value> = (0..129)
        .map(|_| json!({"request_range": {"key": b64("foo")}}))
        .collect();
    let (status, e) = gl.post("/v3/kv/txn", json!({ "success": ops })).await;
    assert_eq!(status, 400);
    unary_error(&e, 3, "etcdserver: too many operations in txn request");
    let (status, text) = gl.post_raw("/v3/kv/put", "not json", &[]).await;
    assert_eq!(status, 400);
    let e: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(e["code"], 3);
    assert_eq!(e["error"], e["message"]);
    let (status, e) = gl
        .post(
            "/v3/kv/range",
            json!({"key": b64("foo"), "sort_order": "BOGUS"}),
        )
        .await;
    assert_eq!((status, &e["code"]), (400, &json!(3)));

    // Size limits are the gRPC ones: a JSON body larger than axum's 2 MiB default still
    // reaches the service, which refuses it with etcd's error.
    let big = B64.encode(vec![b'x'; 1_600_000]);
    let (status, e) = gl
        .post("/v3/kv/put", json!({"key": b64("big"), "value": big}))
        .await;
    assert_eq!(status, 400);
    unary_error(&e, 3, "etcdserver: request is too large");
    // Over the transport's limit: etcd's gateway gets grpc-go's refusal, 429 and code 8,
    // for a body the gateway decodes and for one announced larger than it reads.
    for n in [2_200_000, 5_000_000] {
        let big = B64.encode(vec![b'x'; n]);
        let (status, e) = gl
            .post("/v3/kv/put", json!({"key": b64("big"), "value": big}))
            .await;
        assert_eq!((status, &e["code"]), (429, &json!(8)), "{n} bytes: {e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.starts_with("grpc: received message larger than max (")
                && msg.ends_with(" vs. 2097152)"),
            "{msg}"
        );
    }
    let v = B64.encode(vec![b'y'; 1_000_000]);
    gl.ok("/v3/kv/put", json!({"key": b64("big"), "value": v}))
        .await;
    let r = gl.ok("/v3/kv/range", json!({"key": b64("big")})).await;
    assert_eq!(r["kvs"][0]["value"].as_str().unwrap().len(), v.len());
    gl.ok("/v3/kv/deleterange", json!({"key": b64("big")}))
        .await;

    // The /v3beta alias, and an empty body as the empty request.
    let r = gl
        .ok(
            "/v3beta/kv/range",
            json!({"key": b64("\0"), "range_end": b64("\0"), "count_only": true}),
        )
        .await;
    assert!(r.get("count").is_none(), "nothing left: {r}");
    let (status, text) = gl.post_raw("/v3/kv/range", "", &[]).await;
    assert_eq!(status, 400);
    assert!(text.contains("etcdserver: key is not provided"));

    // Paths and methods grpc-gateway does not serve.
    assert_eq!(
        gl.get("/v3/kv/range").await,
        (405, "Method Not Allowed\n".into())
    );
    let (status, _) = gl.post_raw("/v3/kv/nothing", "{}", &[]).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn watch_streams_events_as_json() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let gw = Gw::new(&c, (leader + 1) % 3);
    let writer = Gw::new(&c, leader);

    let (status, mut w) = gw
        .stream(
            "/v3/watch",
            &json!({"create_request": {"key": b64("w"), "prev_kv": true}}).to_string(),
            &[],
        )
        .await;
    assert_eq!(status, 200);
    let created = w.result().await;
    assert_eq!(created["created"], true);
    assert!(created.get("watch_id").is_none(), "the first watch id is 0");

    let p1 = writer
        .ok("/v3/kv/put", json!({"key": b64("w"), "value": b64("1")}))
        .await;
    writer
        .ok("/v3/kv/put", json!({"key": b64("w"), "value": b64("2")}))
        .await;
    writer
        .ok("/v3/kv/deleterange", json!({"key": b64("w")}))
        .await;

    let e1 = w.result().await;
    let ev = &e1["events"][0];
    assert!(ev.get("type").is_none(), "PUT is the zero value: {ev}");
    assert_eq!(unb64(&ev["kv"]["value"]), "1");
    assert_eq!(ev["kv"]["mod_revision"], rev(&p1).to_string());
    let e2 = w.result().await;
    assert_eq!(unb64(&e2["events"][0]["prev_kv"]["value"]), "1");
    let e3 = w.result().await;
    let ev = &e3["events"][0];
    assert_eq!(ev["type"], "DELETE");
    assert_eq!(unb64(&ev["prev_kv"]["value"]), "2");
    drop(w);

    // Several requests in one body: a create from history and a progress request.
    let body = format!(
        "{}\n{}",
        json!({"create_request": {"key": b64("w"), "start_revision": rev(&p1).to_string(),
                                  "filters": ["NOPUT"]}}),
        json!({"progress_request": {}})
    );
    let (_, mut w) = gw.stream("/v3beta/watch", &body, &[]).await;
    assert_eq!(w.result().await["created"], true);
    let mut saw_delete = false;
    let mut saw_progress = false;
    while !(saw_delete && saw_progress) {
        let r = w.result().await;
        if r["watch_id"] == "-1" {
            saw_progress = true;
        } else {
            assert_eq!(r["events"][0]["type"], "DELETE", "NOPUT filters puts: {r}");
            saw_delete = true;
        }
    }
}

#[tokio::test]
async fn lease_calls_through_the_gateway() {
    let c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let gw = Gw::new(&c, (leader + 2) % 3);

    let g = gw
        .ok("/v3/lease/grant", json!({"TTL": "60", "ID": "1234"}))
        .await;
    assert_eq!((&g["ID"], &g["TTL"]), (&json!("1234"), &json!("60")));
    let (status, e) = gw
        .post("/v3/lease/grant", json!({"TTL": 60, "ID": 1234}))
        .await;
    assert_eq!(status, 412);
    unary_error(&e, 9, "etcdserver: lease already exists");

    gw.ok(
        "/v3/kv/put",
        json!({"key": b64("leased"), "value": b64("v"), "lease": "1234"}),
    )
    .await;
    let t = gw
        .ok("/v3/lease/timetolive", json!({"ID": "1234", "keys": true}))
        .await;
    assert_eq!(t["grantedTTL"], "60");
    let ttl: i64 = t["TTL"].as_str().unwrap().parse().unwrap();
    assert!((50..=60).contains(&ttl), "{t}");
    assert_eq!(t["keys"], json!([b64("leased")]));

    let l = gw.ok("/v3/lease/leases", json!({})).await;
    assert_eq!(l["leases"], json!([{"ID": "1234"}]));
    let l = gw.ok("/v3/kv/lease/leases", json!({})).await;
    assert_eq!(l["leases"], json!([{"ID": "1234"}]));

    // Keep-alive: one result per request; the stream ends with the request body.
    let (status, mut k) = gw
        .stream("/v3/lease/keepalive", r#"{"ID":"1234"} {"ID":1234}"#, &[])
        .await;
    assert_eq!(status, 200);
    for _ in 0..2 {
        let r = k.result().await;
        assert_eq!((&r["ID"], &r["TTL"]), (&json!("1234"), &json!("60")));
    }
    assert!(k.next().await.is_none());
    // An unknown lease answers TTL 0, which JSON leaves out.
    let (_, mut k) = gw
        .stream("/v3/lease/keepalive", r#"{"ID":"999"}"#, &[])
        .await;
    let r = k.result().await;
    assert_eq!(r["ID"], "999");
    assert!(r.get("TTL").is_none(), "{r}");

    let t = gw.ok("/v3/lease/timetolive", json!({"ID": "999"})).await;
    assert_eq!(t["TTL"], "-1");

    gw.ok("/v3/lease/revoke", json!({"ID": "1234"})).await;
    let r = gw.ok("/v3/kv/range", json!({"key": b64("leased")})).await;
    assert!(r.get("kvs").is_none(), "revoked lease's key is gone: {r}");
    let (status, e) = gw.post("/v3/kv/lease/revoke", json!({"ID": "1234"})).await;
    assert_eq!(status, 404);
    unary_error(&e, 5, "etcdserver: requested lease not found");
}

#[tokio::test]
async fn cluster_maintenance_version_and_health() {
    let mut c = Cluster::start(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let gw = Gw::new(&c, leader);

    // Members publish their names and client URLs through the log just after they start.
    let deadline = Instant::now() + Duration::from_secs(10);
    let l = loop {
        let l = gw.ok("/v3/cluster/member/list", json!({})).await;
        let published = l["members"].as_array().unwrap().iter();
        if published.filter(|m| m.get("clientURLs").is_some()).count() == 3 {
            break l;
        }
        assert!(Instant::now() < deadline, "members never published: {l}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(l["header"].get("revision").is_none(), "{l}");
    let members = l["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    for (i, m) in c.members.iter().enumerate() {
        let found = members
            .iter()
            .find(|x| x["name"] == m.name)
            .expect("listed");
        assert_eq!(found["clientURLs"], json!([m.client_url()]), "member {i}");
        assert_eq!(found["peerURLs"], json!([m.peer_url()]));
        assert!(found["ID"].is_string());
    }

    // Add a learner (retried while the new cluster's links are younger than etcd's health
    // window), then remove it; promoting an unknown member fails as etcd's.
    let peer = format!("http://127.0.0.1:{}", common::free_port());
    let deadline = Instant::now() + Duration::from_secs(15);
    let added = loop {
        let (status, v) = gw
            .post(
                "/v3/cluster/member/add",
                json!({"peerURLs": [peer], "isLearner": true}),
            )
            .await;
        if status == 200 {
            break v;
        }
        assert!(Instant::now() < deadline, "member add: {status} {v}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(added["member"]["isLearner"], true);
    let id = added["member"]["ID"].as_str().unwrap().to_string();
    assert_eq!(added["members"].as_array().unwrap().len(), 4);
    let r = gw
        .ok("/v3/cluster/member/remove", json!({ "ID": id }))
        .await;
    assert_eq!(r["members"].as_array().unwrap().len(), 3);
    let (status, e) = gw
        .post("/v3/cluster/member/promote", json!({"ID": "1"}))
        .await;
    assert_eq!(status, 404);
    unary_error(&e, 5, "etcdserver: member not found");

    let s = gw.ok("/v3/maintenance/status", json!({})).await;
    assert_eq!(s["version"], "3.5.17");
    assert_eq!(s["leader"], s["header"]["member_id"]);
    for f in ["dbSize", "raftIndex", "raftTerm", "raftAppliedIndex"] {
        assert!(
            s[f].as_str().unwrap().parse::<u64>().unwrap() > 0,
            "{f}: {s}"
        );
    }
    assert!(s.get("isLearner").is_none());

    assert_eq!(
        gw.get("/version").await,
        (
            200,
            format!(
                r#"{{"etcdserver":"3.5.17","etcdcluster":"3.5.0","kvd":"{}","kvdLogFormat":{}}}"#,
                kvd::server::version::VERSION,
                kvd::raft::log_format::LOG_FORMAT
            )
        )
    );
    assert_eq!(
        gw.get("/health").await,
        (200, r#"{"health":"true"}"#.into())
    );

    // Without a quorum the survivor loses its leader: /health says so, and require-leader
    // calls fail with etcd's unary and streamed error bodies.
    let survivor = (leader + 1) % 3;
    c.kill(leader);
    c.kill((leader + 2) % 3);
    let gw = Gw::new(&c, survivor);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = gw.get("/health").await;
        if status == 503 {
            assert_eq!(body, "{\"health\":\"false\"}\n");
            break;
        }
        assert!(Instant::now() < deadline, "still healthy without quorum");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // /health fails as soon as a quorum read does; the member gives up its leader two
    // election timeouts after it last heard from it, and only then refuses with "no leader"
    // (before that a read times out).
    let hasleader = [("Grpc-Metadata-hasleader", "true")];
    let text = loop {
        let (status, text) = gw
            .post_raw(
                "/v3/kv/range",
                &json!({"key": b64("a")}).to_string(),
                &hasleader,
            )
            .await;
        assert_eq!(status, 503);
        if !text.contains("request timed out") {
            break text;
        }
        assert!(Instant::now() < deadline, "still a leader without quorum");
    };
    unary_error(
        &serde_json::from_str(&text).unwrap(),
        14,
        "etcdserver: no leader",
    );
    let (status, mut w) = gw
        .stream(
            "/v3/watch",
            &json!({"create_request": {"key": b64("a")}}).to_string(),
            &hasleader,
        )
        .await;
    assert_eq!(status, 503);
    assert_eq!(
        w.next().await.unwrap(),
        json!({"error": {"grpc_code": 14, "http_code": 503, "message": "etcdserver: no leader",
                         "http_status": "Service Unavailable"}})
    );
    assert!(w.next().await.is_none());
}

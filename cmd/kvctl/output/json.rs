//! `-w json`: Go's encoding/json of etcd's gogo-protobuf structs (field names as in the .proto,
//! zero values omitted, bytes in base64, HTML-safe string escaping).
use kvd::proto::etcdserverpb::{
    response_op, DeleteRangeResponse, MemberListResponse, PutResponse, RangeResponse,
    ResponseHeader, StatusResponse, TxnResponse, WatchResponse,
};
use kvd::proto::mvccpb::{Event, KeyValue};

use super::EpHealth;
use crate::gofmt::{base64, duration_string};

/// A JSON string as Go's encoding/json writes it (HTML-safe escaping).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Builds a JSON object field by field, leaving out zero values like `omitempty`.
struct Obj(String);

impl Obj {
    fn new() -> Self {
        Obj(String::from("{"))
    }
    fn raw(&mut self, k: &str, v: &str) -> &mut Self {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push('"');
        self.0.push_str(k);
        self.0.push_str("\":");
        self.0.push_str(v);
        self
    }
    fn num<N: PartialEq + Default + ToString>(&mut self, k: &str, v: N) -> &mut Self {
        if v != N::default() {
            self.raw(k, &v.to_string());
        }
        self
    }
    fn boolean(&mut self, k: &str, v: bool) -> &mut Self {
        if v {
            self.raw(k, "true");
        }
        self
    }
    fn bytes(&mut self, k: &str, v: &[u8]) -> &mut Self {
        if !v.is_empty() {
            self.raw(k, &format!("\"{}\"", base64(v)));
        }
        self
    }
    fn string(&mut self, k: &str, v: &str) -> &mut Self {
        if !v.is_empty() {
            self.raw(k, &json_string(v));
        }
        self
    }
    fn strings(&mut self, k: &str, v: &[String]) -> &mut Self {
        if !v.is_empty() {
            let items: Vec<String> = v.iter().map(|s| json_string(s)).collect();
            self.raw(k, &format!("[{}]", items.join(",")));
        }
        self
    }
    fn list(&mut self, k: &str, items: Vec<String>) -> &mut Self {
        if !items.is_empty() {
            self.raw(k, &format!("[{}]", items.join(",")));
        }
        self
    }
    fn header(&mut self, h: &Option<ResponseHeader>) -> &mut Self {
        if let Some(h) = h {
            self.raw("header", &json_header(h));
        }
        self
    }
    fn done(&mut self) -> String {
        let mut s = std::mem::take(&mut self.0);
        s.push('}');
        s
    }
}

pub(crate) fn json_header(h: &ResponseHeader) -> String {
    Obj::new()
        .num("cluster_id", h.cluster_id)
        .num("member_id", h.member_id)
        .num("revision", h.revision)
        .num("raft_term", h.raft_term)
        .done()
}

fn json_kv(kv: &KeyValue) -> String {
    Obj::new()
        .bytes("key", &kv.key)
        .num("create_revision", kv.create_revision)
        .num("mod_revision", kv.mod_revision)
        .num("version", kv.version)
        .bytes("value", &kv.value)
        .num("lease", kv.lease)
        .done()
}

fn json_event(e: &Event) -> String {
    let mut o = Obj::new();
    o.num("type", e.r#type);
    if let Some(kv) = &e.kv {
        o.raw("kv", &json_kv(kv));
    }
    if let Some(kv) = &e.prev_kv {
        o.raw("prev_kv", &json_kv(kv));
    }
    o.done()
}

/// clientv3's `WatchResponse` struct (Go field names, no omitempty; the header embedded by
/// value, so `{}` when absent).
pub fn json_watch(r: &WatchResponse) -> String {
    let header = r.header.as_ref().map(json_header);
    let events: Vec<String> = r.events.iter().map(json_event).collect();
    format!(
        "{{\"Header\":{},\"Events\":[{}],\"CompactRevision\":{},\"Canceled\":{},\"Created\":{}}}",
        header.as_deref().unwrap_or("{}"),
        events.join(","),
        r.compact_revision,
        r.canceled,
        r.created
    )
}

pub fn json_range(r: &RangeResponse) -> String {
    Obj::new()
        .header(&r.header)
        .list("kvs", r.kvs.iter().map(json_kv).collect())
        .boolean("more", r.more)
        .num("count", r.count)
        .done()
}

pub fn json_put(r: &PutResponse) -> String {
    let mut o = Obj::new();
    o.header(&r.header);
    if let Some(kv) = &r.prev_kv {
        o.raw("prev_kv", &json_kv(kv));
    }
    o.done()
}

pub fn json_del(r: &DeleteRangeResponse) -> String {
    Obj::new()
        .header(&r.header)
        .num("deleted", r.deleted)
        .list("prev_kvs", r.prev_kvs.iter().map(json_kv).collect())
        .done()
}

pub fn json_txn(r: &TxnResponse) -> String {
    let ops = r
        .responses
        .iter()
        .map(|op| {
            let inner = match &op.response {
                Some(response_op::Response::ResponseRange(g)) => {
                    format!("{{\"ResponseRange\":{}}}", json_range(g))
                }
                Some(response_op::Response::ResponsePut(p)) => {
                    format!("{{\"ResponsePut\":{}}}", json_put(p))
                }
                Some(response_op::Response::ResponseDeleteRange(d)) => {
                    format!("{{\"ResponseDeleteRange\":{}}}", json_del(d))
                }
                Some(response_op::Response::ResponseTxn(t)) => {
                    format!("{{\"ResponseTxn\":{}}}", json_txn(t))
                }
                None => "null".to_string(),
            };
            format!("{{\"Response\":{inner}}}")
        })
        .collect();
    Obj::new()
        .header(&r.header)
        .boolean("succeeded", r.succeeded)
        .list("responses", ops)
        .done()
}

pub fn json_member_list(r: &MemberListResponse) -> String {
    let members = r
        .members
        .iter()
        .map(|m| {
            Obj::new()
                .num("ID", m.id)
                .string("name", &m.name)
                .strings("peerURLs", &m.peer_ur_ls)
                .strings("clientURLs", &m.client_ur_ls)
                .boolean("isLearner", m.is_learner)
                .done()
        })
        .collect();
    Obj::new().header(&r.header).list("members", members).done()
}

/// With `fsync`, kvd's extension fields follow under their proto names (zero values omitted,
/// as for every field).
fn json_status(s: &StatusResponse, fsync: bool) -> String {
    let mut o = Obj::new();
    o.header(&s.header)
        .string("version", &s.version)
        .num("dbSize", s.db_size)
        .num("leader", s.leader)
        .num("raftIndex", s.raft_index)
        .num("raftTerm", s.raft_term)
        .num("raftAppliedIndex", s.raft_applied_index)
        .strings("errors", &s.errors)
        .num("dbSizeInUse", s.db_size_in_use)
        .boolean("isLearner", s.is_learner);
    if fsync {
        o.num("kvd_recent_wal_fsyncs", s.kvd_recent_wal_fsyncs)
            .num("kvd_recent_wal_fsync_p99_us", s.kvd_recent_wal_fsync_p99_us);
    }
    o.done()
}

pub fn json_endpoint_status(list: &[(String, StatusResponse)], fsync: bool) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|(ep, s)| {
            format!(
                "{{\"Endpoint\":{},\"Status\":{}}}",
                json_string(ep),
                json_status(s, fsync)
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

pub fn json_endpoint_health(list: &[EpHealth]) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|h| {
            let mut o = Obj::new();
            o.raw("endpoint", &json_string(&h.ep))
                .raw("health", if h.health { "true" } else { "false" })
                .raw("took", &json_string(&duration_string(h.took)))
                .string("error", &h.error);
            o.done()
        })
        .collect();
    format!("[{}]", items.join(","))
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;
    use kvd::proto::etcdserverpb::{Member, ResponseOp};

    #[test]
    fn json_matches_etcdctl() {
        let r = RangeResponse {
            header: hdr(3),
            kvs: vec![kv("foo", "baz", 2, 3, 2)],
            more: false,
            count: 1,
        };
        assert_eq!(
            json_range(&r),
            r#"{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"revision":3,"raft_term":2},"kvs":[{"key":"Zm9v","create_revision":2,"mod_revision":3,"version":2,"value":"YmF6"}],"count":1}"#
        );
        let empty = RangeResponse {
            header: hdr(13),
            ..Default::default()
        };
        assert_eq!(
            json_range(&empty),
            r#"{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"revision":13,"raft_term":2}}"#
        );
        let t = TxnResponse {
            header: hdr(13),
            succeeded: true,
            responses: vec![
                ResponseOp {
                    response: Some(response_op::Response::ResponseRange(RangeResponse {
                        header: Some(ResponseHeader {
                            revision: 12,
                            ..Default::default()
                        }),
                        kvs: vec![kv("a", "1", 5, 5, 1)],
                        more: false,
                        count: 1,
                    })),
                },
                ResponseOp {
                    response: Some(response_op::Response::ResponseDeleteRange(
                        DeleteRangeResponse {
                            header: Some(ResponseHeader {
                                revision: 13,
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )),
                },
            ],
        };
        assert_eq!(
            json_txn(&t),
            r#"{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"revision":13,"raft_term":2},"succeeded":true,"responses":[{"Response":{"ResponseRange":{"header":{"revision":12},"kvs":[{"key":"YQ==","create_revision":5,"mod_revision":5,"version":1,"value":"MQ=="}],"count":1}}},{"Response":{"ResponseDeleteRange":{"header":{"revision":13}}}}]}"#
        );
        let ml = MemberListResponse {
            header: Some(ResponseHeader {
                revision: 0,
                ..hdr(0).unwrap()
            }),
            members: vec![Member {
                id: 3319814642761637952,
                name: "e1".into(),
                peer_ur_ls: vec!["http://127.0.0.1:23800".into()],
                client_ur_ls: vec!["http://127.0.0.1:23790".into()],
                is_learner: false,
            }],
        };
        assert_eq!(
            json_member_list(&ml),
            r#"{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"raft_term":2},"members":[{"ID":3319814642761637952,"name":"e1","peerURLs":["http://127.0.0.1:23800"],"clientURLs":["http://127.0.0.1:23790"]}]}"#
        );
        assert_eq!(json_string("<a&b>\u{1}"), r#""\u003ca\u0026b\u003e\u0001""#);
    }
}

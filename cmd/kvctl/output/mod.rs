//! Output formats of etcdctl 3.4: `simple`, `json` (Go encoding/json of the gogo-protobuf
//! structs: snake_case or camelCase names as in the .proto, zero values omitted, bytes in
//! base64), `table` and `fields`.
use kvd::proto::etcdserverpb::{
    response_op, DeleteRangeResponse, MemberListResponse, PutResponse, RangeResponse,
    StatusResponse, TxnResponse, WatchResponse,
};
use kvd::proto::mvccpb::KeyValue;

mod auth;
mod fields;
mod json;
mod maint;

use crate::error::{CliError, EXIT_BAD_ARGS, EXIT_BAD_FEATURE};
use crate::gofmt::{duration_string, hex_prefixed, humanize_bytes, quote};
use crate::table;
pub use auth::prefix_range_end;
use fields::*;
pub use json::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Simple,
    Json,
    Table,
    Fields,
    Protobuf,
}

impl Format {
    pub fn parse(s: &str) -> Result<Format, CliError> {
        match s {
            "simple" => Ok(Format::Simple),
            "json" => Ok(Format::Json),
            "table" => Ok(Format::Table),
            "fields" => Ok(Format::Fields),
            "protobuf" => Ok(Format::Protobuf),
            _ => Err(CliError::new(EXIT_BAD_FEATURE, "unsupported output format")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Simple => "simple",
            Format::Json => "json",
            Format::Table => "table",
            Format::Fields => "fields",
            Format::Protobuf => "protobuf",
        }
    }
}

/// Text to write, and where: etcdctl writes some results (endpoint health) to stderr.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn out(s: impl Into<Vec<u8>>) -> Self {
        Output {
            stdout: s.into(),
            stderr: Vec::new(),
        }
    }
}

/// One `endpoint health` result (etcdctl's `epHealth`).
#[derive(Debug, Clone)]
pub struct EpHealth {
    pub ep: String,
    pub health: bool,
    pub took: std::time::Duration,
    pub error: String,
}

/// Prints responses in the chosen format.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    pub format: Format,
    pub hex: bool,
    pub value_only: bool,
}

impl Printer {
    pub fn new(format: Format, hex: bool) -> Self {
        Printer {
            format,
            hex,
            value_only: false,
        }
    }

    fn unsupported(&self) -> CliError {
        CliError::new(
            EXIT_BAD_FEATURE,
            format!("{} not supported as output format", self.format.name()),
        )
    }

    /// `get --print-value-only` is only valid with the simple format.
    pub fn set_value_only(&mut self) -> Result<(), CliError> {
        if self.format != Format::Simple {
            return Err(CliError::new(
                EXIT_BAD_ARGS,
                "print-value-only is only for `--write-out=simple`",
            ));
        }
        self.value_only = true;
        Ok(())
    }

    pub fn put(&self, r: &PutResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => self.simple_put(r),
            Format::Json => (json_put(r) + "\n").into_bytes(),
            Format::Fields => fields_put(r).into_bytes(),
            Format::Protobuf => protobuf(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn get(&self, r: &RangeResponse, count_only: bool) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple if count_only => format!("{}\n", r.count).into_bytes(),
            Format::Simple => self.simple_get(r),
            Format::Json => (json_range(r) + "\n").into_bytes(),
            Format::Fields => fields_get(r).into_bytes(),
            Format::Protobuf => protobuf(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn del(&self, r: &DeleteRangeResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => self.simple_del(r),
            Format::Json => (json_del(r) + "\n").into_bytes(),
            Format::Fields => fields_del(r).into_bytes(),
            Format::Protobuf => protobuf(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn txn(&self, r: &TxnResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => self.simple_txn(r),
            Format::Json => (json_txn(r) + "\n").into_bytes(),
            Format::Fields => fields_txn(r).into_bytes(),
            Format::Protobuf => protobuf(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn member_list(&self, r: &MemberListResponse) -> Result<Output, CliError> {
        let (hdr, rows) = member_list_table(r);
        Ok(Output::out(match self.format {
            Format::Simple => rows
                .iter()
                .map(|r| r.join(", ") + "\n")
                .collect::<String>()
                .into_bytes(),
            Format::Json => (json_member_list(r) + "\n").into_bytes(),
            Format::Fields => fields_member_list(r).into_bytes(),
            Format::Protobuf => protobuf(r),
            Format::Table => table::render(&hdr, &rows).into_bytes(),
        }))
    }

    /// `fsync` adds kvd's recent WAL fsync figures (`endpoint status --fsync`); without it the
    /// output is etcdctl's, byte for byte.
    pub fn endpoint_status(
        &self,
        list: &[(String, StatusResponse)],
        fsync: bool,
    ) -> Result<Output, CliError> {
        let (mut hdr, mut rows) = endpoint_status_table(list);
        if fsync {
            hdr.push("recent wal fsync p99");
            for (row, (_, s)) in rows.iter_mut().zip(list) {
                row.push(recent_fsync_p99(s));
            }
        }
        Ok(Output::out(match self.format {
            Format::Simple => rows.iter().map(|r| r.join(", ") + "\n").collect::<String>(),
            Format::Json => json_endpoint_status(list, fsync) + "\n",
            Format::Fields => fields_endpoint_status(list, fsync),
            Format::Protobuf => return Err(self.unsupported()),
            Format::Table => table::render(&hdr, &rows),
        }))
    }

    pub fn endpoint_health(&self, list: &[EpHealth]) -> Result<Output, CliError> {
        Ok(match self.format {
            Format::Simple => Output {
                stdout: Vec::new(),
                stderr: list
                    .iter()
                    .map(|h| {
                        if h.error.is_empty() {
                            format!(
                                "{} is healthy: successfully committed proposal: took = {}\n",
                                h.ep,
                                duration_string(h.took)
                            )
                        } else {
                            format!(
                                "{} is unhealthy: failed to commit proposal: {}\n",
                                h.ep, h.error
                            )
                        }
                    })
                    .collect::<String>()
                    .into_bytes(),
            },
            Format::Json => Output::out(json_endpoint_health(list) + "\n"),
            Format::Fields => Output::out(
                list.iter()
                    .map(|h| {
                        format!(
                            "\"Endpoint\" : {}\n\"Health\" : {}\n\"Took\" : {}\n\"Error\" : {}\n\n",
                            quote(h.ep.as_bytes()),
                            h.health,
                            duration_string(h.took),
                            h.error
                        )
                    })
                    .collect::<String>(),
            ),
            Format::Protobuf => return Err(self.unsupported()),
            Format::Table => {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|h| {
                        vec![
                            h.ep.clone(),
                            h.health.to_string(),
                            duration_string(h.took),
                            h.error.clone(),
                        ]
                    })
                    .collect();
                Output::out(table::render(
                    &["endpoint", "health", "took", "error"],
                    &rows,
                ))
            }
        })
    }

    /// Fails before anything is watched when the format cannot print watch responses.
    pub fn check_watch(&self) -> Result<(), CliError> {
        match self.format {
            Format::Simple | Format::Json => Ok(()),
            _ => Err(self.unsupported()),
        }
    }

    /// etcdctl's `display.Watch`: per event its type, the previous kv (if any) and the kv.
    pub fn watch(&self, r: &WatchResponse) -> Output {
        if self.format == Format::Json {
            return Output::out(json_watch(r) + "\n");
        }
        let mut out = Vec::new();
        for e in &r.events {
            let t = if e.r#type == kvd::proto::mvccpb::event::EventType::Delete as i32 {
                "DELETE"
            } else {
                "PUT"
            };
            out.extend_from_slice(t.as_bytes());
            out.push(b'\n');
            if let Some(p) = &e.prev_kv {
                self.simple_kv(&mut out, p);
            }
            if let Some(kv) = &e.kv {
                self.simple_kv(&mut out, kv);
            }
        }
        Output::out(out)
    }

    fn simple_kv(&self, out: &mut Vec<u8>, kv: &KeyValue) {
        // Keys and values are written as raw bytes, like Go's fmt.Println(string(b)).
        let (k, v) = if self.hex {
            (
                hex_prefixed(&kv.key).into_bytes(),
                hex_prefixed(&kv.value).into_bytes(),
            )
        } else {
            (kv.key.clone(), kv.value.clone())
        };
        if !self.value_only {
            out.extend_from_slice(&k);
            out.push(b'\n');
        }
        out.extend_from_slice(&v);
        out.push(b'\n');
    }

    fn simple_put(&self, r: &PutResponse) -> Vec<u8> {
        let mut out = b"OK\n".to_vec();
        if let Some(kv) = &r.prev_kv {
            self.simple_kv(&mut out, kv);
        }
        out
    }

    fn simple_get(&self, r: &RangeResponse) -> Vec<u8> {
        let mut out = Vec::new();
        for kv in &r.kvs {
            self.simple_kv(&mut out, kv);
        }
        out
    }

    fn simple_del(&self, r: &DeleteRangeResponse) -> Vec<u8> {
        let mut out = format!("{}\n", r.deleted).into_bytes();
        for kv in &r.prev_kvs {
            self.simple_kv(&mut out, kv);
        }
        out
    }

    fn simple_txn(&self, r: &TxnResponse) -> Vec<u8> {
        let mut out = if r.succeeded {
            b"SUCCESS\n".to_vec()
        } else {
            b"FAILURE\n".to_vec()
        };
        for op in &r.responses {
            out.push(b'\n');
            match &op.response {
                Some(response_op::Response::ResponseRange(g)) => out.extend(self.simple_get(g)),
                Some(response_op::Response::ResponsePut(p)) => out.extend(self.simple_put(p)),
                Some(response_op::Response::ResponseDeleteRange(d)) => {
                    out.extend(self.simple_del(d))
                }
                _ => out.extend(format!("unexpected response {op:?}\n").into_bytes()),
            }
        }
        out
    }
}

// ---------------------------------------------------------------- protobuf

/// etcdctl's protobuf output: the marshaled response, raw.
fn protobuf<M: prost::Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

// ---------------------------------------------------------------- tables

pub fn member_list_table(r: &MemberListResponse) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let hdr = vec![
        "ID",
        "Status",
        "Name",
        "Peer Addrs",
        "Client Addrs",
        "Is Learner",
    ];
    let rows = r
        .members
        .iter()
        .map(|m| {
            vec![
                format!("{:x}", m.id),
                if m.name.is_empty() {
                    "unstarted"
                } else {
                    "started"
                }
                .to_string(),
                m.name.clone(),
                m.peer_ur_ls.join(","),
                m.client_ur_ls.join(","),
                m.is_learner.to_string(),
            ]
        })
        .collect();
    (hdr, rows)
}

/// kvd's WAL fsync p99 over the last minute as a Go duration, or "-" when the member did not
/// sync in that time or does not report it (etcd).
pub fn recent_fsync_p99(s: &StatusResponse) -> String {
    if s.kvd_recent_wal_fsyncs == 0 {
        return "-".to_string();
    }
    duration_string(std::time::Duration::from_micros(
        s.kvd_recent_wal_fsync_p99_us,
    ))
}

pub fn endpoint_status_table(
    list: &[(String, StatusResponse)],
) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let hdr = vec![
        "endpoint",
        "ID",
        "version",
        "db size",
        "is leader",
        "is learner",
        "raft term",
        "raft index",
        "raft applied index",
        "errors",
    ];
    let rows = list
        .iter()
        .map(|(ep, s)| {
            let member_id = s.header.as_ref().map(|h| h.member_id).unwrap_or_default();
            vec![
                ep.clone(),
                format!("{member_id:x}"),
                s.version.clone(),
                humanize_bytes(s.db_size.max(0) as u64),
                (s.leader == member_id).to_string(),
                s.is_learner.to_string(),
                s.raft_term.to_string(),
                s.raft_index.to_string(),
                s.raft_applied_index.to_string(),
                s.errors.join(", "),
            ]
        })
        .collect();
    (hdr, rows)
}

#[cfg(test)]
pub(crate) mod testdata {
    use kvd::proto::etcdserverpb::ResponseHeader;
    use kvd::proto::mvccpb::KeyValue;

    pub fn hdr(rev: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: 324952591200643719,
            member_id: 3319814642761637952,
            revision: rev,
            raft_term: 2,
        })
    }

    pub fn kv(k: &str, v: &str, c: i64, m: i64, ver: i64) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: v.into(),
            create_revision: c,
            mod_revision: m,
            version: ver,
            lease: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testdata::*;
    use super::*;
    use kvd::proto::etcdserverpb::ResponseOp;

    #[test]
    fn simple_formats() {
        let p = Printer::new(Format::Simple, false);
        let t = TxnResponse {
            header: hdr(5),
            succeeded: false,
            responses: vec![
                ResponseOp {
                    response: Some(response_op::Response::ResponsePut(PutResponse::default())),
                },
                ResponseOp {
                    response: Some(response_op::Response::ResponseRange(RangeResponse {
                        kvs: vec![kv("a", "1", 1, 1, 1)],
                        ..Default::default()
                    })),
                },
            ],
        };
        assert_eq!(p.txn(&t).unwrap().stdout, b"FAILURE\n\nOK\n\na\n1\n");
        let d = DeleteRangeResponse {
            deleted: 1,
            prev_kvs: vec![kv("k", "v", 1, 1, 1)],
            ..Default::default()
        };
        assert_eq!(p.del(&d).unwrap().stdout, b"1\nk\nv\n");
        let hexp = Printer::new(Format::Simple, true);
        let g = RangeResponse {
            kvs: vec![kv("a", "1", 1, 1, 1)],
            ..Default::default()
        };
        assert_eq!(hexp.get(&g, false).unwrap().stdout, b"\\x61\n\\x31\n");
        let raw = RangeResponse {
            kvs: vec![KeyValue {
                key: b"k\xff".to_vec(),
                value: b"v\x01\xfe".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(p.get(&raw, false).unwrap().stdout, b"k\xff\nv\x01\xfe\n");
        assert!(fields_get(&raw).contains("\"Key\" : \"k\\xff\"\n\"CreateRevision\""));
        let mut vo = Printer::new(Format::Simple, false);
        vo.set_value_only().unwrap();
        assert_eq!(vo.get(&g, false).unwrap().stdout, b"1\n");
        let mut j = Printer::new(Format::Json, false);
        assert_eq!(j.set_value_only().unwrap_err().code, EXIT_BAD_ARGS);
        let tp = Printer::new(Format::Table, false);
        assert_eq!(
            tp.get(&g, false).unwrap_err().msg,
            "table not supported as output format"
        );
    }

    #[test]
    fn status_rows() {
        let s = StatusResponse {
            header: hdr(4),
            version: "3.4.23".into(),
            db_size: 20480,
            leader: 3319814642761637952,
            raft_index: 7,
            raft_term: 2,
            raft_applied_index: 7,
            db_size_in_use: 16384,
            ..Default::default()
        };
        let list = vec![("127.0.0.1:23790".to_string(), s)];
        let p = Printer::new(Format::Simple, false);
        assert_eq!(
            p.endpoint_status(&list, false).unwrap().stdout,
            b"127.0.0.1:23790, 2e1259d415f2a040, 3.4.23, 20 kB, true, false, 2, 7, 7, \n"
        );
        assert_eq!(
            json_endpoint_status(&list, false),
            r#"[{"Endpoint":"127.0.0.1:23790","Status":{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"revision":4,"raft_term":2},"version":"3.4.23","dbSize":20480,"leader":3319814642761637952,"raftIndex":7,"raftTerm":2,"raftAppliedIndex":7,"dbSizeInUse":16384}}]"#
        );
    }
}

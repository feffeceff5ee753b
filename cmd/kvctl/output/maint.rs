//! Output of `alarm list`, `alarm disarm` and `endpoint hashkv`, in etcdctl 3.4's shapes.

use kvd::proto::etcdserverpb::{AlarmResponse, HashKvResponse, ResponseHeader};
use kvd::raft::sm::alarm_set::alarm_text;

use super::fields::fields_hdr;
use super::json::json_header;
use super::{protobuf, Format, Output, Printer};
use crate::error::CliError;
use crate::gofmt::quote;
use crate::table;

impl Printer {
    /// etcdctl's `Alarm` printers: simple prints each alarm as its compact text; json the
    /// response (alarm types by number); fields the header and each alarm; table is refused.
    pub fn alarm(&self, r: &AlarmResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => r
                .alarms
                .iter()
                .map(|a| format!("{}\n", alarm_text(a)))
                .collect::<String>()
                .into_bytes(),
            Format::Json => {
                let mut s = String::from("{");
                if let Some(h) = &r.header {
                    s.push_str(&format!("\"header\":{}", json_header(h)));
                }
                if !r.alarms.is_empty() {
                    if s.len() > 1 {
                        s.push(',');
                    }
                    let items: Vec<String> = r
                        .alarms
                        .iter()
                        .map(|a| {
                            let mut parts = Vec::new();
                            if a.member_id != 0 {
                                parts.push(format!("\"memberID\":{}", a.member_id));
                            }
                            if a.alarm != 0 {
                                parts.push(format!("\"alarm\":{}", a.alarm));
                            }
                            format!("{{{}}}", parts.join(","))
                        })
                        .collect();
                    s.push_str(&format!("\"alarms\":[{}]", items.join(",")));
                }
                (s + "}\n").into_bytes()
            }
            Format::Fields => {
                let mut s = String::new();
                fields_hdr(&mut s, &r.header);
                for a in &r.alarms {
                    s.push_str(&format!(
                        "\"MemberID\" : {}\n\"AlarmType\" : {}\n\n",
                        a.member_id,
                        kvd::raft::sm::alarm_set::type_name(a.alarm)
                    ));
                }
                s.into_bytes()
            }
            Format::Protobuf => protobuf(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    /// etcdctl's `EndpointHashKV` printers.
    pub fn endpoint_hashkv(&self, list: &[(String, HashKvResponse)]) -> Result<Output, CliError> {
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|(ep, r)| vec![ep.clone(), r.hash.to_string()])
            .collect();
        Ok(Output::out(match self.format {
            Format::Simple => rows
                .iter()
                .map(|r| r.join(", ") + "\n")
                .collect::<String>()
                .into_bytes(),
            Format::Json => {
                let items: Vec<String> = list
                    .iter()
                    .map(|(ep, r)| {
                        format!(
                            "{{\"Endpoint\":{},\"HashKV\":{}}}",
                            super::json_string(ep),
                            json_hashkv(r)
                        )
                    })
                    .collect();
                format!("[{}]\n", items.join(",")).into_bytes()
            }
            Format::Fields => {
                let mut s = String::new();
                for (ep, r) in list {
                    fields_hdr(&mut s, &r.header);
                    s.push_str(&format!(
                        "\"Endpoint\" : {}\n\"Hash\" : {}\n\n",
                        quote(ep.as_bytes()),
                        r.hash
                    ));
                }
                s.into_bytes()
            }
            Format::Protobuf => return Err(self.unsupported()),
            Format::Table => table::render(&["endpoint", "hash"], &rows).into_bytes(),
        }))
    }
}

/// etcdctl 3.4's JSON of a HashKV response (its struct has no `hash_revision`).
fn json_hashkv(r: &HashKvResponse) -> String {
    let mut parts = Vec::new();
    let h: &Option<ResponseHeader> = &r.header;
    if let Some(h) = h {
        parts.push(format!("\"header\":{}", json_header(h)));
    }
    if r.hash != 0 {
        parts.push(format!("\"hash\":{}", r.hash));
    }
    if r.compact_revision != 0 {
        parts.push(format!("\"compact_revision\":{}", r.compact_revision));
    }
    format!("{{{}}}", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvd::proto::etcdserverpb::AlarmMember;

    fn hdr() -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 3,
            raft_term: 4,
        })
    }

    fn text(p: &Printer, r: Result<Output, CliError>) -> String {
        let _ = p;
        String::from_utf8(r.unwrap().stdout).unwrap()
    }

    /// The shapes etcdctl 3.4.23 printed for the same responses (compared by hand against kvd
    /// and etcd).
    #[test]
    fn alarm_and_hashkv_print_as_etcdctl() {
        let alarms = AlarmResponse {
            header: hdr(),
            alarms: vec![
                AlarmMember {
                    member_id: 5,
                    alarm: 1,
                },
                AlarmMember {
                    member_id: 0,
                    alarm: 2,
                },
            ],
        };
        let p = Printer::new(Format::Simple, false);
        assert_eq!(
            text(&p, p.alarm(&alarms)),
            "memberID:5 alarm:NOSPACE \nalarm:CORRUPT \n"
        );
        let p = Printer::new(Format::Json, false);
        assert_eq!(
            text(&p, p.alarm(&alarms)),
            "{\"header\":{\"cluster_id\":1,\"member_id\":2,\"revision\":3,\"raft_term\":4},\
             \"alarms\":[{\"memberID\":5,\"alarm\":1},{\"alarm\":2}]}\n"
        );
        assert_eq!(text(&p, p.alarm(&AlarmResponse::default())), "{}\n");
        let p = Printer::new(Format::Table, false);
        assert!(p.alarm(&alarms).is_err());

        let list = vec![(
            "127.0.0.1:2379".to_string(),
            HashKvResponse {
                header: hdr(),
                hash: 1084519789,
                compact_revision: -1,
                hash_revision: 3,
            },
        )];
        let p = Printer::new(Format::Simple, false);
        assert_eq!(
            text(&p, p.endpoint_hashkv(&list)),
            "127.0.0.1:2379, 1084519789\n"
        );
        let p = Printer::new(Format::Json, false);
        assert_eq!(
            text(&p, p.endpoint_hashkv(&list)),
            "[{\"Endpoint\":\"127.0.0.1:2379\",\"HashKV\":{\"header\":{\"cluster_id\":1,\
             \"member_id\":2,\"revision\":3,\"raft_term\":4},\"hash\":1084519789,\
             \"compact_revision\":-1}}]\n"
        );
        let p = Printer::new(Format::Fields, false);
        assert_eq!(
            text(&p, p.endpoint_hashkv(&list)),
            "\"ClusterID\" : 1\n\"MemberID\" : 2\n\"Revision\" : 3\n\"RaftTerm\" : 4\n\
             \"Endpoint\" : \"127.0.0.1:2379\"\n\"Hash\" : 1084519789\n\n"
        );
    }
}

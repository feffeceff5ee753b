//! Output of `alarm list`, `alarm disarm` and `endpoint hashkv`, in etcdctl 3.4's shapes.

use kvd::proto::etcdserverpb::{AlarmResponse, HashKvResponse, ResponseHeader};
use kvd::raft::alarm_set::alarm_text;

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
                        kvd::raft::alarm_set::type_name(a.alarm)
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

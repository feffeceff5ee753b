//! `-w fields`: etcdctl's `"Name" : value` lines.
use kvd::proto::etcdserverpb::{
    response_op, DeleteRangeResponse, MemberListResponse, PutResponse, RangeResponse,
    ResponseHeader, StatusResponse, TxnResponse,
};
use kvd::proto::mvccpb::KeyValue;

use crate::gofmt::quote;

pub(crate) fn fields_hdr(out: &mut String, h: &Option<ResponseHeader>) {
    let h = h.unwrap_or_default();
    out.push_str(&format!(
        "\"ClusterID\" : {}\n\"MemberID\" : {}\n\"Revision\" : {}\n\"RaftTerm\" : {}\n",
        h.cluster_id, h.member_id, h.revision, h.raft_term
    ));
}

fn fields_kv(out: &mut String, pfx: &str, kv: &KeyValue) {
    out.push_str(&format!(
        "\"{pfx}Key\" : {}\n\"{pfx}CreateRevision\" : {}\n\"{pfx}ModRevision\" : {}\n\"{pfx}Version\" : {}\n\"{pfx}Value\" : {}\n\"{pfx}Lease\" : {}\n",
        quote(&kv.key),
        kv.create_revision,
        kv.mod_revision,
        kv.version,
        quote(&kv.value),
        kv.lease
    ));
}

pub fn fields_put(r: &PutResponse) -> String {
    let mut out = String::new();
    fields_hdr(&mut out, &r.header);
    if let Some(kv) = &r.prev_kv {
        fields_kv(&mut out, "Prev", kv);
    }
    out
}

pub fn fields_get(r: &RangeResponse) -> String {
    let mut out = String::new();
    fields_hdr(&mut out, &r.header);
    for kv in &r.kvs {
        fields_kv(&mut out, "", kv);
    }
    out.push_str(&format!("\"More\" : {}\n\"Count\" : {}\n", r.more, r.count));
    out
}

pub fn fields_del(r: &DeleteRangeResponse) -> String {
    let mut out = String::new();
    fields_hdr(&mut out, &r.header);
    out.push_str(&format!("\"Deleted\" : {}\n", r.deleted));
    for kv in &r.prev_kvs {
        fields_kv(&mut out, "Prev", kv);
    }
    out
}

pub fn fields_txn(r: &TxnResponse) -> String {
    let mut out = String::new();
    fields_hdr(&mut out, &r.header);
    out.push_str(&format!("\"Succeeded\" : {}\n", r.succeeded));
    for op in &r.responses {
        match &op.response {
            Some(response_op::Response::ResponseRange(g)) => out.push_str(&fields_get(g)),
            Some(response_op::Response::ResponsePut(p)) => out.push_str(&fields_put(p)),
            Some(response_op::Response::ResponseDeleteRange(d)) => out.push_str(&fields_del(d)),
            other => out.push_str(&format!(
                "\"Unknown\" : {}\n",
                quote(format!("{other:?}").as_bytes())
            )),
        }
    }
    out
}

pub fn fields_member_list(r: &MemberListResponse) -> String {
    let mut out = String::new();
    fields_hdr(&mut out, &r.header);
    for m in &r.members {
        out.push_str(&format!(
            "\"ID\" : {}\n\"Name\" : {}\n",
            m.id,
            quote(m.name.as_bytes())
        ));
        for u in &m.peer_ur_ls {
            out.push_str(&format!("\"PeerURL\" : {}\n", quote(u.as_bytes())));
        }
        for u in &m.client_ur_ls {
            out.push_str(&format!("\"ClientURL\" : {}\n", quote(u.as_bytes())));
        }
        out.push_str(&format!("\"IsLearner\" : {}\n\n", m.is_learner));
    }
    out
}

/// With `fsync`, kvd's recent WAL fsync count and p99 (seconds) follow `Errors`.
pub fn fields_endpoint_status(list: &[(String, StatusResponse)], fsync: bool) -> String {
    let mut out = String::new();
    for (ep, s) in list {
        fields_hdr(&mut out, &s.header);
        let recent = if fsync {
            format!(
                "\"RecentWalFsyncs\" : {}\n\"RecentWalFsyncP99\" : {}\n",
                s.kvd_recent_wal_fsyncs,
                s.kvd_recent_wal_fsync_p99_us as f64 / 1e6
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "\"Version\" : {}\n\"DBSize\" : {}\n\"Leader\" : {}\n\"IsLearner\" : {}\n\"RaftIndex\" : {}\n\"RaftTerm\" : {}\n\"RaftAppliedIndex\" : {}\n\"Errors\" : [{}]\n{recent}\"Endpoint\" : {}\n\n",
            quote(s.version.as_bytes()),
            s.db_size,
            s.leader,
            s.is_learner,
            s.raft_index,
            s.raft_term,
            s.raft_applied_index,
            s.errors.join(" "),
            quote(ep.as_bytes())
        ));
    }
    out
}

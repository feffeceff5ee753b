//! Generated protobuf and gRPC code: etcd's v3 API (same packages and field numbers as etcd)
//! and kvd's internal peer protocol.
#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
pub mod kvdpb {
    tonic::include_proto!("kvdpb");
}

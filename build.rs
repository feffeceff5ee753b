//! Generates the etcd v3 API and the internal peer protocol from `proto/` with protox, so a
//! fresh machine needs no system `protoc`; and, for the JSON gateway, serde impls of the etcd
//! messages in the proto3 JSON mapping that etcd's grpc-gateway uses (proto field names).
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/etcdserverpb/rpc.proto",
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/kvdpb/peer.proto",
        "proto/v3lockpb/v3lock.proto",
        "proto/v3electionpb/v3election.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let descriptors = fds.encode_to_vec();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // prost's decoder has no recursion limit in kvd; this codec bounds nesting first.
        .codec_path("crate::proto::codec::KvdCodec")
        .compile_fds(fds)?;
    // grpc-gateway v1 (etcd 3.4/3.5) marshals with OrigName: `create_revision`, not
    // `createRevision`; its decoder ignores fields it does not know.
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    Ok(())
}

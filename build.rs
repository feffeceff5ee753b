//! Generates the etcd v3 API and the internal peer protocol from `proto/` with protox, so a
//! fresh machine needs no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/etcdserverpb/rpc.proto",
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/kvdpb/peer.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}

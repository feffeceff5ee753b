//! Generates the etcd v3 API and the internal peer protocol from `proto/` with protox, so a
//! fresh machine needs no system `protoc`; and, for the JSON gateway, serde impls of the etcd
//! messages in the proto3 JSON mapping that etcd's grpc-gateway uses (proto field names).
//! Also names the commit the build is made from (`KVD_COMMIT`, see `src/server/version.rs`).
use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    emit_commit();
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
        // Decoded as slices of the received message, not copied out of it: a snapshot's
        // chunks (4 MiB each) and every Raft message travel in these.
        .bytes(".kvdpb.SnapshotChunk")
        .bytes(".kvdpb.RaftBlob")
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

/// Sets `KVD_COMMIT` for the crate: the `KVD_COMMIT` variable if the builder sets one (a build
/// from a source archive, which has no repository), else `git rev-parse --short=12 HEAD`, else
/// "unknown". `KVD_COMMIT_FROM` says which (`env`, `git`, `none`), for tests/version.rs to
/// check a commit from git against the repository.
fn emit_commit() {
    println!("cargo:rerun-if-env-changed=KVD_COMMIT");
    let (commit, from) = match std::env::var("KVD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => (c.trim().to_string(), "env"),
        _ => match git_commit() {
            Some(c) => (c, "git"),
            None => ("unknown".to_string(), "none"),
        },
    };
    println!("cargo:rustc-env=KVD_COMMIT={commit}");
    println!("cargo:rustc-env=KVD_COMMIT_FROM={from}");
}

/// HEAD's commit, and the files whose change means HEAD moved, watched so that the commit
/// does not go stale. Only paths that exist are watched: cargo takes a missing one as changed,
/// which would rerun this script, protos and all, on every build.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD changes on a checkout; the branch it names on a commit or reset. In a worktree
    // HEAD is the worktree's own and the branches are shared, so ask git for both paths.
    let mut watch = vec![git_path("HEAD")?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let loose = git_path(&branch)?;
        if loose.exists() {
            watch.push(loose);
        } else {
            // A packed branch: a commit writes it loose again, into a directory (or a parent
            // of it) that exists now.
            watch.extend(
                loose
                    .ancestors()
                    .skip(1)
                    .find(|d| d.is_dir())
                    .map(Path::to_path_buf),
            );
        }
        watch.extend(git_path("packed-refs"));
    }
    for p in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    Some(commit)
}

/// Where git keeps `name` (`git rev-parse --git-path`), made absolute.
fn git_path(name: &str) -> Option<PathBuf> {
    let p = git(&["rev-parse", "--git-path", name])?;
    let root = std::env::var_os("CARGO_MANIFEST_DIR")?;
    Some(Path::new(&root).join(p))
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (out.status.success() && !s.is_empty()).then(|| s.to_string())
}

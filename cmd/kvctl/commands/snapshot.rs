//! `snapshot save|restore|status`, as etcdctl 3.4 runs them. The file format is etcd's (a
//! bbolt database and a sha256 trailer), so files move between kvd and etcd both ways.

use std::io::Write;
use std::path::{Path, PathBuf};

use kvd::proto::etcdserverpb::SnapshotRequest;
use kvd::server::backup::{self, DbStatus, RestoreOptions};
use sha2::{Digest, Sha256};

use crate::cli::{SnapshotFileArgs, SnapshotRestoreArgs};
use crate::commands::Ctx;
use crate::error::{CliError, EXIT_ERROR, EXIT_INTERRUPTED};
use crate::gofmt::humanize_bytes;
use crate::output::Format;
use crate::table;

fn io_err(e: impl std::fmt::Display) -> CliError {
    CliError::new(EXIT_ERROR, e.to_string())
}

/// Streams a backup from the one endpoint into `FILE.part`, checks its sha256, fsyncs it,
/// renames it to `FILE` and fsyncs the directory, so a failure never leaves a partial file
/// under the name asked for, and a power loss after "saved" does not lose the name.
pub async fn save(ctx: &Ctx, a: SnapshotFileArgs) -> Result<i32, CliError> {
    if a.args.len() != 1 {
        return Err(CliError::bad_args("snapshot save expects one argument"));
    }
    if ctx.global.endpoints.len() != 1 {
        return Err(CliError::new(
            EXIT_INTERRUPTED,
            format!(
                "snapshot must be requested to one selected node, not multiple [{}]",
                ctx.global.endpoints.join(" ")
            ),
        ));
    }
    let path = PathBuf::from(&a.args[0]);
    let part = PathBuf::from(format!("{}.part", a.args[0]));
    let _ = std::fs::remove_file(&part);
    let result = fetch(ctx, &part).await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        // etcdctl exits with ExitInterrupted for any failure of the save, refusals included.
        return Err(CliError::new(EXIT_INTERRUPTED, e.msg));
    }
    kvd::wal::rename_durable(&kvd::wal::RealFs, &part, &path).map_err(io_err)?;
    println!("Snapshot saved at {}", path.display());
    Ok(0)
}

async fn fetch(ctx: &Ctx, part: &Path) -> Result<(), CliError> {
    // No command timeout: a large store takes long to send (etcdctl uses none either).
    let conn = ctx
        .connect(tokio::time::Instant::now() + ctx.global.dial_timeout)
        .await?;
    let mut stream = conn
        .maintenance()
        .snapshot(SnapshotRequest {})
        .await?
        .into_inner();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(part)
        .map_err(io_err)?;
    // Data chunks until one says nothing remains, then one message with their sha256.
    let mut h = Sha256::new();
    let mut data_done = false;
    let mut sha_ok = false;
    while let Some(msg) = stream.message().await? {
        if sha_ok {
            return Err(io_err("snapshot stream: data after the checksum"));
        }
        f.write_all(&msg.blob).map_err(io_err)?;
        if !data_done {
            h.update(&msg.blob);
            data_done = msg.remaining_bytes == 0;
        } else {
            let got: [u8; backup::TRAILER_LEN] = h.clone().finalize().into();
            if got[..] != msg.blob[..] {
                return Err(io_err("snapshot stream: sha256 mismatch"));
            }
            sha_ok = true;
        }
    }
    if !sha_ok {
        return Err(io_err("snapshot stream ended before its checksum"));
    }
    f.sync_all().map_err(io_err)?;
    Ok(())
}

pub fn status(ctx: &Ctx, a: SnapshotFileArgs) -> Result<i32, CliError> {
    if a.args.len() != 1 {
        return Err(CliError::bad_args(
            "snapshot status requires exactly one argument",
        ));
    }
    let format = ctx.printer.format;
    if format == Format::Protobuf {
        return Err(CliError::new(
            crate::error::EXIT_BAD_FEATURE,
            "protobuf not supported as output format",
        ));
    }
    let path = Path::new(&a.args[0]);
    if let Err(e) = std::fs::metadata(path) {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        return Err(io_err(format!("stat {}: {why}", path.display())));
    }
    let st = backup::status(path).map_err(io_err)?;
    print!("{}", render_status(format, &st));
    Ok(0)
}

fn render_status(format: Format, st: &DbStatus) -> String {
    let size = humanize_bytes(st.total_size);
    match format {
        Format::Json => format!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}\n",
            st.hash, st.revision, st.total_key, st.total_size
        ),
        Format::Fields => format!(
            "\"Hash\" : {}\n\"Revision\" : {}\n\"Keys\" : {}\n\"Size\" : {}\n",
            st.hash, st.revision, st.total_key, st.total_size
        ),
        Format::Table => table::render(
            &["hash", "revision", "total keys", "total size"],
            &[vec![
                format!("{:x}", st.hash),
                st.revision.to_string(),
                st.total_key.to_string(),
                size,
            ]],
        ),
        _ => format!(
            "{:x}, {}, {}, {}\n",
            st.hash, st.revision, st.total_key, size
        ),
    }
}

pub fn restore(_ctx: &Ctx, a: SnapshotRestoreArgs) -> Result<i32, CliError> {
    if a.args.len() != 1 {
        return Err(CliError::bad_args(
            "snapshot restore requires exactly one argument",
        ));
    }
    let data_dir = if a.data_dir.is_empty() {
        format!("{}.etcd", a.name)
    } else {
        a.data_dir.clone()
    };
    let o = RestoreOptions {
        file: PathBuf::from(&a.args[0]),
        name: a.name.clone(),
        initial_cluster: a.initial_cluster.clone(),
        initial_cluster_token: a.initial_cluster_token.clone(),
        initial_advertise_peer_urls: a.initial_advertise_peer_urls.clone(),
        data_dir: PathBuf::from(&data_dir),
        wal_dir: Some(PathBuf::from(&a.wal_dir)).filter(|w| !w.as_os_str().is_empty()),
        skip_hash_check: a.skip_hash_check,
    };
    // etcdctl refuses an existing data dir (then WAL dir) before it says anything else.
    if o.data_dir.exists() {
        return Err(io_err(backup::BackupError::DataDirExists(o.data_dir)));
    }
    if let Some(w) = o.wal_dir.as_ref().filter(|w| w.exists()) {
        return Err(io_err(backup::BackupError::WalDirExists(w.clone())));
    }
    eprintln!(
        "restoring snapshot path={} data-dir={data_dir}",
        o.file.display()
    );
    let r = backup::restore(&o).map_err(io_err)?;
    for (id, urls) in &r.members {
        eprintln!(
            "added member cluster-id={:x} added-peer-id={id:x} added-peer-peer-urls={}",
            r.cluster_id,
            urls.join(",")
        );
    }
    eprintln!(
        "restored snapshot path={} data-dir={data_dir} revision={} member-id={:x}",
        o.file.display(),
        r.revision,
        r.member_id
    );
    Ok(0)
}

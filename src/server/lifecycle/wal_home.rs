//! Where a member's write-ahead log lives (`<data-dir>/member/wal`, or etcd's `--wal-dir` for
//! a dedicated disk), and the checks that the log found there is this member's whole log.
//!
//! A member started on a state machine without the log it was built from (the WAL deleted,
//! `--wal-dir` added, dropped or pointed at another member's log) would forget its vote and
//! could vote twice in one term, or append another member's entries to its own state. So:
//!
//! Invariants:
//! - A WAL directory names its member: a `member` file holds the cluster and member ids,
//!   written (fsynced) once the start has found the log to be this member's. A start refuses
//!   a directory that names another member. A directory with segments and no `member` file
//!   (written before this file existed, or moved by hand) is adopted and named.
//! - A start with an empty WAL directory refuses while the default one holds segments (the
//!   log stayed behind), and refuses a log that holds neither a vote nor an entry while the
//!   state machine has applied entries past a restore's starting point ([`check_not_lost`],
//!   before the log is opened and again after): such a member had a log, and it is not here.
//!   A refused start writes nothing to the WAL directory but its lock file.
//! - `--wal-dir` changes only where the segments go: each WAL directory holds one member's
//!   log, locked while the member runs (`member.lock`), so two members never share one.

use std::path::{Path, PathBuf};

use crate::raft::types::LogId;
use crate::server::config::Config;
use crate::server::lifecycle::identity::Identity;
use crate::server::ServerError;
use crate::wal::WalBackend;

const NAME_FILE: &str = "member";
const LOCK_FILE: &str = "member.lock";

/// The WAL directory of the member whose directory is `member_dir` (`<data-dir>/member`).
pub fn wal_dir(cfg: &Config, member_dir: &Path) -> PathBuf {
    cfg.wal_dir
        .clone()
        .unwrap_or_else(|| default_dir(member_dir))
}

fn default_dir(member_dir: &Path) -> PathBuf {
    member_dir.join("wal")
}

/// Checks that `wal` may hold `ident`'s log, creates it if needed and locks it (the lock
/// lasts as long as the returned file). It is named ([`name`]) only once the log is known to
/// be this member's: a refused start leaves at most an empty, unnamed directory.
pub fn claim(
    wal: &Path,
    member_dir: &Path,
    ident: &Identity,
    backend: &WalBackend,
) -> Result<std::fs::File, ServerError> {
    let refuse = |why: String| Err(ServerError::WalMismatch(why));
    let name = name_of(ident.cluster_id, ident.member_id);
    match std::fs::read_to_string(wal.join(NAME_FILE)) {
        Ok(found) if found == name => {}
        Ok(found) => {
            return refuse(format!(
                "the WAL directory {} belongs to cluster/member {}, not to this data dir's {}",
                wal.display(),
                found.trim().replace(' ', "/"),
                name.trim().replace(' ', "/"),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(f) = crate::server::backup::etcd_dir::etcd_wal_file(wal) {
                return refuse(format!(
                    "{} holds etcd's WAL ({}); kvd does not read etcd's files: move the data \
                     with `etcdctl snapshot save` and `kvctl snapshot restore`",
                    wal.display(),
                    f.display()
                ));
            }
            let default = default_dir(member_dir);
            if wal != default && !backend.has_segments(wal)? && backend.has_segments(&default)? {
                return refuse(format!(
                    "this member's log is in {}, but --wal-dir is {}: stop the member, move \
                     the directory's contents there, and start it again",
                    default.display(),
                    wal.display(),
                ));
            }
        }
        Err(e) => return Err(e.into()),
    }
    crate::wal::create_dir_durable(&crate::wal::RealFs, wal)?;
    let lock = std::fs::File::create(wal.join(LOCK_FILE))?;
    // SAFETY: flock on a descriptor this function owns; the lock lasts as long as the file.
    let locked = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lock),
            libc::LOCK_EX | libc::LOCK_NB,
        ) == 0
    };
    if !locked {
        return refuse(format!(
            "the WAL directory {} is in use by another process",
            wal.display()
        ));
    }
    Ok(lock)
}

/// Names `wal` as the log of member `member_id` of cluster `cluster_id`, if it is not named
/// yet.
pub fn name(wal: &Path, cluster_id: u64, member_id: u64) -> std::io::Result<()> {
    if wal.join(NAME_FILE).exists() {
        return Ok(());
    }
    crate::wal::write_file_durable(
        &crate::wal::RealFs,
        &wal.join(NAME_FILE),
        name_of(cluster_id, member_id).as_bytes(),
    )
}

fn name_of(cluster_id: u64, member_id: u64) -> String {
    format!("{cluster_id:x} {member_id:x}\n")
}

/// Refuses a log that holds nothing under a state machine that applied entries a log must have
/// carried (anything past the snapshot a restore starts from).
pub fn check_not_lost(
    wal: &Path,
    log_is_empty: bool,
    applied: Option<LogId>,
) -> Result<(), ServerError> {
    match applied {
        Some(a) if log_is_empty && a != crate::raft::sm::backup::restored_log_id() => {
            Err(ServerError::WalMismatch(format!(
                "the state machine has applied up to index {} but the WAL directory {} holds \
                 no log: it was deleted, or --wal-dir changed; a member without its log could \
                 vote twice, so it does not start",
                a.index,
                wal.display()
            )))
        }
        _ => Ok(()),
    }
}

//! `snapshot restore`: a backup (kvd's or etcd's) becomes the data dir of one member of a new
//! cluster, as `etcdctl snapshot restore` makes one for etcd: new member and cluster ids from
//! the flags, the backup's membership dropped, every key, value, revision, version, lease and
//! the compacted revision kept.
//!
//! # Invariants
//! - Nothing is created until the whole file has been read and checked.
//! - The data dir is assembled under a temporary sibling and renamed into place last, so a
//!   crash leaves either no data dir or a complete one.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::bbolt::Reader;
use crate::mvcc::etcd_format::{parse_rev_key, KEY_BUCKET, LEASE_BUCKET, META_BUCKET};
use crate::mvcc::{entries_from_etcd, Pairs};
use crate::raft::backup::write_restored;
use crate::raft::Member;
use crate::server::config::{parse_initial_cluster, split_urls};
use crate::server::identity;

use super::{has_trailer, BackupError, TRAILER_LEN};

/// etcdctl's `snapshot restore` flags.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub file: PathBuf,
    pub name: String,
    pub initial_cluster: String,
    pub initial_cluster_token: String,
    pub initial_advertise_peer_urls: String,
    pub data_dir: PathBuf,
    pub skip_hash_check: bool,
}

/// What a restore made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub member_id: u64,
    pub cluster_id: u64,
    /// Member id -> peer URLs of the new cluster.
    pub members: BTreeMap<u64, Vec<String>>,
    pub revision: i64,
    pub keys: usize,
}

/// Restores `o.file` into `o.data_dir` (see the module doc).
pub fn restore(o: &RestoreOptions) -> Result<Restored, BackupError> {
    if o.data_dir.exists() {
        return Err(BackupError::DataDirExists(o.data_dir.clone()));
    }
    let flags = |e: crate::server::config::ConfigError| BackupError::Flags(e.0);
    let advertise = split_urls(
        "initial-advertise-peer-urls",
        &o.initial_advertise_peer_urls,
    )
    .map_err(flags)?;
    let cluster =
        parse_initial_cluster(&o.name, Some(&o.initial_cluster), &advertise).map_err(flags)?;
    let ident = identity::new_cluster(&o.name, &advertise, &cluster, &o.initial_cluster_token);

    check_trailer(&o.file, o.skip_hash_check)?;
    let (entries, revision, keys) = read_backup(&o.file)?;

    let part = part_dir(&o.data_dir);
    if part.exists() {
        // Left by a restore that crashed: never renamed, so never used.
        std::fs::remove_dir_all(&part).map_err(BackupError::io(&part))?;
    }
    let member = part.join("member");
    let members: BTreeMap<u64, Member> = ident
        .initial_members
        .iter()
        .map(|(id, urls)| {
            let m = Member {
                peer_urls: urls.clone(),
            };
            (*id, m)
        })
        .collect();
    crate::wal::create_dir_durable(&crate::wal::RealFs, &part).map_err(BackupError::io(&part))?;
    crate::wal::create_dir_durable(&crate::wal::RealFs, &member)
        .map_err(BackupError::io(&member))?;
    write_restored(&member.join("sm"), &members, entries)?;
    identity::store(&member, &ident).map_err(BackupError::io(&member))?;
    std::fs::rename(&part, &o.data_dir).map_err(BackupError::io(&o.data_dir))?;
    if let Some(parent) = o.data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(BackupError::io(parent))?;
    }
    Ok(Restored {
        member_id: ident.member_id,
        cluster_id: ident.cluster_id,
        members: ident.initial_members,
        revision,
        keys,
    })
}

fn part_dir(data_dir: &Path) -> PathBuf {
    let mut s = data_dir.as_os_str().to_owned();
    s.push(".restoring");
    PathBuf::from(s)
}

/// Checks the sha256 trailer as etcdctl does: required unless `skip`, and must match.
fn check_trailer(path: &Path, skip: bool) -> Result<(), BackupError> {
    let mut f = std::fs::File::open(path).map_err(BackupError::io(path))?;
    let len = f.metadata().map_err(BackupError::io(path))?.len();
    if !has_trailer(len) {
        return if skip {
            Ok(())
        } else {
            Err(BackupError::MissingHash)
        };
    }
    let mut h = Sha256::new();
    let mut left = len - TRAILER_LEN as u64;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        f.read_exact(&mut buf[..n]).map_err(BackupError::io(path))?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    let mut want = [0u8; TRAILER_LEN];
    f.read_exact(&mut want).map_err(BackupError::io(path))?;
    let got: [u8; TRAILER_LEN] = h.finalize().into();
    if got != want && !skip {
        return Err(BackupError::HashMismatch {
            expected: go_bytes(&want),
            got: go_bytes(&got),
        });
    }
    Ok(())
}

/// A byte slice as Go's `%v` prints it (etcdctl's messages use it).
fn go_bytes(b: &[u8]) -> String {
    let parts: Vec<String> = b.iter().map(u8::to_string).collect();
    format!("[{}]", parts.join(" "))
}

/// Reads and checks every record: the MVCC entries, the current revision and the key count.
fn read_backup(path: &Path) -> Result<(crate::mvcc::TreeEntries, i64, usize), BackupError> {
    let r = Reader::open(path)?;
    let buckets = r.buckets()?;
    for want in [KEY_BUCKET, META_BUCKET] {
        if !buckets.iter().any(|b| b == want) {
            return Err(BackupError::MissingBucket {
                path: path.to_path_buf(),
                bucket: String::from_utf8_lossy(want).into_owned(),
            });
        }
    }
    let content = |source| BackupError::Content {
        path: path.to_path_buf(),
        source,
    };
    let mut history: Pairs = Vec::new();
    r.for_each(KEY_BUCKET, |k, v| -> Result<(), BackupError> {
        history.push((k.to_vec(), v.to_vec()));
        Ok(())
    })?;
    let mut leases: Pairs = Vec::new();
    if buckets.iter().any(|b| b == LEASE_BUCKET) {
        r.for_each(LEASE_BUCKET, |k, v| -> Result<(), BackupError> {
            leases.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
    }
    // etcd marks a compaction scheduled, then finished; an unfinished one is redone on open,
    // so the newer of the two is the compacted revision.
    let mut compacted: Option<i64> = None;
    r.for_each(META_BUCKET, |k, v| -> Result<(), BackupError> {
        if k == b"scheduledCompactRev" || k == b"finishedCompactRev" {
            let (rev, _) = parse_rev_key(v).map_err(content)?;
            compacted = Some(compacted.map_or(rev.main, |c| c.max(rev.main)));
        }
        Ok(())
    })?;
    let keys = history.len();
    let (entries, revision) = entries_from_etcd(history, leases, compacted).map_err(content)?;
    Ok((entries, revision, keys))
}

//! `snapshot restore`: a backup (kvd's or etcd's) becomes the data dir of one member of a new
//! cluster, as `etcdctl snapshot restore` makes one for etcd: new member and cluster ids from
//! the flags, the backup's membership dropped, every key, value, revision, version, lease and
//! the compacted revision kept.
//!
//! # Invariants
//! - A file without a hash is refused before anything is created. The hash is checked by a
//!   thread of its own while the restore writes under the temporary sibling (below), and is
//!   waited for before the data dir is put in place: a file whose hash fails leaves nothing,
//!   and the hash's error is the one reported, ahead of any error of the content. The
//!   content is checked as it is streamed into the new member's snapshot (memory: the leases
//!   and the keys live with a lease, never the history), and the first error stops the
//!   restore with nothing left.
//! - The data dir is assembled under a temporary sibling and renamed into place last, so a
//!   crash leaves either no data dir or a complete one.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::auth::etcd_buckets::{self, EtcdAuth};
use crate::bbolt::{BoltError, Reader};
use crate::mvcc::etcd::format::{parse_rev_key, KEY_BUCKET, LEASE_BUCKET, META_BUCKET};
use crate::mvcc::{EtcdEntries, MvccError, Pairs, META_TREE};
use crate::raft::sm::backup::write_restored;
use crate::raft::{Member, StoreError};
use crate::server::config::{parse_initial_cluster, split_urls};
use crate::server::lifecycle::identity::{self, Identity};
use crate::wal::{create_dir_durable, rename_durable, RealFs, WalFs};

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
    /// `--wal-dir`: the member's dedicated WAL directory, made empty and named for it (a
    /// restored member starts from its snapshot, with no log).
    pub wal_dir: Option<PathBuf>,
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
    if let Some(w) = o.wal_dir.as_ref().filter(|w| w.exists()) {
        return Err(BackupError::WalDirExists(w.clone()));
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

    let mut hash = HashCheck::start(&o.file, o.skip_hash_check)?;
    let Small {
        leases,
        compacted,
        auth,
    } = hash.first(read_small_buckets(&o.file))?;

    // The engine is sled's, on the real file system: so is everything kvd writes beside it.
    let fs = &RealFs;
    let part = part_dir(&o.data_dir);
    if fs.is_dir(&part) {
        // Left by a restore that crashed: never renamed, so never used.
        fs.remove_dir_all(&part).map_err(BackupError::io(&part))?;
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
    create_dir_durable(fs, &part).map_err(BackupError::io(&part))?;
    create_dir_durable(fs, &member).map_err(BackupError::io(&member))?;
    let content = |source| BackupError::Content {
        path: o.file.clone(),
        source,
    };
    // The history streams from a reader thread; its first error is kept here and stops the
    // write (`SourceFailed`), which then answers with it.
    let mut failure: Option<BackupError> = None;
    let mut entries = EtcdEntries::new(
        BucketFeed::start(&o.file, KEY_BUCKET).map(|r| r.map_err(Feed::Failed)),
        leases,
        compacted,
    );
    let written = write_restored(
        &member.join("sm"),
        &members,
        entries
            .by_ref()
            .map(|r| {
                r.map_err(|e| {
                    failure = Some(match e {
                        Feed::Failed(e) => e,
                        Feed::Content(e) => content(e),
                    });
                    StoreError::SourceFailed
                })
            })
            .chain(
                auth.into_iter()
                    .map(|(k, v)| Ok((META_TREE.to_string(), k, v))),
            ),
    );
    let written = written.map_err(|e| failure.unwrap_or(BackupError::Store(e)));
    if let Err(e) = hash.first(written).and_then(|()| hash.wait()) {
        let _ = fs.remove_dir_all(&part);
        return Err(e);
    }
    let (revision, keys) = (entries.current(), entries.history_len());
    put_in_place(fs, &part, &o.data_dir, &ident)?;
    if let Some(w) = &o.wal_dir {
        create_dir_durable(fs, w).map_err(BackupError::io(w))?;
        crate::server::lifecycle::wal_home::name(w, ident.cluster_id, ident.member_id)
            .map_err(BackupError::io(w))?;
    }
    Ok(Restored {
        member_id: ident.member_id,
        cluster_id: ident.cluster_id,
        members: ident.initial_members,
        revision,
        keys,
    })
}

/// The last steps of a restore, once the member's state machine under `part` is durable: its
/// identity written durably, then `part` renamed to `data_dir` and their directory fsynced.
/// A power loss before the rename is durable leaves no data dir; after it, the whole one.
fn put_in_place(
    fs: &dyn WalFs,
    part: &Path,
    data_dir: &Path,
    ident: &Identity,
) -> Result<(), BackupError> {
    let member = part.join("member");
    identity::store(fs, &member, ident).map_err(BackupError::io(&member))?;
    rename_durable(fs, part, data_dir).map_err(BackupError::io(data_dir))
}

fn part_dir(data_dir: &Path) -> PathBuf {
    let mut s = data_dir.as_os_str().to_owned();
    s.push(".restoring");
    PathBuf::from(s)
}

/// The check of a backup's sha256 trailer, run by a thread beside the restore (see the module
/// doc). Dropping it waits for the thread.
struct HashCheck {
    thread: Option<std::thread::JoinHandle<Result<(), BackupError>>>,
    /// The outcome, when the thread could not be started and the check ran here.
    here: Option<Result<(), BackupError>>,
}

impl HashCheck {
    /// Starts the check. With `skip` nothing is read, as etcdctl's `--skip-hash-check`; a
    /// file without a trailer is refused here, before anything is written, since that takes
    /// no reading.
    fn start(path: &Path, skip: bool) -> Result<HashCheck, BackupError> {
        let done = |r| HashCheck {
            thread: None,
            here: Some(r),
        };
        if skip {
            return Ok(done(Ok(())));
        }
        let len = std::fs::metadata(path)
            .map_err(BackupError::io(path))?
            .len();
        if !has_trailer(len) {
            return Err(BackupError::MissingHash);
        }
        let file = path.to_path_buf();
        Ok(
            match std::thread::Builder::new()
                .name("kvd-restore-hash".into())
                .spawn(move || check_trailer(&file))
            {
                Ok(t) => HashCheck {
                    thread: Some(t),
                    here: None,
                },
                Err(_) => done(check_trailer(path)),
            },
        )
    }

    /// `then`, unless it failed and so did the check: the check's error (a missing or wrong
    /// hash) goes ahead of `then`'s, as when etcdctl checks the hash first.
    fn first<T>(&mut self, then: Result<T, BackupError>) -> Result<T, BackupError> {
        if then.is_err() {
            self.wait()?;
        }
        then
    }

    /// Waits for the check and returns its outcome (a passed check passes again).
    fn wait(&mut self) -> Result<(), BackupError> {
        if let Some(t) = self.thread.take() {
            self.here = Some(
                t.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        match self.here.take() {
            Some(Err(e)) => Err(e),
            passed => {
                self.here = passed;
                Ok(())
            }
        }
    }
}

impl Drop for HashCheck {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Checks the sha256 trailer of a file that has one ([`has_trailer`]) as etcdctl does: the
/// hash of everything before it must match.
fn check_trailer(path: &Path) -> Result<(), BackupError> {
    let mut f = std::fs::File::open(path).map_err(BackupError::io(path))?;
    let len = f.metadata().map_err(BackupError::io(path))?.len();
    if !has_trailer(len) {
        return Err(BackupError::MissingHash);
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
    if got != want {
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
/// One pair of a bucket, or why the bucket could not be read.
type PairResult = Result<(Vec<u8>, Vec<u8>), BackupError>;

/// An error of the streamed history: reading the file, or its content.
enum Feed {
    Failed(BackupError),
    Content(MvccError),
}

impl From<MvccError> for Feed {
    fn from(e: MvccError) -> Self {
        Feed::Content(e)
    }
}

/// A top-level bucket's pairs, in key order, read by a thread into a bounded channel (the
/// bbolt reader walks pages with callbacks; this turns the walk into an iterator without
/// holding the bucket). Dropping it stops the reader.
struct BucketFeed {
    rx: Option<std::sync::mpsc::IntoIter<PairResult>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BucketFeed {
    const DEPTH: usize = 1024;

    fn start(path: &Path, bucket: &'static [u8]) -> BucketFeed {
        let (tx, rx) = std::sync::mpsc::sync_channel(Self::DEPTH);
        let path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("kvd-restore-read".into())
            .spawn(move || {
                /// Why the walk stopped early: the file, or the consumer went away.
                enum Stop {
                    Bolt(BoltError),
                    Gone,
                }
                impl From<BoltError> for Stop {
                    fn from(e: BoltError) -> Self {
                        Stop::Bolt(e)
                    }
                }
                let walk = Reader::open(&path).map_err(Stop::Bolt).and_then(|r| {
                    r.for_each(bucket, |k, v| {
                        tx.send(Ok((k.to_vec(), v.to_vec())))
                            .map_err(|_| Stop::Gone)
                    })
                });
                if let Err(Stop::Bolt(e)) = walk {
                    let _ = tx.send(Err(BackupError::Bolt(e)));
                }
            });
        match thread {
            Ok(t) => BucketFeed {
                rx: Some(rx.into_iter()),
                thread: Some(t),
            },
            Err(e) => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                let _ = tx.send(Err(BackupError::io("restore reader thread")(e)));
                BucketFeed {
                    rx: Some(rx.into_iter()),
                    thread: None,
                }
            }
        }
    }
}

impl Iterator for BucketFeed {
    type Item = PairResult;

    fn next(&mut self) -> Option<Self::Item> {
        self.rx.as_mut()?.next()
    }
}

impl Drop for BucketFeed {
    fn drop(&mut self) {
        // Closing the channel first makes the reader's next send fail, so it stops.
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a backup holds besides its history (all small).
struct Small {
    leases: Pairs,
    /// etcd's compacted revision, if any.
    compacted: Option<i64>,
    /// The auth meta entries from the `auth`, `authRoles` and `authUsers` buckets, checked;
    /// none if the file has none of those buckets (a tool that does not write them).
    auth: Pairs,
}

/// Reads a backup's [`Small`] buckets. Also checks that the buckets a backup must have are
/// there.
fn read_small_buckets(path: &Path) -> Result<Small, BackupError> {
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
    let mut b = EtcdAuth::default();
    for (name, pairs) in b.buckets_mut() {
        if buckets.iter().any(|have| have == name) {
            r.for_each(name, |k, v| -> Result<(), BackupError> {
                pairs.push((k.to_vec(), v.to_vec()));
                Ok(())
            })?;
        }
    }
    let auth = etcd_buckets::from_etcd(&b).map_err(|source| BackupError::Auth {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Small {
        leases,
        compacted,
        auth,
    })
}

#[cfg(test)]
#[path = "restore_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "restore_power_loss_tests.rs"]
mod power_loss_tests;

//! Opening a WAL directory: read every segment, repair a torn tail, refuse
//! corruption and unexplained holes.
//!
//! # What the flusher guarantees (and so what recovery may assume)
//!
//! The flusher appends one batch (records, then its `BatchEnd` marker) and
//! fdatasyncs it before it writes anything else; it creates the next segment
//! only between batches, i.e. after the previous batch's fdatasync. Hence:
//!
//! - a batch is *provably synced* if any byte written after it exists: a
//!   non-zero byte past its own `BatchEnd` (later appends write there; the
//!   zeros of blocks reserved at the segment's creation prove nothing, and
//!   every frame holds a non-zero byte, its type), a
//!   `BatchEnd` of a later batch (`batch_start` beyond the damage), or any
//!   later segment file at all (even one with a torn header: it was created
//!   after the sync);
//! - only the last batch of the last segment can be torn, and its pages
//!   survive or vanish independently, so valid frames (even its own
//!   `BatchEnd`) may follow a damaged one inside it.
//!
//! A bad frame at offset X is a torn tail only if nothing proves X's batch
//! synced; then the segment is truncated to X. Damage in a provably synced
//! region is `Corrupt { file, offset: X }`: the records there were
//! acknowledged and are never dropped. `BatchEnd` markers are matched by
//! `batch_start <= X` rather than by the exact start of X's batch because a
//! repaired torn tail leaves that batch's surviving prefix without a marker,
//! and the next batch starts at X.
//!
//! A segment's blocks are reserved when it is created (zeros, `WalFile::allocate`), so the
//! last segment normally ends in zeros: frames up to X and only zeros from X on is a clean
//! end at X, not a torn tail, and writing resumes at X. Before the flusher starts the next
//! segment it cuts the current one to what it wrote, so only the last segment has such a
//! tail and a zero region in any other segment is damage.
//!
//! Unsynced `unsafe_no_fsync` WALs break the premise; after a power loss they
//! may be refused as corrupt, which is the honest answer.
//!
//! # Holes in the segment sequence
//!
//! Purge unlinks a prefix of segments oldest-first after the `PurgeUpTo` that
//! condemns them is durable, and fsyncs the directory once; the unlinks can
//! reach the disk in any order, so a hole can be left whose older side was
//! condemned too. Those older segments are removed only if the durable purge
//! point (the last `PurgeUpTo` after the hole) covers every entry they hold,
//! and the log after the hole continues from it; otherwise opening fails with
//! `MissingSegment`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::durable::create_dir_durable;
use super::format::{self, Frame, HeaderProblem, FRAME_HEADER_LEN, HEADER_LEN};
use super::fs::{WalFile, WalFs};
use super::locator::{Loc, Locator};
use super::{segment_path, Record, WalError};

/// What the flusher needs to know about one surviving segment.
#[derive(Debug, Clone)]
pub(crate) struct SegmentInfo {
    pub seq: u64,
    /// Highest Entry index written to the segment (None: no entries).
    pub max_entry: Option<u64>,
}

pub(crate) struct Recovered {
    pub records: Vec<Record>,
    /// Where the surviving entries are.
    pub locator: Locator,
    /// Surviving segments, oldest first; the last one is open as `file`.
    pub segments: Vec<SegmentInfo>,
    pub file: Box<dyn WalFile>,
}

fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn io_ctx(e: std::io::Error) -> WalError {
    e.into()
}

/// How the frames of a segment end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tail {
    /// The last valid frame ends here; after it the file ends or holds only zeros.
    Clean(u64),
    /// A torn final batch starts at `at` (`reason`: why the frame there does not parse); its
    /// bytes end at `written` (zeros after that are reserved blocks).
    Torn {
        at: u64,
        written: u64,
        reason: String,
    },
}

/// The result of reading the segments, before anything on disk is changed.
struct Scan {
    records: Vec<Record>,
    locator: Locator,
    segments: Vec<SegmentInfo>,
    /// How the last segment in `segments` ends.
    tail: Tail,
    /// A newest segment whose header never became durable: remove it.
    torn_segment: Option<u64>,
}

/// `reserve`: the bytes to reserve in the last segment (and in a new one).
pub(crate) fn recover(
    fs: &Arc<dyn WalFs>,
    dir: &Path,
    reserve: u64,
) -> Result<Recovered, WalError> {
    let names = match fs.list_dir(dir) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_dir_durable(fs.as_ref(), dir).map_err(io_ctx)?;
            Vec::new()
        }
        Err(e) => return Err(io_ctx(e)),
    };
    let mut seqs: Vec<u64> = names.iter().filter_map(|n| parse_name(n)).collect();
    seqs.sort_unstable();

    let condemned: Vec<u64> = match seqs.windows(2).rposition(|w| w[1] != w[0] + 1) {
        Some(pos) => seqs.drain(..=pos).collect(),
        None => Vec::new(),
    };
    let scan = scan(fs, dir, &seqs)?;
    if let (Some(&newest_old), Some(&first_kept)) = (condemned.last(), seqs.first()) {
        check_hole(
            fs,
            dir,
            &condemned,
            newest_old + 1,
            first_kept,
            &scan.records,
        )?;
        tracing::warn!(
            dir = %dir.display(),
            removed = condemned.len(),
            "wal: removing leftover segments of an interrupted purge"
        );
        for s in &condemned {
            fs.remove_file(&segment_path(dir, *s)).map_err(io_ctx)?;
        }
        fs.sync_dir(dir).map_err(io_ctx)?;
    }
    if let Some(seq) = scan.torn_segment {
        let path = segment_path(dir, seq);
        tracing::warn!(file = %path.display(), "wal: removing segment with a torn header");
        fs.remove_file(&path).map_err(io_ctx)?;
        fs.sync_dir(dir).map_err(io_ctx)?;
    }
    let Scan {
        records,
        locator,
        mut segments,
        tail,
        ..
    } = scan;

    let file = match segments.last() {
        Some(last) => {
            let path = segment_path(dir, last.seq);
            let mut f = fs.open_file(&path).map_err(io_ctx)?;
            match tail {
                Tail::Torn {
                    at: len,
                    written,
                    reason,
                } => {
                    tracing::warn!(
                        file = %path.display(),
                        offset = len,
                        dropped_bytes = written - len,
                        %reason,
                        "wal: repairing torn tail"
                    );
                    f.set_len(len).map_err(io_ctx)?;
                }
                Tail::Clean(end) => f.resume_at(end),
            }
            // Segments written before blocks were reserved, and a cut torn tail, get their
            // reservation here, durable before the first write.
            reserve_blocks(f.as_mut(), reserve);
            f.sync_data().map_err(io_ctx)?;
            f
        }
        None => {
            let f = create_segment(fs, dir, 0, reserve)?;
            segments.push(SegmentInfo {
                seq: 0,
                max_entry: None,
            });
            f
        }
    };
    Ok(Recovered {
        records,
        locator,
        segments,
        file,
    })
}

/// Reads the contiguous segments `seqs` (oldest first) without changing them.
fn scan(fs: &Arc<dyn WalFs>, dir: &Path, seqs: &[u64]) -> Result<Scan, WalError> {
    let mut out = Scan {
        records: Vec::new(),
        locator: Locator::default(),
        segments: Vec::new(),
        tail: Tail::Clean(0),
        torn_segment: None,
    };
    for (i, &seq) in seqs.iter().enumerate() {
        let path = segment_path(dir, seq);
        let data = fs.read_file(&path).map_err(io_ctx)?;
        let later = seqs.get(i + 1).map(|s| segment_path(dir, *s));
        match format::decode_header(&data, seq) {
            Ok(()) => {}
            Err(HeaderProblem::Version(found)) => {
                return Err(WalError::IncompatibleVersion { file: path, found })
            }
            Err(HeaderProblem::SeqMismatch(found)) => {
                return Err(WalError::BadHeader {
                    file: path,
                    reason: format!("header says sequence {found}"),
                })
            }
            // A crash between creating a segment and syncing its header.
            // Only plausible for the newest segment, and only if an older one
            // exists or it is the very first segment: purge never leaves a
            // not-yet-synced segment as the sole survivor.
            Err(HeaderProblem::Garbage(_)) if later.is_none() && (i > 0 || seq == 0) => {
                out.torn_segment = Some(seq);
                break;
            }
            Err(HeaderProblem::Garbage(reason)) => {
                return Err(WalError::BadHeader { file: path, reason })
            }
        }
        let (info, tail) = scan_frames(
            &path,
            &data,
            seq,
            later.as_deref(),
            &mut out.records,
            &mut out.locator,
        )?;
        out.segments.push(info);
        out.tail = tail;
    }
    Ok(out)
}

/// Appends the records of one segment to `records`. Returns the segment's
/// info and how its frames end.
fn scan_frames(
    path: &Path,
    data: &[u8],
    seq: u64,
    later_segment: Option<&Path>,
    records: &mut Vec<Record>,
    locator: &mut Locator,
) -> Result<(SegmentInfo, Tail), WalError> {
    let mut info = SegmentInfo {
        seq,
        max_entry: None,
    };
    let mut pos = HEADER_LEN;
    while pos < data.len() {
        match format::decode_frame(data, pos) {
            Ok((frame, next)) => {
                if let Frame::Record(rec) = frame {
                    if let Record::Entry { index, .. } = rec {
                        info.max_entry = Some(info.max_entry.map_or(index, |m| m.max(index)));
                    }
                    let loc = Loc {
                        seq,
                        offset: pos as u64,
                        len: (next - pos) as u32,
                    };
                    locator.observe(&rec, loc);
                    records.push(rec);
                }
                pos = next;
            }
            Err(reason) => {
                let written = written_end(data);
                if later_segment.is_none() && written <= pos {
                    // Reserved blocks, never written.
                    return Ok((info, Tail::Clean(pos as u64)));
                }
                let proof = match later_segment {
                    Some(p) => Some(format!(
                        "segment {} exists, so this one was fully fdatasynced",
                        p.display()
                    )),
                    None => synced_proof(data, pos),
                };
                if let Some(proof) = proof {
                    return Err(WalError::Corrupt {
                        file: path.to_path_buf(),
                        offset: pos as u64,
                        reason: format!("{reason}; {proof}"),
                    });
                }
                return Ok((
                    info,
                    Tail::Torn {
                        at: pos as u64,
                        written: written as u64,
                        reason,
                    },
                ));
            }
        }
    }
    Ok((info, Tail::Clean(pos as u64)))
}

/// One past the last non-zero byte of `data` (0 if all are zero): nothing was written after
/// it, since every frame holds a non-zero byte (its type).
fn written_end(data: &[u8]) -> usize {
    data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1)
}

/// Offset of the first valid frame at or after `from` and before `written` (the
/// `written_end` of `data`: a frame's type byte is non-zero, so none starts after it),
/// scanning byte by byte.
///
/// Frames are decoded within `written` plus one `BatchEnd`'s length. A `BatchEnd`, the only
/// frame the proof looks at, ends at most that far past the last non-zero byte; a longer
/// frame reaching into the reserved zeros is skipped like damage. Decoding against the whole
/// reservation would checksum up to 64 MiB for every torn byte that looks like a frame header.
fn first_valid_frame(data: &[u8], from: usize, written: usize) -> Option<usize> {
    let view = &data[..data.len().min(written + BATCH_END_FRAME_LEN)];
    (from..written.min(view.len().saturating_sub(FRAME_HEADER_LEN - 1)))
        .find(|&p| format::decode_frame(view, p).is_ok())
}

/// A `BatchEnd` frame: header and its `batch_start` (u64).
const BATCH_END_FRAME_LEN: usize = FRAME_HEADER_LEN + 8;

/// Why the batch holding the bad offset `bad` must have been fdatasynced
/// (see the module docs), or None if it may be the torn final batch.
fn synced_proof(data: &[u8], bad: usize) -> Option<String> {
    let mut p = bad + 1;
    // Once: the zeros reserved after the frames can be most of the segment.
    let written = written_end(data);
    while let Some(off) = first_valid_frame(data, p, written) {
        let (frame, next) = format::decode_frame(data, off).expect("just validated");
        if let Frame::BatchEnd { batch_start } = frame {
            if batch_start as usize > bad {
                return Some(format!("a later batch ends at offset {off}"));
            }
            // The damaged batch's own end marker: anything after it was
            // written by a later batch, after this one's fdatasync.
            return (next < written).then(|| {
                format!(
                    "its batch ends at offset {next} and {} bytes of a later batch follow",
                    written - next
                )
            });
        }
        p = next;
    }
    None
}

/// A hole before segment `first_kept` (the segments from `missing` on are
/// gone): the older `condemned` segments may be removed only if the durable
/// purge point after the hole covers them. See the module docs.
fn check_hole(
    fs: &Arc<dyn WalFs>,
    dir: &Path,
    condemned: &[u64],
    missing: u64,
    first_kept: u64,
    kept_records: &[Record],
) -> Result<(), WalError> {
    let purged = kept_records
        .iter()
        .filter_map(|r| match r {
            Record::PurgeUpTo { index, .. } => Some(*index),
            _ => None,
        })
        .next_back();
    let refuse = |holds: String| WalError::MissingSegment {
        missing: segment_path(dir, missing),
        first_kept: segment_path(dir, first_kept),
        holds,
        purged,
    };
    let first_entry = kept_records
        .iter()
        .filter_map(|r| match r {
            Record::Entry { index, .. } => Some(*index),
            _ => None,
        })
        .min();
    if let Some(first) = first_entry {
        if purged.is_none_or(|p| first > p + 1) {
            return Err(refuse(format!("the log after it starts at entry {first}")));
        }
    }
    for &seq in condemned {
        let path = segment_path(dir, seq);
        let data = fs.read_file(&path).map_err(io_ctx)?;
        if let Err(e) = format::decode_header(&data, seq) {
            return Err(refuse(format!(
                "{} has an unreadable header ({e:?})",
                path.display()
            )));
        }
        let (mut ignored, mut unused) = (Vec::new(), Locator::default());
        let (info, tail) = scan_frames(&path, &data, seq, None, &mut ignored, &mut unused)?;
        if let Tail::Torn {
            at: off, reason, ..
        } = tail
        {
            return Err(refuse(format!(
                "{} is unreadable at offset {off} ({reason})",
                path.display()
            )));
        }
        if let Some(m) = info.max_entry.filter(|m| purged.is_none_or(|p| *m > p)) {
            return Err(refuse(format!("{} holds entry {m}", path.display())));
        }
    }
    Ok(())
}

/// Creates a segment with `reserve` bytes of blocks reserved, and makes its header, its
/// reservation and its directory entry durable, so that records are never written into a
/// file that might vanish.
pub(crate) fn create_segment(
    fs: &Arc<dyn WalFs>,
    dir: &Path,
    seq: u64,
    reserve: u64,
) -> Result<Box<dyn WalFile>, WalError> {
    let path: PathBuf = segment_path(dir, seq);
    let mut f = fs.create_file(&path).map_err(io_ctx)?;
    f.append(&format::encode_header(seq)).map_err(io_ctx)?;
    reserve_blocks(f.as_mut(), reserve);
    f.sync_data().map_err(io_ctx)?;
    fs.sync_dir(dir).map_err(io_ctx)?;
    Ok(f)
}

/// Reserves `len` bytes of `f`'s blocks ([`WalFile::allocate`]). Without the reservation every
/// fdatasync also commits the file's new size, which is slower but just as safe, so a failure
/// (a full disk) is logged and the segment grows by appends.
fn reserve_blocks(f: &mut dyn WalFile, len: u64) {
    if let Err(e) = f.allocate(len) {
        tracing::warn!(error = %e, bytes = len, "wal: cannot reserve the segment's blocks");
    }
}

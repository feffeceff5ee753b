//! Opening a WAL directory: read every segment, repair a torn tail, refuse
//! corruption.
//!
//! Why the torn-tail rule is sound: the flusher writes one batch, fdatasyncs
//! it, and only then writes the next, and it rotates segments only between
//! batches (after the new segment's header and directory entry are synced).
//! So a power loss can damage only the bytes of the single batch that was in
//! flight, at the end of the last non-empty segment. A bad frame at offset X
//! is therefore a torn tail iff no frame of a *later* batch exists after it.
//! Frames of the same batch may legitimately survive after X (pages of the
//! in-flight write survive independently), so a valid frame after X counts
//! as evidence of corruption only if it lies beyond X's own batch: past the
//! `BatchEnd` marker whose `batch_start <= X`, or is a `BatchEnd` whose
//! `batch_start > X`, or is in a later segment file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{self, Frame, HeaderProblem, FRAME_HEADER_LEN, HEADER_LEN};
use super::fs::{WalFile, WalFs};
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
    WalError::Io(e)
}

pub(crate) fn recover(fs: &Arc<dyn WalFs>, dir: &Path) -> Result<Recovered, WalError> {
    let names = match fs.list_dir(dir) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs.create_dir_all(dir).map_err(io_ctx)?;
            // The new directory's own entry must survive too.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs.sync_dir(parent).map_err(io_ctx)?;
            }
            Vec::new()
        }
        Err(e) => return Err(io_ctx(e)),
    };
    let mut seqs: Vec<u64> = names.iter().filter_map(|n| parse_name(n)).collect();
    seqs.sort_unstable();

    // Purge unlinks oldest-first and only a prefix of segments, so a hole in
    // the sequence means an interrupted purge whose unlinks reached the disk
    // out of order: everything before the hole was already condemned.
    if let Some(pos) = seqs.windows(2).rposition(|w| w[1] != w[0] + 1) {
        let (old, rest) = seqs.split_at(pos + 1);
        tracing::warn!(
            dir = %dir.display(),
            removed = old.len(),
            "wal: removing leftover segments of an interrupted purge"
        );
        for s in old {
            fs.remove_file(&segment_path(dir, *s)).map_err(io_ctx)?;
        }
        fs.sync_dir(dir).map_err(io_ctx)?;
        seqs = rest.to_vec();
    }

    let mut records = Vec::new();
    let mut segments: Vec<SegmentInfo> = Vec::new();
    let mut tail_len: Option<usize> = None;
    let mut i = 0;
    while i < seqs.len() {
        let seq = seqs[i];
        let path = segment_path(dir, seq);
        let data = fs.read_file(&path).map_err(io_ctx)?;
        let is_last = i + 1 == seqs.len();
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
            Err(HeaderProblem::Garbage(reason)) if is_last && (i > 0 || seq == 0) => {
                tracing::warn!(file = %path.display(), %reason, "wal: removing torn segment");
                fs.remove_file(&path).map_err(io_ctx)?;
                fs.sync_dir(dir).map_err(io_ctx)?;
                break;
            }
            Err(HeaderProblem::Garbage(reason)) => {
                return Err(WalError::BadHeader { file: path, reason })
            }
        }

        let mut info = SegmentInfo {
            seq,
            max_entry: None,
        };
        let mut pos = HEADER_LEN;
        let mut torn_at = None;
        while pos < data.len() {
            match format::decode_frame(&data, pos) {
                Ok((frame, next)) => {
                    if let Frame::Record(rec) = frame {
                        if let Record::Entry { index, .. } = rec {
                            info.max_entry = Some(info.max_entry.map_or(index, |m| m.max(index)));
                        }
                        records.push(rec);
                    }
                    pos = next;
                }
                Err(reason) => {
                    if let Some(off) = later_batch_evidence(&data, pos) {
                        return Err(WalError::Corrupt {
                            file: path,
                            offset: pos as u64,
                            reason: format!("{reason} (a valid later frame at offset {off})"),
                        });
                    }
                    for later in &seqs[i + 1..] {
                        let lp = segment_path(dir, *later);
                        let ld = fs.read_file(&lp).map_err(io_ctx)?;
                        if let Some(off) = first_valid_frame(&ld, 0) {
                            return Err(WalError::Corrupt {
                                file: path,
                                offset: pos as u64,
                                reason: format!(
                                    "{reason} (a valid frame follows in {} at offset {off})",
                                    lp.display()
                                ),
                            });
                        }
                    }
                    torn_at = Some((pos, reason));
                    break;
                }
            }
        }
        segments.push(info);
        if let Some((pos, reason)) = torn_at {
            tracing::warn!(
                file = %path.display(),
                offset = pos,
                dropped_bytes = data.len() - pos,
                %reason,
                "wal: repairing torn tail"
            );
            let mut f = fs.open_file(&path).map_err(io_ctx)?;
            f.set_len(pos as u64).map_err(io_ctx)?;
            f.sync_data().map_err(io_ctx)?;
            let later = &seqs[i + 1..];
            for s in later {
                fs.remove_file(&segment_path(dir, *s)).map_err(io_ctx)?;
            }
            if !later.is_empty() {
                fs.sync_dir(dir).map_err(io_ctx)?;
            }
            tail_len = Some(pos);
            break;
        }
        tail_len = Some(data.len());
        i += 1;
    }

    let file = match segments.last() {
        Some(last) => {
            let f = fs.open_file(&segment_path(dir, last.seq)).map_err(io_ctx)?;
            debug_assert_eq!(Some(f.size() as usize), tail_len);
            f
        }
        None => {
            let f = create_segment(fs, dir, 0)?;
            segments.push(SegmentInfo {
                seq: 0,
                max_entry: None,
            });
            f
        }
    };
    Ok(Recovered {
        records,
        segments,
        file,
    })
}

/// Creates a segment and makes its header and directory entry durable, so
/// that records are never written into a file that might vanish.
pub(crate) fn create_segment(
    fs: &Arc<dyn WalFs>,
    dir: &Path,
    seq: u64,
) -> Result<Box<dyn WalFile>, WalError> {
    let path: PathBuf = segment_path(dir, seq);
    let mut f = fs.create_file(&path).map_err(io_ctx)?;
    f.append(&format::encode_header(seq)).map_err(io_ctx)?;
    f.sync_data().map_err(io_ctx)?;
    fs.sync_dir(dir).map_err(io_ctx)?;
    Ok(f)
}

/// Offset of the first valid frame at or after `from`, scanning byte by byte.
fn first_valid_frame(data: &[u8], from: usize) -> Option<usize> {
    (from..data.len().saturating_sub(FRAME_HEADER_LEN - 1))
        .find(|&p| format::decode_frame(data, p).is_ok())
}

/// See the module docs: is there a frame from a batch later than the one
/// containing the bad offset `bad`?
fn later_batch_evidence(data: &[u8], bad: usize) -> Option<usize> {
    let mut own_end_seen = false;
    let mut p = bad + 1;
    while let Some(off) = first_valid_frame(data, p) {
        let (frame, next) = format::decode_frame(data, off).expect("just validated");
        match frame {
            _ if own_end_seen => return Some(off),
            Frame::BatchEnd { batch_start } if batch_start as usize > bad => return Some(off),
            Frame::BatchEnd { .. } => own_end_seen = true,
            Frame::Record(_) => {}
        }
        p = next;
    }
    None
}

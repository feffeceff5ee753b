//! On-disk encoding of segment headers and record frames.
//!
//! Everything here is pure (no I/O) so that recovery, the flusher and the
//! tests share one definition of "a valid frame".

use super::Record;

/// First bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"KVDWAL\0\0";
/// Version written into new segments; any other value is refused.
pub const FORMAT_VERSION: u32 = 1;
/// magic (8) + version (4) + sequence (8) + crc (4).
pub const HEADER_LEN: usize = 24;
/// len (4) + type (1) + crc (4).
pub const FRAME_HEADER_LEN: usize = 9;
/// Upper bound on a payload. Besides rejecting absurd records, it keeps the
/// torn-tail scan from believing a garbage length that happens to fit.
pub const MAX_PAYLOAD: usize = 128 << 20;

pub const T_ENTRY: u8 = 1;
pub const T_VOTE: u8 = 2;
pub const T_COMMITTED: u8 = 3;
pub const T_TRUNCATE: u8 = 4;
pub const T_PURGE: u8 = 5;
pub const T_BATCH_END: u8 = 6;

/// A decoded frame: either a user record or the internal end-of-batch marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Record(Record),
    /// Written after the last record of every fsync batch. `batch_start` is
    /// the segment offset of the batch's first frame; recovery uses it to tell
    /// frames of the (possibly torn) final batch from frames of later batches.
    BatchEnd {
        batch_start: u64,
    },
}

pub fn encode_header(seq: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32fast::hash(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

#[derive(Debug, PartialEq, Eq)]
pub enum HeaderProblem {
    /// Looks like torn/garbage bytes (short, wrong magic, bad crc).
    Garbage(String),
    /// A well-formed header for a different format version.
    Version(u32),
    /// Valid header whose sequence disagrees with the file name.
    SeqMismatch(u64),
}

pub fn decode_header(buf: &[u8], expected_seq: u64) -> Result<(), HeaderProblem> {
    if buf.len() < HEADER_LEN {
        return Err(HeaderProblem::Garbage(format!(
            "file is {} bytes, shorter than the {HEADER_LEN}-byte header",
            buf.len()
        )));
    }
    if buf[0..8] != MAGIC {
        return Err(HeaderProblem::Garbage("bad magic".into()));
    }
    // Version is checked before the crc: a future format may lay the rest of
    // its header out differently, and we want to say "incompatible", not
    // "garbage", for a directory written by a newer kvd.
    let version = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    if version != FORMAT_VERSION {
        return Err(HeaderProblem::Version(version));
    }
    let crc = u32::from_le_bytes(buf[20..24].try_into().unwrap());
    if crc32fast::hash(&buf[0..20]) != crc {
        return Err(HeaderProblem::Garbage("header crc mismatch".into()));
    }
    let seq = u64::from_le_bytes(buf[12..20].try_into().unwrap());
    if seq != expected_seq {
        return Err(HeaderProblem::SeqMismatch(seq));
    }
    Ok(())
}

/// Appends one framed record to `out`. Fails only if the payload is too big.
pub fn encode_record(rec: &Record, out: &mut Vec<u8>) -> Result<(), usize> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    let ty = match rec {
        Record::Entry { index, data } => {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(data);
            T_ENTRY
        }
        Record::Vote(d) => {
            out.extend_from_slice(d);
            T_VOTE
        }
        Record::Committed(d) => {
            out.extend_from_slice(d);
            T_COMMITTED
        }
        Record::TruncateAfter { index } => {
            // Fixed 9 bytes so both variants have the same shape.
            out.push(index.is_some() as u8);
            out.extend_from_slice(&index.unwrap_or(0).to_le_bytes());
            T_TRUNCATE
        }
        Record::PurgeUpTo { index, data } => {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(data);
            T_PURGE
        }
    };
    finish_frame(out, start, ty)
}

/// The payload length `encode_record` would produce for `rec`.
pub fn payload_len(rec: &Record) -> usize {
    match rec {
        Record::Entry { data, .. } | Record::PurgeUpTo { data, .. } => 8 + data.len(),
        Record::Vote(d) | Record::Committed(d) => d.len(),
        Record::TruncateAfter { .. } => 9,
    }
}

pub fn encode_batch_end(batch_start: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    out.extend_from_slice(&batch_start.to_le_bytes());
    finish_frame(out, start, T_BATCH_END).expect("8-byte payload");
}

fn finish_frame(out: &mut Vec<u8>, start: usize, ty: u8) -> Result<(), usize> {
    let payload_len = out.len() - start - FRAME_HEADER_LEN;
    if payload_len > MAX_PAYLOAD {
        out.truncate(start);
        return Err(payload_len);
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[ty]);
    h.update(&out[start + FRAME_HEADER_LEN..]);
    let crc = h.finalize();
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    out[start + 4] = ty;
    out[start + 5..start + 9].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Decodes the frame starting at `pos`; returns it and the offset just past it.
/// The error string says why the bytes at `pos` are not a valid frame.
pub fn decode_frame(buf: &[u8], pos: usize) -> Result<(Frame, usize), String> {
    let rest = buf.len().saturating_sub(pos);
    if rest < FRAME_HEADER_LEN {
        return Err(format!("short frame header ({rest} bytes left)"));
    }
    let h = &buf[pos..pos + FRAME_HEADER_LEN];
    let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
    let ty = h[4];
    // Type 0 is never written, so an all-zero region (how torn pages usually
    // look) can never pass as a frame even though crc32("\0") checks are cheap.
    if !(T_ENTRY..=T_BATCH_END).contains(&ty) {
        return Err(format!("invalid record type {ty}"));
    }
    if len > MAX_PAYLOAD {
        return Err(format!("impossible payload length {len}"));
    }
    if len > rest - FRAME_HEADER_LEN {
        return Err(format!(
            "short payload: need {len} bytes, {} left",
            rest - FRAME_HEADER_LEN
        ));
    }
    let crc = u32::from_le_bytes(h[5..9].try_into().unwrap());
    let payload = &buf[pos + FRAME_HEADER_LEN..pos + FRAME_HEADER_LEN + len];
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[ty]);
    hasher.update(payload);
    if hasher.finalize() != crc {
        return Err("crc mismatch".into());
    }
    let frame = decode_payload(ty, payload)
        .ok_or_else(|| format!("malformed payload for record type {ty}"))?;
    Ok((frame, pos + FRAME_HEADER_LEN + len))
}

fn decode_payload(ty: u8, p: &[u8]) -> Option<Frame> {
    let u64_at =
        |b: &[u8]| -> Option<u64> { Some(u64::from_le_bytes(b.get(0..8)?.try_into().ok()?)) };
    let rec = match ty {
        T_ENTRY => Record::Entry {
            index: u64_at(p)?,
            data: p[8..].to_vec(),
        },
        T_VOTE => Record::Vote(p.to_vec()),
        T_COMMITTED => Record::Committed(p.to_vec()),
        T_TRUNCATE => {
            if p.len() != 9 || p[0] > 1 {
                return None;
            }
            let index = u64_at(&p[1..])?;
            Record::TruncateAfter {
                index: (p[0] == 1).then_some(index),
            }
        }
        T_PURGE => Record::PurgeUpTo {
            index: u64_at(p)?,
            data: p[8..].to_vec(),
        },
        T_BATCH_END => {
            if p.len() != 8 {
                return None;
            }
            return Some(Frame::BatchEnd {
                batch_start: u64_at(p)?,
            });
        }
        _ => return None,
    };
    Some(Frame::Record(rec))
}

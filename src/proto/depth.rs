//! A bound on how deep prost may recurse while decoding a message, found without recursion.
//!
//! kvd builds prost without its fixed recursion limit (100 levels): etcd accepts txns nested
//! up to `--max-txn-ops` levels (each level is two messages, `TxnRequest` and `RequestOp`), and
//! the log entry that carries such a txn adds levels of its own, so prost's limit both refused
//! requests etcd answers and refused log entries that a leader had already committed. Without
//! the limit, a hostile frame (deeply nested groups in an unknown field, or a txn nested a
//! million times) would overflow the stack instead, so every decode of untrusted bytes first
//! asks [`within`] whether the nesting stays under a bound the decoder's stack can take
//! (docs/decisions/0010-prost-without-recursion-limit.md).
//!
//! The scan knows no schema. It follows every length-delimited field that parses as protobuf
//! as if it were a message, and every group, and reports the deepest level it reached. That is
//! an upper bound on prost's recursion: prost descends only into fields that are messages or
//! groups, and stops at the first malformed byte, where the scan stops too. Each byte is read
//! once, so the cost is linear in the message size; a message shorter than the bound cannot
//! reach it (each level costs at least one byte) and is not scanned at all.

/// Deepest nesting (in messages and groups below the top-level message) that a client
/// request may have: 128 txn levels (etcd's default `--max-txn-ops`) take 257, plus room for a
/// txn's compares and one op.
pub const REQUEST_LIMIT: usize = 290;

/// Deepest nesting a replicated log entry may have: a request at [`REQUEST_LIMIT`] plus the
/// messages that wrap it on its way (`ForwardRequest`, `InternalRequest`). A constant, never a
/// setting: every member must decode the same entries the same way.
pub const LOG_LIMIT: usize = REQUEST_LIMIT + 8;

/// Whether prost's recursion while decoding `buf` stays within `limit` levels.
pub fn within(buf: &[u8], limit: usize) -> bool {
    buf.len() <= limit || max_depth(buf, limit) <= limit
}

/// One open level: a length-delimited payload read as a message (`group: None`), or a group
/// opened by that field number. `end` is where the innermost enclosing payload ends.
#[derive(Clone, Copy)]
struct Level {
    end: usize,
    group: Option<u64>,
}

/// The deepest level reached, stopping early once it passes `limit`.
fn max_depth(buf: &[u8], limit: usize) -> usize {
    let mut stack: Vec<Level> = Vec::new();
    let mut pos = 0usize;
    let mut deepest = 0usize;
    loop {
        let end = stack.last().map_or(buf.len(), |l| l.end);
        let step = if pos == end {
            match stack.last() {
                None => return deepest,
                Some(Level { group: None, .. }) => {
                    stack.pop();
                    continue;
                }
                // A group left open at the end of its payload: malformed there.
                Some(Level { group: Some(_), .. }) => Err(()),
            }
        } else {
            field(buf, pos, end, stack.last())
        };
        match step {
            Ok(Step::Skip(next)) => pos = next,
            Ok(Step::Enter(level, next)) => {
                stack.push(level);
                deepest = deepest.max(stack.len());
                if deepest > limit {
                    return deepest;
                }
                pos = next;
            }
            Ok(Step::EndGroup(next)) => {
                stack.pop();
                pos = next;
            }
            Err(()) => match unwind(&mut stack) {
                Some(resume) => pos = resume,
                None => return deepest,
            },
        }
    }
}

/// After a malformed byte: drop the levels inside the innermost payload and that payload
/// itself (it is then a plain bytes field), and say where its parent resumes.
fn unwind(stack: &mut Vec<Level>) -> Option<usize> {
    while let Some(level) = stack.pop() {
        if level.group.is_none() {
            return Some(level.end);
        }
    }
    None
}

enum Step {
    Skip(usize),
    Enter(Level, usize),
    EndGroup(usize),
}

/// Reads the field at `pos` (which is before `end`).
fn field(buf: &[u8], pos: usize, end: usize, open: Option<&Level>) -> Result<Step, ()> {
    let (key, pos) = varint(buf, pos, end)?;
    let number = key >> 3;
    if number == 0 || number > u64::from(u32::MAX >> 3) {
        return Err(());
    }
    let skip = |n: usize| pos.checked_add(n).filter(|&p| p <= end).ok_or(());
    match key & 7 {
        0 => Ok(Step::Skip(varint(buf, pos, end)?.1)),
        1 => Ok(Step::Skip(skip(8)?)),
        2 => {
            let (len, pos) = varint(buf, pos, end)?;
            let len = usize::try_from(len).map_err(|_| ())?;
            let next = pos.checked_add(len).filter(|&p| p <= end).ok_or(())?;
            if len == 0 {
                Ok(Step::Skip(next))
            } else {
                let level = Level {
                    end: next,
                    group: None,
                };
                Ok(Step::Enter(level, pos))
            }
        }
        3 => {
            let level = Level {
                end,
                group: Some(number),
            };
            Ok(Step::Enter(level, pos))
        }
        4 => match open {
            Some(Level {
                group: Some(field), ..
            }) if *field == number => Ok(Step::EndGroup(pos)),
            _ => Err(()),
        },
        5 => Ok(Step::Skip(skip(4)?)),
        _ => Err(()),
    }
}

/// A base-128 varint of at most 10 bytes, as prost reads it.
fn varint(buf: &[u8], mut pos: usize, end: usize) -> Result<(u64, usize), ()> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let b = *buf.get(pos).filter(|_| pos < end).ok_or(())?;
        pos += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok((value, pos));
        }
    }
    Err(())
}

#[cfg(test)]
#[path = "depth_tests.rs"]
pub(crate) mod tests;

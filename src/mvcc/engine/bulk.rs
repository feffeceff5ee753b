//! Writing a whole store's worth of batches into an engine (a load, a defragmentation's
//! copy) in bounded memory.
//!
//! # Invariant
//! - At most [`FLUSH_EVERY`] bytes of keys and values are written between two flushes. The
//!   engine writes its log on threads of its own, each holding a buffer until the disk has
//!   it, and nothing holds a writer back while the disk is behind: a bulk write faster than the
//!   disk would otherwise queue its whole content in those buffers (measured: a new member's
//!   peak RSS during a 1M-key catch-up went from 0.97-1.08 GiB to 454-472 MiB; see
//!   docs/benchmarks.md, "A new member catching up at 1M keys"). A flush waits for the queue
//!   to drain, so the writer goes at the disk's pace.

use super::{Engine, WriteBatch};
use crate::mvcc::error::MvccError;

/// Bytes of keys and values written between two flushes.
pub const FLUSH_EVERY: usize = 16 << 20;

/// Writes batches into `engine`, flushing every [`FLUSH_EVERY`] bytes (see the module doc).
pub struct BulkWriter<'e, E: Engine> {
    engine: &'e E,
    unflushed: usize,
}

impl<'e, E: Engine> BulkWriter<'e, E> {
    pub fn new(engine: &'e E) -> Self {
        BulkWriter {
            engine,
            unflushed: 0,
        }
    }

    /// Writes `batch`, then flushes if [`FLUSH_EVERY`] bytes were written since the last flush.
    pub fn write(&mut self, batch: WriteBatch<'_>) -> Result<(), MvccError> {
        self.unflushed += batch.bytes();
        self.engine.write(batch)?;
        if self.unflushed >= FLUSH_EVERY {
            self.engine.flush()?;
            self.unflushed = 0;
        }
        Ok(())
    }
}

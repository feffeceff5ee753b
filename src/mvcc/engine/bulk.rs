//! Writing a whole store's worth of batches into an engine (a load, a defragmentation's
//! copy) in bounded memory.
//!
//! # Invariant
//! - At most [`FLUSH_EVERY`] bytes of keys and values are written between two flushes. The
//!   engine writes its log on threads of its own, each holding a buffer until the disk has
//!   it, and nothing holds a writer back while the disk is behind: a bulk write faster than the
//!   disk would otherwise queue its whole content in those buffers (docs/benchmarks.md,
//!   "Bulk writes flushed every 16 MiB"). A flush waits for the queue to drain, so the writer
//!   goes at the disk's pace.

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

#[cfg(test)]
mod tests {
    use super::super::mem::MemEngine;
    use super::super::Tree;
    use super::*;

    /// A batch of 1 MiB of values less its key: 16 batches make [`FLUSH_EVERY`] with the keys.
    fn batch(i: u64) -> WriteBatch<'static> {
        let mut b = WriteBatch::default();
        b.put(Tree::Rev, i.to_be_bytes().to_vec(), vec![0; (1 << 20) - 8]);
        b
    }

    /// What a crash would keep: the batches flushed so far.
    fn durable(e: &MemEngine) -> usize {
        e.crash().iter(Tree::Rev).count()
    }

    #[test]
    fn a_bulk_write_is_flushed_every_16_mib() {
        let e = MemEngine::default();
        let mut w = BulkWriter::new(&e);
        for i in 0..34 {
            w.write(batch(i)).unwrap();
            if [14, 15, 16, 31, 33].contains(&i) {
                // Flushed once 16 batches (16 MiB) were written since the last flush.
                assert_eq!(durable(&e), (i as usize + 1) / 16 * 16, "after batch {i}");
            }
        }
    }
}

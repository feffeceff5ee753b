//! Which file system a member's WAL lives on, and with which options.
//!
//! Production always uses the default: the real file system and an fdatasync per batch (the
//! flags cannot change it). Whole-node power-loss tests put a `SimFs` (test builds only) here so
//! a member running in-process (`server::run`) keeps its WAL in simulated storage that can lose
//! power; nothing else about the member changes.

use std::path::Path;
use std::sync::Arc;

use super::{RealFs, Record, Wal, WalError, WalFs, WalOptions};

#[derive(Clone, Default)]
pub struct WalBackend {
    /// `None`: the real file system.
    pub fs: Option<Arc<dyn WalFs>>,
    pub options: WalOptions,
}

impl std::fmt::Debug for WalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalBackend")
            .field("simulated", &self.fs.is_some())
            .field("options", &self.options)
            .finish()
    }
}

impl WalBackend {
    /// Opens (recovering) the WAL in `dir` on this backend.
    pub fn open(&self, dir: &Path) -> Result<(Wal, Vec<Record>), WalError> {
        Wal::open_with_fs(self.file_system(), dir, self.options.clone())
    }

    fn file_system(&self) -> Arc<dyn WalFs> {
        self.fs.clone().unwrap_or_else(|| Arc::new(RealFs))
    }

    /// Whether `dir` holds WAL segments on this backend (no when it does not exist).
    pub fn has_segments(&self, dir: &Path) -> std::io::Result<bool> {
        match self.file_system().list_dir(dir) {
            Ok(names) => Ok(names.iter().any(|n| n.ends_with(".wal"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

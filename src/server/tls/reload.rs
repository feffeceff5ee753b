//! The member's own certificate and key, re-read whenever their files change.
//!
//! One [`CertFiles`] serves both as the servers' certificate ([`ResolvesServerCert`]) and as the
//! client certificate this member presents when it dials a peer ([`ResolvesClientCert`]).
//! Each handshake stats the two files (two `stat` calls, no reads while they are unchanged).
//!
//! Invariants:
//! - A handshake always gets a certificate: the last one that loaded (and whose key matched
//!   it). A pair that fails to load, for instance the certificate replaced before its key, is
//!   logged once per change of the files and retried at the next handshake.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::sync::LockExt;

use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

use super::files::{self, Stamp};
use super::TlsError;

pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<State>,
}

struct State {
    /// Stamps of (cert, key) when `current` was loaded.
    loaded: Vec<Stamp>,
    current: Arc<CertifiedKey>,
    /// Stamps at the last failed load, so that it is logged once.
    failed: Option<Vec<Stamp>>,
}

impl fmt::Debug for CertFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = files::certs(cert)?;
    let key_der = files::key(key)?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key_der, &provider).map_err(|source| TlsError::Invalid {
        path: cert.to_path_buf(),
        source,
    })
}

impl CertFiles {
    /// Loads the pair now: a member does not start with files it cannot use.
    pub fn open(cert: PathBuf, key: PathBuf) -> Result<CertFiles, TlsError> {
        let loaded = files::stamps(&[&cert, &key]);
        let current = Arc::new(load(&cert, &key)?);
        Ok(CertFiles {
            cert,
            key,
            state: Mutex::new(State {
                loaded,
                current,
                failed: None,
            }),
        })
    }

    /// The certificate to present now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let now = files::stamps(&[&self.cert, &self.key]);
        let mut st = self.state.lock_or_recover();
        if now != st.loaded && st.failed.as_ref() != Some(&now) {
            match load(&self.cert, &self.key) {
                Ok(k) => {
                    tracing::info!(cert = %self.cert.display(), "reloaded TLS certificate");
                    st.current = Arc::new(k);
                    st.loaded = now;
                    st.failed = None;
                }
                Err(e) => {
                    tracing::warn!("cannot reload TLS certificate, keeping the previous one: {e}");
                    st.failed = Some(now);
                }
            }
        }
        st.current.clone()
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for CertFiles {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

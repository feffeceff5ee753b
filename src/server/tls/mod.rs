//! TLS for the client and peer listeners and for dialing peers, with rustls.
//!
//! - [`files`]: PEM files (certificates, keys, CAs, CRLs) and the stamps that tell a changed
//!   file from an unchanged one.
//! - [`reload`]: the member's own certificate, re-read when its files change, for the servers
//!   and for dialing peers.
//! - [`verify`]: verifying the certificates others present (CA and CRL re-read when they
//!   change; etcd's allowed CN and host name for peers).
//! - [`acceptor`]: the TLS listeners' connections, each carrying the verified client identity.
//! - [`auto`]: `--auto-tls` and `--peer-auto-tls` self-signed certificates.
//! - [`material`]: everything above built from the configuration at start.
//!
//! Invariants:
//! - Nothing is read from disk only once: a handshake uses the files as they are now (checked
//!   by their stamps), so replacing certificates on disk takes effect for new connections
//!   without a restart, as etcd reads them per handshake. A file that fails to load keeps the
//!   last good version in use, and the failure is logged once per change.
//! - A listener configured with a trusted CA refuses, during the handshake, every client whose
//!   certificate that CA does not verify (or the CRL revokes): no request of such a client
//!   reaches a handler.

pub mod acceptor;
pub mod auto;
pub mod files;
pub mod material;
pub mod reload;
pub mod verify;

use std::path::PathBuf;

/// Why TLS material could not be loaded or built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("open {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no private key found")]
    NoKey { path: PathBuf },
    #[error("{path}: {source}")]
    Invalid {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{path}: no valid CA certificate found")]
    NoCa { path: PathBuf },
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls: client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("client-cert-auth is on but no trusted CA file is configured to verify clients")]
    ClientCertAuthWithoutCa,
    #[error("auto-tls: cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("auto-tls: cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

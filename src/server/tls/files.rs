//! Reading PEM files, and telling whether a file changed since it was read.
//!
//! A [`Stamp`] is (inode, size, mtime): replacing a file by rename changes the inode, writing
//! it in place changes mtime (nanoseconds on Linux) and usually size, so either way of
//! rotating certificates is noticed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use super::TlsError;

/// What identifies one version of a file; `None` fields when it cannot be stat'ed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp(Option<(u64, u64, i64, i64)>);

impl Stamp {
    pub fn of(path: &Path) -> Stamp {
        Stamp(
            std::fs::metadata(path)
                .ok()
                .map(|m| (m.ino(), m.len(), m.mtime(), m.mtime_nsec())),
        )
    }
}

/// The stamps of several files, compared together.
pub fn stamps(paths: &[&PathBuf]) -> Vec<Stamp> {
    paths.iter().map(|p| Stamp::of(p)).collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file, in order (a chain: the end entity first).
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey {
            path: path.to_path_buf(),
        })
}

/// A root store of every CA certificate in a PEM file.
pub fn roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(certs(path)?);
    if added == 0 {
        return Err(TlsError::NoCa {
            path: path.to_path_buf(),
        });
    }
    Ok(store)
}

/// Every CRL in a file, PEM or (as etcd also accepts) one DER-encoded list.
pub fn crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let data = read(path)?;
    let pem: Vec<_> = rustls_pemfile::crls(&mut data.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if !pem.is_empty() {
        return Ok(pem);
    }
    Ok(vec![CertificateRevocationListDer::from(data)])
}

/// The subject's first CommonName of a DER certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

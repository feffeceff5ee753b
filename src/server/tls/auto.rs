//! `--auto-tls` and `--peer-auto-tls`: a self-signed certificate generated at start, as etcd's
//! `transport.SelfCert` does, in `<data-dir>/fixtures/client` or `<data-dir>/fixtures/peer`
//! (`cert.pem`, `key.pem`), valid for the hosts of the listen URLs.
//!
//! Invariants:
//! - An existing pair is reused (etcd returns early when both files exist), so a restarted
//!   member keeps its certificate.
//! - The key file is written with mode 0600 before its contents.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::TlsError;

/// Where a generated pair lives: (cert, key).
pub fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("cert.pem"), dir.join("key.pem"))
}

fn write(path: &Path, data: &str, mode: u32) -> Result<(), TlsError> {
    let werr = |source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(werr)?;
    f.write_all(data.as_bytes()).map_err(werr)?;
    f.sync_all().map_err(werr)
}

/// The pair in `dir`, generated unless both files exist. `hosts` are the host names and IP
/// addresses the certificate is valid for.
pub fn self_cert(
    dir: &Path,
    hosts: &[String],
    validity_years: u32,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let (cert, key) = paths(dir);
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "kvd");
    let now = x509_parser::time::ASN1Time::now().to_datetime();
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + Duration::from_secs(365 * 24 * 3600 * u64::from(validity_years));
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let kp = rcgen::KeyPair::generate()?;
    let c = params.self_signed(&kp)?;
    write(&key, &kp.serialize_pem(), 0o600)?;
    write(&cert, &c.pem(), 0o644)?;
    tracing::info!(cert = %cert.display(), "generated a self-signed certificate (auto TLS)");
    Ok((cert, key))
}

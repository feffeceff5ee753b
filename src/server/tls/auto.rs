//! `--auto-tls` and `--peer-auto-tls`: a self-signed certificate generated at start, as etcd's
//! `transport.SelfCert` does, in `<data-dir>/fixtures/client` or `<data-dir>/fixtures/peer`
//! (`cert.pem`, `key.pem`), valid for the hosts of the listen URLs.
//!
//! Invariants:
//! - An existing pair is reused (etcd returns early when both files exist), so a restarted
//!   member keeps its certificate.
//! - The key file is created with mode 0600, before its contents are written.
//! - Each file is written durably (`wal::write_file_durable_with_mode`: temporary, fsync,
//!   rename, directory fsync), key first: a power loss leaves no pair, the key alone (both are
//!   generated again), or the whole pair, never an empty or partial file under its name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::TlsError;
use crate::wal::{create_dir_durable, write_file_durable_with_mode, RealFs};

/// Where a generated pair lives: (cert, key).
pub fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("cert.pem"), dir.join("key.pem"))
}

fn write(path: &Path, data: &str, mode: u32) -> Result<(), TlsError> {
    write_file_durable_with_mode(&RealFs, path, data.as_bytes(), mode).map_err(|source| {
        TlsError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
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
    create_dir_durable(&RealFs, dir).map_err(|source| TlsError::Write {
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_generated_key_is_private_no_temporary_stays_and_the_pair_is_reused() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("fixtures/peer");
        let (cert, key) = self_cert(&dir, &["localhost".to_string()], 1).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["cert.pem", "key.pem"]);
        let before = std::fs::read(&cert).unwrap();
        self_cert(&dir, &["localhost".to_string()], 1).unwrap();
        assert_eq!(std::fs::read(&cert).unwrap(), before);
    }
}

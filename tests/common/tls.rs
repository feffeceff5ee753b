//! Certificates for TLS tests, made with rcgen at run time (no fixture files), and clients
//! that speak TLS to kvd.
//!
//! A test binary has one shared CA ([`pki`]), which the harness's clients trust; a test that
//! needs a foreign CA makes another [`Pki`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber,
};
use tonic::transport::{Channel, Endpoint};

/// A certificate authority writing its files into a directory.
pub struct Pki {
    pub dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
    pub ca_file: PathBuf,
}

/// A certificate and key on disk.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub serial: u64,
}

/// How to issue a leaf certificate.
#[derive(Clone, Debug)]
pub struct Leaf<'a> {
    pub cn: &'a str,
    pub hosts: Vec<String>,
    pub serial: u64,
    /// Not valid any more (expired a long time ago).
    pub expired: bool,
}

impl<'a> Leaf<'a> {
    /// Valid now, for 127.0.0.1 and localhost, for servers and clients.
    pub fn new(cn: &'a str, serial: u64) -> Leaf<'a> {
        Leaf {
            cn,
            hosts: vec!["127.0.0.1".into(), "localhost".into()],
            serial,
            expired: false,
        }
    }
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = p.self_signed(&ca_key).unwrap();
        let ca_file = dir.join(format!("{name}.pem"));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            ca,
            ca_key,
            ca_file,
        }
    }

    /// A leaf signed by this CA, written as `<file>.pem` and `<file>-key.pem`.
    pub fn issue(&self, file: &str, leaf: Leaf<'_>) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(leaf.hosts.clone()).unwrap();
        p.distinguished_name.push(DnType::CommonName, leaf.cn);
        p.serial_number = Some(SerialNumber::from(leaf.serial));
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if leaf.expired {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = p.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let out = Issued {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
            serial: leaf.serial,
        };
        // Key first, then certificate, each replaced by rename: a reader sees whole files.
        write_atomic(&out.key, &key.serialize_pem());
        write_atomic(&out.cert, &cert.pem());
        out
    }

    /// A CRL revoking `serials`, written to `<file>.pem`.
    pub fn crl(&self, file: &str, serials: &[u64]) -> PathBuf {
        let crl = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.ca, &self.ca_key)
        .unwrap();
        let path = self.dir.join(format!("{file}.pem"));
        write_atomic(&path, &crl.pem().unwrap());
        path
    }
}

fn write_atomic(path: &Path, data: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The test binary's shared CA and the client certificate the harness presents.
pub struct Shared {
    pub pki: Pki,
    pub client: Issued,
}

/// The shared CA (its directory lives as long as the test binary, and is removed when it exits).
pub fn pki() -> &'static Shared {
    static P: OnceLock<Shared> = OnceLock::new();
    P.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        remove_at_exit(dir.clone());
        let pki = Pki::new(&dir, "ca");
        let client = pki.issue("root-client", Leaf::new("root", 1));
        Shared { pki, client }
    })
}

/// Removes `dir` when the test binary exits, its tests passed or not. The shared CA lives in a
/// static, and statics are never dropped, so a `TempDir` held there would never delete its
/// directory; `exit` (which the test harness reaches either way) runs `atexit` handlers.
fn remove_at_exit(dir: PathBuf) {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove() {
        if let Some(dir) = DIR.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    if DIR.set(dir).is_ok() {
        // SAFETY: `remove` is a plain function that neither unwinds nor calls `exit`.
        unsafe {
            libc::atexit(remove);
        }
    }
}

/// A rustls client config trusting `ca`, presenting `cert` if given.
pub fn client_config(ca: &Path, cert: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    client_config_versions(ca, cert, rustls::DEFAULT_VERSIONS)
}

/// Like [`client_config`], speaking only `versions`.
pub fn client_config_versions(
    ca: &Path,
    cert: Option<&Issued>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut std::fs::read(ca).unwrap().as_slice()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut c = match cert {
        Some(i) => {
            let chain = rustls_pemfile::certs(&mut std::fs::read(&i.cert).unwrap().as_slice())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pemfile::private_key(&mut std::fs::read(&i.key).unwrap().as_slice())
                .unwrap()
                .unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    c.alpn_protocols = vec![b"h2".to_vec()];
    // Every handshake in full: a resumed session shows the certificates of the first one.
    c.resumption = rustls::client::Resumption::disabled();
    Arc::new(c)
}

/// The harness's client config: the shared CA and the shared client certificate.
pub fn harness_client() -> Arc<rustls::ClientConfig> {
    static C: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    C.get_or_init(|| client_config(&pki().pki.ca_file, Some(&pki().client)))
        .clone()
}

/// A connected gRPC channel to an `https://` URL with `config`.
pub async fn tls_channel(
    url: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let (addr, name) = kvd::raft::net::dial::target(url).unwrap();
    Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector(kvd::raft::net::dial::TlsDial { config, addr, name })
        .await
}

/// The TLS handshake alone: the server's end-entity certificate, or the handshake's error.
pub async fn handshake(
    url: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<Vec<u8>, std::io::Error> {
    let (addr, name) = kvd::raft::net::dial::target(url).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    // TLS 1.3 reports a refused client certificate only after the handshake: read until the
    // server's alert (or its silence) shows whether it kept the connection.
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 1];
    match tokio::time::timeout(Duration::from_millis(300), tls.read(&mut b)).await {
        Ok(Err(e)) => return Err(e),
        Ok(Ok(0)) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "closed by the server",
            ))
        }
        _ => {}
    }
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

/// The serial number of a DER certificate.
pub fn serial_of(der: &[u8]) -> u64 {
    let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
    let b = c.raw_serial();
    b.iter().fold(0u64, |a, x| (a << 8) | u64::from(*x))
}

//! Client TLS as etcdctl 3.4 sets it up (`newClientCfg` + clientv3's `credentialsForEndpoint`).
//!
//! Invariants:
//! - A TLS configuration exists when any of `--cacert --cert --key` is given or
//!   `--insecure-transport=false`; `--insecure-skip-tls-verify` only affects an existing one.
//! - The scheme of the first endpoint decides for all of them (clientv3 dials one balancer):
//!   `http://` never uses TLS, `https://` always does (with system roots when no
//!   configuration exists), a bare `host:port` uses TLS iff a configuration exists.
//! - The server name checked is the endpoint's host, as grpc-go derives it from the authority.
use std::io::BufReader;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::cli::GlobalArgs;
use crate::error::CliError;

/// Where Go's `x509.SystemCertPool` finds the roots on Debian-like systems (the first that
/// exists is used).
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The TLS settings of a command: `None` means plaintext unless an endpoint says `https://`.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// The configuration built from the flags (clientv3's `creds`), if any.
    pub configured: Option<Arc<ClientConfig>>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Go's `ioutil.ReadFile` error text (`open <path>: no such file or directory`).
fn read_file(path: &str) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        CliError::bad_args(format!("open {path}: {why}"))
    })
}

fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, CliError> {
    let pem = read_file(path)?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut BufReader::new(&pem[..])).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(c),
        _ => Err(CliError::bad_args(format!(
            "tls: failed to find any PEM data in certificate input ({path})"
        ))),
    }
}

fn read_key(path: &str) -> Result<PrivateKeyDer<'static>, CliError> {
    let pem = read_file(path)?;
    match rustls_pemfile::private_key(&mut BufReader::new(&pem[..])) {
        Ok(Some(k)) => Ok(k),
        _ => Err(CliError::bad_args(format!(
            "tls: failed to find any PEM data in key input ({path})"
        ))),
    }
}

fn roots(paths: &[&str]) -> Result<RootCertStore, CliError> {
    let mut store = RootCertStore::empty();
    for p in paths {
        for c in read_certs(p)? {
            store
                .add(c)
                .map_err(|e| CliError::bad_args(format!("failed to add CA from {p}: {e}")))?;
        }
    }
    Ok(store)
}

/// The roots used for `https://` endpoints without `--cacert` (Go: the system pool).
fn system_roots() -> RootCertStore {
    let mut store = RootCertStore::empty();
    if let Some(p) = SYSTEM_ROOTS
        .iter()
        .find(|p| std::path::Path::new(p).exists())
    {
        if let Ok(pem) = std::fs::read(p) {
            for c in rustls_pemfile::certs(&mut BufReader::new(&pem[..])).flatten() {
                let _ = store.add(c);
            }
        }
    }
    store
}

impl TlsSettings {
    /// Builds the settings from the global flags, failing as etcdctl's `TLSInfo.ClientConfig`
    /// does (exit code 128).
    pub fn from_args(g: &GlobalArgs) -> Result<TlsSettings, CliError> {
        Self::from_files(
            &g.cert,
            &g.key,
            &g.cacert,
            g.insecure_transport,
            g.insecure_skip_tls_verify,
        )
    }

    /// The same from the individual settings (`make-mirror` has its own for the
    /// destination).
    pub fn from_files(
        cert: &str,
        key: &str,
        cacert: &str,
        insecure_transport: bool,
        insecure_skip_tls_verify: bool,
    ) -> Result<TlsSettings, CliError> {
        let any_file = !cert.is_empty() || !key.is_empty() || !cacert.is_empty();
        let configured = if any_file || !insecure_transport {
            if cert.is_empty() != key.is_empty() {
                return Err(CliError::bad_args(format!(
                    "KeyFile and CertFile must both be present[key: {key}, cert: {cert}]"
                )));
            }
            let store = if cacert.is_empty() {
                system_roots()
            } else {
                roots(&[cacert])?
            };
            Some(Arc::new(build(store, cert, key, insecure_skip_tls_verify)?))
        } else {
            None
        };
        Ok(TlsSettings { configured })
    }

    /// The configuration to dial `endpoint` with, or `None` for plaintext.
    pub fn for_endpoint(&self, endpoint: &str) -> Result<Option<Arc<ClientConfig>>, CliError> {
        if endpoint.starts_with("http://") || endpoint.starts_with("unix://") {
            return Ok(None);
        }
        if endpoint.starts_with("https://") && self.configured.is_none() {
            // grpc's default credentials: system roots, no client certificate; etcdctl applies
            // --insecure-skip-tls-verify only to a configuration built from its flags.
            return Ok(Some(Arc::new(build(system_roots(), "", "", false)?)));
        }
        Ok(self.configured.clone())
    }
}

fn build(
    store: RootCertStore,
    cert: &str,
    key: &str,
    skip_verify: bool,
) -> Result<ClientConfig, CliError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| CliError::bad_args(e.to_string()))?;
    let builder = if skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
    } else {
        builder.with_root_certificates(store)
    };
    let mut cfg = if cert.is_empty() {
        builder.with_no_client_auth()
    } else {
        builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| match e {
                // Go's tls.LoadX509KeyPair wording.
                rustls::Error::InconsistentKeys(_) => {
                    CliError::bad_args("tls: private key does not match public key")
                }
                e => CliError::bad_args(format!("tls: {e}")),
            })?
    };
    // gRPC needs HTTP/2, negotiated by ALPN as grpc-go does.
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// `--insecure-skip-tls-verify`: any certificate is accepted (Go's `InsecureSkipVerify`), but
/// the handshake signatures are still checked so the session keys belong to that certificate.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client connection preface of HTTP/2 (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the server's first bytes, which must start an HTTP/2 SETTINGS frame.
///
/// grpc-go counts a connection as up only once the server's SETTINGS arrived; kvctl does the
/// same, so that a server that refuses the connection makes it retry until the deadline
/// (`context deadline exceeded`, as etcdctl) instead of failing the first request. With TLS
/// 1.3 the client's handshake ends before the server has checked the client's certificate: a
/// refused certificate shows here as an alert. A TLS server dialled in plaintext closes.
async fn server_settings<S: AsyncRead + Unpin>(io: &mut S) -> std::io::Result<Vec<u8>> {
    let mut first = vec![0u8; 4096];
    let n = io.read(&mut first).await?;
    first.truncate(n);
    // A frame header: 3 bytes of length, then the type; SETTINGS is 4.
    if n < 4 || first[3] != 4 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the server did not start HTTP/2",
        ));
    }
    Ok(first)
}

fn host_port(uri: &http::Uri, default_port: u16) -> std::io::Result<(String, u16)> {
    let host = uri
        .host()
        .ok_or_else(|| std::io::Error::other("endpoint has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, uri.port_u16().unwrap_or(default_port)))
}

/// Dials `uri` over TCP, runs the TLS handshake, sends the HTTP/2 preface and waits for the
/// server's SETTINGS: tonic's connector for TLS endpoints.
pub async fn dial(
    cfg: Arc<ClientConfig>,
    uri: http::Uri,
) -> Result<TokioIo<Prefixed<TlsStream<TcpStream>>>, std::io::Error> {
    let (host, port) = host_port(&uri, 443)?;
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(host).map_err(std::io::Error::other)?;
    let mut tls = TlsConnector::from(cfg).connect(name, tcp).await?;
    // Go's HTTP/2 server sends its SETTINGS right after the handshake, but a server that
    // serves HTTP/1.1 and HTTP/2 on one port (kvd's, hyper's) first reads the preface to tell
    // them apart: send it now, as for plaintext.
    tls.write_all(PREFACE).await?;
    tls.flush().await?;
    let first = server_settings(&mut tls).await?;
    Ok(TokioIo::new(Prefixed::new(first, PREFACE.len(), tls)))
}

/// Dials `uri` over TCP without TLS, sends the HTTP/2 preface and waits for the server's
/// SETTINGS: tonic's connector for plaintext endpoints. The preface is sent early because
/// etcd's plaintext port (cmux) says nothing before it has seen one; hyper's own copy is
/// then dropped.
pub async fn dial_plain(uri: http::Uri) -> Result<TokioIo<Prefixed<TcpStream>>, std::io::Error> {
    let (host, port) = host_port(&uri, 80)?;
    let mut tcp = TcpStream::connect((host.as_str(), port)).await?;
    tcp.set_nodelay(true)?;
    tcp.write_all(PREFACE).await?;
    let first = server_settings(&mut tcp).await?;
    Ok(TokioIo::new(Prefixed::new(first, PREFACE.len(), tcp)))
}

/// A stream whose first bytes were already read (they are returned again before the rest) and
/// whose first `skip` written bytes were already sent (the HTTP/2 preface: they are dropped).
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    skip: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Vec<u8>, skip: usize, inner: S) -> Self {
        Prefixed {
            prefix,
            pos: 0,
            skip,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.skip > 0 {
            // A short write: the caller sends the rest of its buffer next.
            let n = self.skip.min(buf.len());
            self.skip -= n;
            return Poll::Ready(Ok(n));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn global(args: &[&str]) -> GlobalArgs {
        let mut v = vec!["kvctl"];
        v.extend_from_slice(args);
        v.push("version");
        crate::cli::Cli::try_parse_from(v).unwrap().global
    }

    #[test]
    fn plaintext_by_default() {
        let t = TlsSettings::from_args(&global(&[])).unwrap();
        assert!(t.for_endpoint("127.0.0.1:2379").unwrap().is_none());
        assert!(t.for_endpoint("http://127.0.0.1:2379").unwrap().is_none());
        assert!(t.for_endpoint("https://127.0.0.1:2379").unwrap().is_some());
    }

    #[test]
    fn secure_transport_without_files() {
        let t = TlsSettings::from_args(&global(&["--insecure-transport=false"])).unwrap();
        assert!(t.for_endpoint("127.0.0.1:2379").unwrap().is_some());
        assert!(t.for_endpoint("http://127.0.0.1:2379").unwrap().is_none());
    }

    #[test]
    fn key_needs_cert() {
        let e = TlsSettings::from_args(&global(&["--key", "/k"])).unwrap_err();
        assert_eq!(e.code, crate::error::EXIT_BAD_ARGS);
        assert_eq!(
            e.msg,
            "KeyFile and CertFile must both be present[key: /k, cert: ]"
        );
        let e = TlsSettings::from_args(&global(&["--cacert", "/nonexistent/ca.pem"])).unwrap_err();
        assert_eq!(e.msg, "open /nonexistent/ca.pem: no such file or directory");
    }
}

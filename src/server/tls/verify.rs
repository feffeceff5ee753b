//! Verifying the certificates other parties present, with the CA (and CRL) files re-read when
//! they change.
//!
//! - [`ClientVerifier`]: a listener's check of client certificates: chain to the trusted CA,
//!   not revoked by the CRL (only the end entity is checked, and a CRL from another issuer
//!   does not make a certificate unknown, as etcd checks the serial against the list), and for
//!   peers etcd's `--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname`.
//! - [`ServerVerifier`]: the check of a peer's server certificate when dialing it: chain to
//!   the peer CA, valid for the dialed host, and the same allowed CN / host name rule (etcd
//!   applies it to both directions).
//! - [`AnyServer`]: `--peer-auto-tls` without a CA: etcd skips verification of self-signed
//!   peers (`InsecureSkipVerify`); the handshake signatures are still checked.
//!
//! Invariants:
//! - A verifier always has a CA that loaded: a CA or CRL file that fails to load at a reload
//!   keeps the previous one, logged once per change of the files.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::sync::LockExt;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

use super::files::{self, Stamp};
use super::TlsError;

/// etcd's allowed CN / host name for peer certificates.
#[derive(Debug, Clone, Default)]
pub struct NameRule {
    pub allowed_cn: Option<String>,
    pub allowed_hostname: Option<String>,
}

impl NameRule {
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), Error> {
        if let Some(cn) = &self.allowed_cn {
            if files::common_name(end_entity).as_deref() != Some(cn.as_str()) {
                return Err(Error::General(format!(
                    "client certificate authentication failed: CN is not {cn:?}"
                )));
            }
        }
        if let Some(host) = &self.allowed_hostname {
            let name = ServerName::try_from(host.as_str())
                .map_err(|e| Error::General(format!("bad allowed hostname {host:?}: {e}")))?;
            let parsed = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&parsed, &name).map_err(|_| {
                Error::General(format!(
                    "client certificate authentication failed: not valid for {host:?}"
                ))
            })?;
        }
        Ok(())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a [`Reloading`] holds: the stamps it was built from, the value, and the stamps of
/// the last failed rebuild (logged once).
type Built<T> = (Vec<Stamp>, Arc<T>, Option<Vec<Stamp>>);

/// Something rebuilt from files when their stamps change.
struct Reloading<T: ?Sized> {
    paths: Vec<PathBuf>,
    state: Mutex<Built<T>>,
    build: fn(&[PathBuf]) -> Result<Arc<T>, TlsError>,
}

impl<T: ?Sized> Reloading<T> {
    fn new(
        paths: Vec<PathBuf>,
        build: fn(&[PathBuf]) -> Result<Arc<T>, TlsError>,
    ) -> Result<Self, TlsError> {
        let stamps = files::stamps(&paths.iter().collect::<Vec<_>>());
        let cur = build(&paths)?;
        Ok(Reloading {
            paths,
            state: Mutex::new((stamps, cur, None)),
            build,
        })
    }

    fn current(&self) -> Arc<T> {
        let now = files::stamps(&self.paths.iter().collect::<Vec<_>>());
        let mut st = self.state.lock_or_recover();
        if now != st.0 && st.2.as_ref() != Some(&now) {
            match (self.build)(&self.paths) {
                Ok(v) => {
                    tracing::info!(files = ?self.paths, "reloaded TLS CA/CRL");
                    *st = (now, v, None);
                }
                Err(e) => {
                    tracing::warn!("cannot reload TLS CA/CRL, keeping the previous one: {e}");
                    st.2 = Some(now);
                }
            }
        }
        st.1.clone()
    }
}

fn build_client_verifier(paths: &[PathBuf]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let roots = files::roots(&paths[0])?;
    let mut b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    if let Some(crl) = paths.get(1) {
        b = b
            .with_crls(files::crls(crl)?)
            .only_check_end_entity_revocation()
            .allow_unknown_revocation_status();
    }
    Ok(b.build()?)
}

/// A listener's client certificate check; every client must present a valid certificate.
pub struct ClientVerifier {
    inner: Reloading<dyn ClientCertVerifier>,
    rule: NameRule,
}

impl fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientVerifier")
            .field("files", &self.inner.paths)
            .finish()
    }
}

impl ClientVerifier {
    pub fn open(
        ca: PathBuf,
        crl: Option<PathBuf>,
        rule: NameRule,
    ) -> Result<ClientVerifier, TlsError> {
        let mut paths = vec![ca];
        paths.extend(crl);
        Ok(ClientVerifier {
            inner: Reloading::new(paths, build_client_verifier)?,
            rule,
        })
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Optional in TLS; Go clients send their only certificate when the list is empty.
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let v = self
            .inner
            .current()
            .verify_client_cert(end_entity, intermediates, now)?;
        self.rule.check(end_entity)?;
        Ok(v)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner
            .current()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner
            .current()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.current().supported_verify_schemes()
    }
}

fn build_server_verifier(paths: &[PathBuf]) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    let roots = files::roots(&paths[0])?;
    Ok(
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(TlsError::Verifier)?,
    )
}

/// The check of a peer's server certificate when this member dials it.
pub struct ServerVerifier {
    inner: Reloading<dyn ServerCertVerifier>,
    rule: NameRule,
}

impl fmt::Debug for ServerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerVerifier")
            .field("files", &self.inner.paths)
            .finish()
    }
}

impl ServerVerifier {
    pub fn open(ca: PathBuf, rule: NameRule) -> Result<ServerVerifier, TlsError> {
        Ok(ServerVerifier {
            inner: Reloading::new(vec![ca], build_server_verifier)?,
            rule,
        })
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let v = self.inner.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        self.rule.check(end_entity)?;
        Ok(v)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner
            .current()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner
            .current()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.current().supported_verify_schemes()
    }
}

/// Accepts any server certificate (self-signed auto-TLS peers), still checking that the
/// server holds its key.
#[derive(Debug)]
pub struct AnyServer(pub Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
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
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
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

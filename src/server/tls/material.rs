//! Everything TLS a member needs, built from its configuration at start: the server configs
//! of its client and peer listeners and the client config it dials peers with.
//!
//! Invariants:
//! - Certificates, keys, CAs and CRLs are loaded once here, so a member never starts with
//!   files it cannot use; afterwards they are re-read when they change ([`super::reload`],
//!   [`super::verify`]).
//! - A listener with a trusted CA requires a client certificate (etcd: `--trusted-ca-file`
//!   alone sets `RequireAndVerifyClientCert`). A side with client-cert-auth always has a CA
//!   (the configuration refuses it otherwise, auto TLS included), and every TLS listener of a
//!   side shares its one server config, so none of them serves a client without a verified
//!   certificate.
//! - Dialing a peer always verifies its certificate against the peer CA, except with
//!   `--peer-auto-tls` and no CA, where etcd skips verification of self-signed peers.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig, SupportedProtocolVersion};

use super::reload::CertFiles;
use super::verify::{AnyServer, ClientVerifier, NameRule, ServerVerifier};
use super::{auto, TlsError};
use crate::server::config::tls::{TlsConfig, TlsInfo, TlsVersion};
use crate::server::config::Config;

/// The TLS side of a member.
#[derive(Clone, Default)]
pub struct Material {
    /// For the `https://` client listeners.
    pub client_server: Option<Arc<ServerConfig>>,
    /// Requests carry the client certificate's CN for auth (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// For the `https://` peer listeners.
    pub peer_server: Option<Arc<ServerConfig>>,
    /// For dialing `https://` peer URLs.
    pub peer_client: Option<Arc<ClientConfig>>,
}

/// rustls with ring, offering only the configured TLS 1.2 suites (TLS 1.3's are always on, as
/// in Go).
pub fn provider(tls: &TlsConfig) -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    if let Some(only) = &tls.cipher_suites {
        p.cipher_suites.retain(|cs| {
            cs.version() == &rustls::version::TLS13 || only.iter().any(|o| o.suite() == cs.suite())
        });
    }
    Arc::new(p)
}

fn versions(tls: &TlsConfig) -> Vec<&'static SupportedProtocolVersion> {
    let mut v = Vec::new();
    if tls.min_version <= TlsVersion::Tls13 && tls.max_version >= TlsVersion::Tls13 {
        v.push(&rustls::version::TLS13);
    }
    if tls.min_version <= TlsVersion::Tls12 && tls.max_version >= TlsVersion::Tls12 {
        v.push(&rustls::version::TLS12);
    }
    v
}

/// Host names and addresses a generated certificate is valid for: those of the listen and
/// advertised URLs (etcd uses the listen URLs' hosts).
fn hosts<'a>(
    urls: impl IntoIterator<Item = &'a String>,
    extra: &[std::net::SocketAddr],
) -> Vec<String> {
    let mut out: Vec<String> = extra.iter().map(|a| a.ip().to_string()).collect();
    for u in urls {
        if let Some(h) = url::Url::parse(u)
            .ok()
            .and_then(|p| p.host_str().map(str::to_string))
        {
            out.push(h.trim_start_matches('[').trim_end_matches(']').to_string());
        }
    }
    out.push("localhost".to_string());
    out.sort();
    out.dedup();
    out
}

/// The certificate files of one side, generating them for auto TLS.
fn cert_files(
    info: &TlsInfo,
    fixtures: &Path,
    hosts: &[String],
    validity_years: u32,
) -> Result<Option<Arc<CertFiles>>, TlsError> {
    let (cert, key) = match (&info.cert_file, &info.key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ if info.auto_tls => auto::self_cert(fixtures, hosts, validity_years)?,
        _ => return Ok(None),
    };
    Ok(Some(Arc::new(CertFiles::open(cert, key)?)))
}

fn server_config(
    tls: &TlsConfig,
    info: &TlsInfo,
    cert: Arc<CertFiles>,
    rule: NameRule,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = match &info.trusted_ca_file
    {
        Some(ca) => Arc::new(ClientVerifier::open(
            ca.clone(),
            info.crl_file.clone(),
            rule,
        )?),
        // Serving without asking for a certificate here would drop client-cert-auth silently.
        None if info.client_cert_auth => return Err(TlsError::ClientCertAuthWithoutCa),
        None => WebPkiClientVerifier::no_client_auth(),
    };
    let mut c = ServerConfig::builder_with_provider(provider(tls))
        .with_protocol_versions(&versions(tls))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert);
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(c))
}

impl Material {
    pub fn load(cfg: &Config) -> Result<Material, TlsError> {
        let tls = &cfg.tls;
        let fixtures = cfg.data_dir.join("fixtures");
        let years = tls.self_signed_cert_validity_years;
        let mut m = Material {
            client_cert_auth: tls.client.client_cert_auth,
            ..Default::default()
        };
        let client_hosts = hosts(&cfg.advertise_client_urls, &cfg.listen_client);
        if let Some(cert) = cert_files(&tls.client, &fixtures.join("client"), &client_hosts, years)?
        {
            // gRPC over HTTP/2, the JSON gateway and /health over HTTP/1.1 on the same port.
            m.client_server = Some(server_config(
                tls,
                &tls.client,
                cert,
                NameRule::default(),
                &[b"h2", b"http/1.1"],
            )?);
        }
        let peer_hosts = hosts(&cfg.advertise_peer_urls, &cfg.listen_peer);
        if let Some(cert) = cert_files(&tls.peer, &fixtures.join("peer"), &peer_hosts, years)? {
            let rule = NameRule {
                allowed_cn: tls.peer.allowed_cn.clone(),
                allowed_hostname: tls.peer.allowed_hostname.clone(),
            };
            m.peer_server = Some(server_config(
                tls,
                &tls.peer,
                cert.clone(),
                rule.clone(),
                &[b"h2"],
            )?);
            let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> =
                match &tls.peer.trusted_ca_file {
                    Some(ca) => Arc::new(ServerVerifier::open(ca.clone(), rule)?),
                    None => Arc::new(AnyServer(provider(tls))),
                };
            let mut c = ClientConfig::builder_with_provider(provider(tls))
                .with_protocol_versions(&versions(tls))?
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_client_cert_resolver(cert);
            c.alpn_protocols = vec![b"h2".to_vec()];
            m.peer_client = Some(Arc::new(c));
        }
        Ok(m)
    }
}

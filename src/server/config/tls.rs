//! The TLS part of the configuration: etcd's client and peer TLS flags, validated.
//!
//! Semantics follow etcd 3.4/3.5 (`embed/config.go`, `pkg/transport`):
//! - `--trusted-ca-file` alone already makes the server require and verify a client
//!   certificate; `--client-cert-auth` without a CA file has nothing to verify against and is
//!   refused here (etcd would fall back to the system roots, which kvd does not read), with
//!   auto TLS too (etcd 3.4 silently drops the flag there; see decision 0038). So a side with
//!   client-cert-auth always has a CA, and all its TLS listeners refuse a client without a
//!   certificate that CA verifies. `--client-cert-auth` also makes the certificate's CN the
//!   auth user.
//! - `--peer-client-cert-auth` with a plain `http://` peer listen URL is refused (etcd only
//!   warns): that listener would serve the root-equivalent peer service to anyone. A plain
//!   client listener next to `--client-cert-auth` is served, as in etcd, with a warning at
//!   start: requests there still need a token when auth is on.
//! - `--auto-tls` / `--peer-auto-tls` generate a self-signed certificate under
//!   `<data-dir>/fixtures/{client,peer}` at start, only when no certificate files are given.
//! - An `https://` listen URL needs a certificate (given or automatic); an `http://` URL next
//!   to it is served in plain text. An `https://` peer URL anywhere in the initial cluster or
//!   the advertised URLs needs peer TLS: a member never dials a scheme it cannot speak.
//! - TLS versions by etcd's names (TLS1.2, TLS1.3; rustls has nothing older, so TLS1.0 and
//!   TLS1.1 as a minimum mean TLS1.2 and as a maximum are refused); cipher suites by Go's
//!   names, restricting the TLS 1.2 suites (TLS 1.3 suites are always on, as in Go).

use std::path::PathBuf;

use clap::Args;
use rustls::SupportedCipherSuite;

use crate::server::config::ConfigError;

/// etcd's TLS flags (each also read from its `ETCD_*` variable).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsFlags {
    /// Path to the client server TLS cert file.
    #[arg(long, env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Path to the client server TLS key file.
    #[arg(long, env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Path to the client server TLS trusted CA cert file (client certificates are then
    /// required and verified).
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Enable client cert authentication (the certificate's CN is the auth user).
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub client_cert_auth: bool,
    /// Path to the client certificate revocation list file.
    #[arg(long, env = "ETCD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<PathBuf>,
    /// Client TLS using generated certificates.
    #[arg(long, env = "ETCD_AUTO_TLS", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub auto_tls: bool,
    /// Path to the peer server TLS cert file.
    #[arg(long, env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// Path to the peer server TLS key file.
    #[arg(long, env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Enable peer client cert authentication.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub peer_client_cert_auth: bool,
    /// Path to the peer certificate revocation list file.
    #[arg(long, env = "ETCD_PEER_CRL_FILE")]
    pub peer_crl_file: Option<PathBuf>,
    /// Peer TLS using generated certificates.
    #[arg(long, env = "ETCD_PEER_AUTO_TLS", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub peer_auto_tls: bool,
    /// Allowed CN for inter peer authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN")]
    pub peer_cert_allowed_cn: Option<String>,
    /// Allowed TLS hostname for inter peer authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME")]
    pub peer_cert_allowed_hostname: Option<String>,
    /// Comma-separated list of supported TLS cipher suites (Go's names; empty: the defaults).
    #[arg(long, env = "ETCD_CIPHER_SUITES", default_value = "")]
    pub cipher_suites: String,
    /// Minimum TLS version supported by etcd (TLS1.2 or TLS1.3).
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "TLS1.2")]
    pub tls_min_version: String,
    /// Maximum TLS version supported by etcd (empty: the highest, TLS1.3).
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    pub tls_max_version: String,
    /// The validity period of the auto-generated certificates, in years.
    #[arg(long, env = "ETCD_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    pub self_signed_cert_validity: u32,
}

/// One side's (client or peer) certificate settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsInfo {
    /// Certificate and key; `None` until auto TLS has generated them.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// CA that verifies certificates presented to this member; set means required.
    pub trusted_ca_file: Option<PathBuf>,
    pub crl_file: Option<PathBuf>,
    /// The certificate's CN is the auth user (client side only).
    pub client_cert_auth: bool,
    /// Generate a self-signed certificate at start (no cert files given).
    pub auto_tls: bool,
    /// Incoming certificates must carry this CN (peer side only).
    pub allowed_cn: Option<String>,
    /// Incoming certificates must be valid for this host name (peer side only).
    pub allowed_hostname: Option<String>,
}

impl TlsInfo {
    /// Whether this side speaks TLS at all.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.auto_tls
    }
}

/// TLS protocol versions, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// Validated TLS configuration.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub client: TlsInfo,
    pub peer: TlsInfo,
    pub min_version: TlsVersion,
    pub max_version: TlsVersion,
    /// The TLS 1.2 suites to offer; `None`: rustls's defaults.
    pub cipher_suites: Option<Vec<SupportedCipherSuite>>,
    pub self_signed_cert_validity_years: u32,
    /// Per `--listen-client-urls` entry (same order): served over TLS.
    pub listen_client_https: Vec<bool>,
    /// Per `--listen-peer-urls` entry (same order): served over TLS.
    pub listen_peer_https: Vec<bool>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            client: TlsInfo::default(),
            peer: TlsInfo::default(),
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
            cipher_suites: None,
            self_signed_cert_validity_years: 1,
            listen_client_https: Vec::new(),
            listen_peer_https: Vec::new(),
        }
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// etcd's `tlsutil.GetTLSVersion`, for the versions rustls has.
fn parse_version(flag: &str, v: &str, empty: TlsVersion) -> Result<TlsVersion, ConfigError> {
    match v {
        "" => Ok(empty),
        // rustls implements nothing older: a lower minimum still means TLS 1.2.
        "TLS1.0" | "TLS1.1" if flag == "tls-min-version" => {
            tracing::warn!("--{flag}={v}: kvd speaks TLS1.2 and TLS1.3 only; using TLS1.2");
            Ok(TlsVersion::Tls12)
        }
        "TLS1.2" => Ok(TlsVersion::Tls12),
        "TLS1.3" => Ok(TlsVersion::Tls13),
        _ => err(format!(
            "unexpected TLS version {v:?} (must be one of: TLS1.2, TLS1.3)"
        )),
    }
}

/// Go's names for TLS 1.2 cipher suites (crypto/tls), mapped to rustls's.
fn go_cipher_suite(name: &str) -> Option<Option<SupportedCipherSuite>> {
    use rustls::crypto::ring::cipher_suite as cs;
    Some(Some(match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        // Known to Go, not implemented by rustls (CBC, RC4, 3DES, static RSA key exchange).
        "TLS_RSA_WITH_RC4_128_SHA"
        | "TLS_RSA_WITH_3DES_EDE_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA256"
        | "TLS_RSA_WITH_AES_128_GCM_SHA256"
        | "TLS_RSA_WITH_AES_256_GCM_SHA384"
        | "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256" => return Some(None),
        _ => return None,
    }))
}

fn parse_cipher_suites(s: &str) -> Result<Option<Vec<SupportedCipherSuite>>, ConfigError> {
    let names: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for n in names {
        match go_cipher_suite(n) {
            Some(Some(cs)) => out.push(cs),
            Some(None) => {
                return err(format!(
                    "unsupported TLS cipher suite {n:?} (kvd's TLS has only the ECDHE AEAD suites)"
                ))
            }
            None => return err(format!("unexpected TLS cipher suite {n:?}")),
        }
    }
    Ok(Some(out))
}

/// One side's files: both of cert and key or neither.
fn pair(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    cert_flag: &str,
    key_flag: &str,
) -> Result<(Option<PathBuf>, Option<PathBuf>), ConfigError> {
    match (cert, key) {
        (Some(c), Some(k)) => Ok((Some(c.clone()), Some(k.clone()))),
        (None, None) => Ok((None, None)),
        _ => err(format!(
            "--{cert_flag} and --{key_flag} must be given together"
        )),
    }
}

/// The scheme of a URL the URL checks of `config.rs` already accepted.
pub fn is_https(u: &str) -> bool {
    u.trim_start().to_ascii_lowercase().starts_with("https://")
}

impl TlsFlags {
    /// Validates the TLS flags against the URLs they serve: `listen_client` and `listen_peer`
    /// are the listen URLs, `peer_urls` every peer URL this member may dial or advertise.
    pub fn validate(
        &self,
        listen_client: &[String],
        listen_peer: &[String],
        peer_urls: &[String],
    ) -> Result<TlsConfig, ConfigError> {
        let (cert, key) = pair(&self.cert_file, &self.key_file, "cert-file", "key-file")?;
        let (pcert, pkey) = pair(
            &self.peer_cert_file,
            &self.peer_key_file,
            "peer-cert-file",
            "peer-key-file",
        )?;
        let client = TlsInfo {
            auto_tls: self.auto_tls && cert.is_none(),
            cert_file: cert,
            key_file: key,
            trusted_ca_file: self.trusted_ca_file.clone(),
            crl_file: self.client_crl_file.clone(),
            client_cert_auth: self.client_cert_auth,
            allowed_cn: None,
            allowed_hostname: None,
        };
        let peer = TlsInfo {
            auto_tls: self.peer_auto_tls && pcert.is_none(),
            cert_file: pcert,
            key_file: pkey,
            trusted_ca_file: self.peer_trusted_ca_file.clone(),
            crl_file: self.peer_crl_file.clone(),
            client_cert_auth: self.peer_client_cert_auth,
            allowed_cn: self.peer_cert_allowed_cn.clone().filter(|s| !s.is_empty()),
            allowed_hostname: self
                .peer_cert_allowed_hostname
                .clone()
                .filter(|s| !s.is_empty()),
        };
        if peer.allowed_cn.is_some() && peer.allowed_hostname.is_some() {
            return err(
                "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive",
            );
        }
        for (info, side) in [(&client, ""), (&peer, "peer-")] {
            let (ca_flag, auth_flag) = (
                format!("{side}trusted-ca-file"),
                format!("{side}client-cert-auth"),
            );
            if info.client_cert_auth && info.trusted_ca_file.is_none() {
                // A self-signed certificate names no CA, and a certificate anyone can make
                // for themselves proves nothing: with auto TLS the flag would be a promise of
                // authentication that nobody keeps (etcd 3.4 drops it without a word).
                if info.auto_tls {
                    return err(format!(
                        "--{auth_flag} cannot be enforced with --{side}auto-tls: a self-signed \
                         certificate has no CA to verify client certificates against; give \
                         --{ca_flag} with --{side}cert-file and --{side}key-file issued by that \
                         CA, or drop --{auth_flag}"
                    ));
                }
                return err(format!(
                    "--{auth_flag} needs --{ca_flag}: kvd verifies client certificates against \
                     the given CA only"
                ));
            }
        }
        // A plain-text peer listener would serve the peer service, which is root-equivalent,
        // to anyone, next to listeners that demand a certificate.
        if peer.client_cert_auth {
            if let Some(u) = listen_peer.iter().find(|u| !is_https(u)) {
                return err(format!(
                    "--peer-client-cert-auth: peer url {u} is not https, so it would serve \
                     peers without a certificate; use https:// for every --listen-peer-urls \
                     entry"
                ));
            }
        }
        if peer.cert_file.is_some() && peer.trusted_ca_file.is_none() {
            return err(
                "--peer-trusted-ca-file is required with --peer-cert-file: kvd verifies peers \
                 against the given CA only (or use --peer-auto-tls)",
            );
        }
        for u in listen_client.iter().filter(|u| is_https(u)) {
            if !client.enabled() {
                return err(format!(
                    "TLS key/cert (--cert-file, --key-file) must be provided for client url {u} \
                     with HTTPS scheme"
                ));
            }
        }
        for u in listen_peer.iter().filter(|u| is_https(u)) {
            if !peer.enabled() {
                return err(format!(
                    "TLS key/cert (--peer-cert-file, --peer-key-file) must be provided for peer \
                     url {u} with HTTPS scheme"
                ));
            }
        }
        for u in peer_urls.iter().filter(|u| is_https(u)) {
            if !peer.enabled() {
                return err(format!(
                    "peer URL {u} uses https, but no peer TLS is configured (--peer-cert-file \
                     and --peer-key-file, or --peer-auto-tls): this member could not dial it"
                ));
            }
        }
        let min_version =
            parse_version("tls-min-version", &self.tls_min_version, TlsVersion::Tls12)?;
        let max_version =
            parse_version("tls-max-version", &self.tls_max_version, TlsVersion::Tls13)?;
        if min_version > max_version {
            return err(format!(
                "min version ({}) is greater than max version ({})",
                self.tls_min_version, self.tls_max_version
            ));
        }
        let cipher_suites = parse_cipher_suites(&self.cipher_suites)?;
        if cipher_suites.is_some() && min_version == TlsVersion::Tls13 {
            return err(
                "cipher suites cannot be configured when only TLS1.3 or greater is supported",
            );
        }
        if self.self_signed_cert_validity == 0 {
            return err("--self-signed-cert-validity must be positive");
        }
        Ok(TlsConfig {
            client,
            peer,
            min_version,
            max_version,
            cipher_suites,
            self_signed_cert_validity_years: self.self_signed_cert_validity,
            listen_client_https: listen_client.iter().map(|u| is_https(u)).collect(),
            listen_peer_https: listen_peer.iter().map(|u| is_https(u)).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> TlsFlags {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            tls: TlsFlags,
        }
        let mut v = vec!["kvd"];
        v.extend_from_slice(args);
        <P as clap::Parser>::try_parse_from(v).unwrap().tls
    }

    const H: &str = "https://127.0.0.1:2379";
    const P: &str = "http://127.0.0.1:2380";

    #[test]
    fn https_client_url_needs_a_certificate() {
        let e = flags(&[])
            .validate(&[H.into()], &[P.into()], &[])
            .unwrap_err();
        assert!(e.0.contains("must be provided for client url"), "{e}");
        let ok = flags(&["--cert-file", "c", "--key-file", "k"])
            .validate(&[H.into()], &[P.into()], &[])
            .unwrap();
        assert!(ok.client.enabled() && ok.client.trusted_ca_file.is_none());
        assert!(
            flags(&["--auto-tls"])
                .validate(&[H.into()], &[P.into()], &[])
                .unwrap()
                .client
                .auto_tls
        );
    }

    #[test]
    fn https_peer_url_needs_peer_tls() {
        let e = flags(&[])
            .validate(&[], &[P.into()], &["https://10.0.0.1:2380".into()])
            .unwrap_err();
        assert!(e.0.contains("no peer TLS is configured"), "{e}");
        let e = flags(&[])
            .validate(&[], &["https://127.0.0.1:2380".into()], &[])
            .unwrap_err();
        assert!(e.0.contains("--peer-cert-file"), "{e}");
    }

    #[test]
    fn cert_and_key_come_together() {
        assert!(flags(&["--cert-file", "c"])
            .validate(&[], &[], &[])
            .is_err());
        assert!(flags(&["--peer-key-file", "k"])
            .validate(&[], &[], &[])
            .is_err());
    }

    #[test]
    fn versions_and_suites_by_etcd_names() {
        let t = flags(&["--tls-min-version", "TLS1.3"])
            .validate(&[], &[], &[])
            .unwrap();
        assert_eq!(t.min_version, TlsVersion::Tls13);
        let e = flags(&["--tls-min-version", "TLS9"])
            .validate(&[], &[], &[])
            .unwrap_err();
        assert_eq!(
            e.0,
            "unexpected TLS version \"TLS9\" (must be one of: TLS1.2, TLS1.3)"
        );
        let e = flags(&["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"])
            .validate(&[], &[], &[])
            .unwrap_err();
        assert!(e.0.contains("greater than max version"), "{e}");
        let t = flags(&[
            "--cipher-suites",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        ])
        .validate(&[], &[], &[])
        .unwrap();
        assert_eq!(t.cipher_suites.unwrap().len(), 2);
        let e = flags(&["--cipher-suites", "TLS_FOO"])
            .validate(&[], &[], &[])
            .unwrap_err();
        assert_eq!(e.0, "unexpected TLS cipher suite \"TLS_FOO\"");
        let e = flags(&["--cipher-suites", "TLS_RSA_WITH_AES_128_CBC_SHA"])
            .validate(&[], &[], &[])
            .unwrap_err();
        assert!(e.0.contains("unsupported"), "{e}");
    }

    #[test]
    fn client_cert_auth_with_auto_tls_is_refused() {
        let e = flags(&["--peer-auto-tls", "--peer-client-cert-auth"])
            .validate(&[], &["https://127.0.0.1:2380".into()], &[])
            .unwrap_err();
        assert!(
            e.0.starts_with("--peer-client-cert-auth cannot be enforced with --peer-auto-tls"),
            "{e}"
        );
        assert!(e.0.contains("--peer-trusted-ca-file"), "{e}");
        let e = flags(&["--auto-tls", "--client-cert-auth"])
            .validate(&[H.into()], &[], &[])
            .unwrap_err();
        assert!(
            e.0.starts_with("--client-cert-auth cannot be enforced with --auto-tls"),
            "{e}"
        );
        assert!(e.0.contains("--trusted-ca-file"), "{e}");
        // Auto TLS alone still starts, and so does client-cert-auth with a CA.
        assert!(flags(&["--peer-auto-tls"])
            .validate(&[], &["https://127.0.0.1:2380".into()], &[])
            .is_ok());
        assert!(flags(&[
            "--cert-file=c",
            "--key-file=k",
            "--trusted-ca-file=ca",
            "--client-cert-auth"
        ])
        .validate(&[H.into()], &[], &[])
        .is_ok());
    }

    #[test]
    fn peer_client_cert_auth_refuses_a_plain_peer_listener() {
        let f = flags(&[
            "--peer-cert-file=c",
            "--peer-key-file=k",
            "--peer-trusted-ca-file=ca",
            "--peer-client-cert-auth",
        ]);
        let e = f
            .validate(&[], &["https://127.0.0.1:2380".into(), P.into()], &[])
            .unwrap_err();
        assert!(
            e.0.contains("peer url http://127.0.0.1:2380 is not https"),
            "{e}"
        );
        assert!(f
            .validate(&[], &["https://127.0.0.1:2380".into()], &[])
            .is_ok());
    }

    #[test]
    fn client_cert_auth_needs_a_ca() {
        let e = flags(&["--cert-file", "c", "--key-file", "k", "--client-cert-auth"])
            .validate(&[], &[], &[])
            .unwrap_err();
        assert!(e.0.contains("--trusted-ca-file"), "{e}");
    }
}

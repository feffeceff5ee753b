//! The identity a client proved with its TLS certificate, as request handlers see it.
//!
//! Invariants:
//! - The client listener puts a [`TlsPeer`] into the extensions of every request that came over
//!   TLS (tonic inserts a connection's `ConnectInfo` into each request). Its `client_cert` is
//!   set when the client presented a certificate the trusted CA verified and the listener runs
//!   with `--client-cert-auth` (etcd takes the CN as the user only then); plain-text
//!   connections carry no `TlsPeer`.
//! - [`common_name`] is the only way handlers read it (auth uses the CN as the user name when a
//!   request carries no token, as etcd does with `--client-cert-auth`).

/// The verified client certificate's subject, as far as auth needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientCert {
    /// The subject's first CommonName, if it has one.
    pub common_name: Option<String>,
}

/// What a TLS connection's requests carry (the connection's tonic `ConnectInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsPeer {
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The verified client certificate, with `--client-cert-auth`.
    pub client_cert: Option<ClientCert>,
}

/// The CommonName of the verified client certificate a request came with, if any.
pub fn common_name(ext: &http::Extensions) -> Option<String> {
    ext.get::<ClientCert>()
        .or_else(|| ext.get::<TlsPeer>().and_then(|p| p.client_cert.as_ref()))
        .and_then(|c| c.common_name.clone())
}

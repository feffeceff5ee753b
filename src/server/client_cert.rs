//! The identity a client proved with its TLS certificate, as request handlers see it.
//!
//! Invariants:
//! - The client listener puts a [`ClientCert`] into the extensions of every request that came
//!   over a TLS connection whose client presented a certificate the trusted CA verified;
//!   plain-text connections and TLS connections without a client certificate carry none.
//! - [`common_name`] is the only way handlers read it (auth uses the CN as the user name when a
//!   request carries no token, as etcd does with `--client-cert-auth`).

/// The verified client certificate's subject, as far as auth needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientCert {
    /// The subject's first CommonName, if it has one.
    pub common_name: Option<String>,
}

/// The CommonName of the verified client certificate a request came with, if any.
pub fn common_name(ext: &http::Extensions) -> Option<String> {
    ext.get::<ClientCert>().and_then(|c| c.common_name.clone())
}

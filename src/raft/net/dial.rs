//! Dialing a peer over TLS: TCP, then a rustls handshake, for tonic's channels.
//!
//! The TLS settings (this member's client certificate, how the peer's certificate is
//! verified, re-reading rotated files) come from the server layer as a `rustls::ClientConfig`;
//! this layer only connects.
//!
//! Invariants:
//! - The name verified against the peer's certificate is the host of the peer URL from the
//!   membership, even when a fault-testing override sends the bytes through a proxy.
//! - Only `h2` is offered by ALPN: the peer protocol is gRPC.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower connector for tonic: dials `addr` and handshakes as a client of `name`.
#[derive(Clone)]
pub struct TlsDial {
    pub config: Arc<rustls::ClientConfig>,
    /// host:port to connect to.
    pub addr: String,
    /// The name the peer's certificate must be valid for.
    pub name: ServerName<'static>,
}

impl tower::Service<http::Uri> for TlsDial {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(&this.addr).await?;
            tcp.set_nodelay(true)?;
            let tls = TlsConnector::from(this.config)
                .connect(this.name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// host:port and the TLS server name of an `https://host:port` URL.
pub fn target(url: &str) -> Result<(String, ServerName<'static>), String> {
    let u = url::Url::parse(url).map_err(|e| format!("bad peer URL {url}: {e}"))?;
    let host = u
        .host_str()
        .ok_or_else(|| format!("bad peer URL {url}: no host"))?;
    let port = u
        .port_or_known_default()
        .ok_or_else(|| format!("bad peer URL {url}: no port"))?;
    // IPv6 literals come bracketed from the URL; the server name is the bare address.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name =
        ServerName::try_from(bare.to_string()).map_err(|e| format!("bad peer URL {url}: {e}"))?;
    Ok((format!("{host}:{port}"), name))
}

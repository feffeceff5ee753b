//! A TLS listener's connections: accepted, handshaken off the accept loop, and handed to the
//! server with the client's verified identity attached.
//!
//! Invariants:
//! - A slow or failing handshake never holds up accepting: each runs in its own task, bounded
//!   by [`HANDSHAKE_TIMEOUT`], and at most [`MAX_HANDSHAKES`] run at once (more wait in the
//!   kernel's accept queue), so a flood of bad clients costs bounded memory.
//! - A connection reaches the server only after its handshake succeeded, so a client the
//!   verifier refuses never gets a request to a handler.
//! - Every request of a connection carries its [`TlsPeer`] (tonic inserts a connection's
//!   `ConnectInfo` into each request's extensions; the JSON gateway's routes see the same), whose
//!   client certificate is set only when the listener uses certificates for auth.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use super::files;
use crate::server::api::client_cert::{ClientCert, TlsPeer};

/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once, per listener.
pub const MAX_HANDSHAKES: usize = 1024;

/// One accepted, handshaken TLS connection.
pub struct TlsConn {
    io: TlsStream<TcpStream>,
    peer: TlsPeer,
}

impl Connected for TlsConn {
    type ConnectInfo = TlsPeer;

    fn connect_info(&self) -> TlsPeer {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The TLS connections of `listener`, for `serve_with_incoming_shutdown`. The accept loop
/// ends when the server drops the stream. `cert_identity`: record the client certificate's CN
/// for auth (`--client-cert-auth`).
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    cert_identity: bool,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => p.expect("never closed"),
                _ = tx.closed() => return,
            };
            let (tcp, addr) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: wait instead of spinning.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            // Small gRPC responses otherwise wait for the client's delayed ACK.
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(io)) => {
                        let client_cert = if cert_identity {
                            io.get_ref().1.peer_certificates().and_then(|c| {
                                c.first().map(|leaf| ClientCert {
                                    common_name: files::common_name(leaf),
                                })
                            })
                        } else {
                            None
                        };
                        let peer = TlsPeer {
                            remote_addr: Some(addr),
                            client_cert,
                        };
                        let _ = tx.send(Ok(TlsConn { io, peer })).await;
                    }
                    // etcd logs refused handshakes the same way.
                    Ok(Err(e)) => tracing::warn!("rejected connection from {addr}: {e}"),
                    Err(_) => {
                        tracing::warn!("rejected connection from {addr}: handshake timed out")
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

    fn issue(
        ca: &rcgen::Certificate,
        ca_key: &rcgen::KeyPair,
        cn: &str,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, ca, ca_key).unwrap();
        (
            vec![cert.der().clone()],
            PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
    }

    /// The verified client certificate's CN reaches the connection's `TlsPeer`, which tonic
    /// puts into every request's extensions, and `common_name` reads it from there.
    #[tokio::test]
    async fn a_verified_client_certificate_cn_is_the_connection_identity() {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = p.self_signed(&ca_key).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let roots = Arc::new(roots);
        let (scert, skey) = issue(&ca, &ca_key, "server");
        let verifier = rustls::server::WebPkiClientVerifier::builder(roots.clone())
            .build()
            .unwrap();
        let server = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(scert, skey)
            .unwrap();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut conns = incoming(l, Arc::new(server), true);

        let (ccert, ckey) = issue(&ca, &ca_key, "alice");
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(ccert, ckey)
            .unwrap();
        let dial = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            tokio_rustls::TlsConnector::from(Arc::new(client))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap()
        });
        let conn = conns.next().await.unwrap().unwrap();
        let _client = dial.await.unwrap();
        let mut ext = http::Extensions::new();
        ext.insert(conn.connect_info());
        assert_eq!(
            crate::server::api::client_cert::common_name(&ext).as_deref(),
            Some("alice")
        );
    }
}

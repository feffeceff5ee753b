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
use crate::server::client_cert::{ClientCert, TlsPeer};

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

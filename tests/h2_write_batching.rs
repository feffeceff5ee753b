//! kvd's copy of h2 (third_party/h2/KVD_PATCH.md) writes many small DATA frames in one write
//! call. Stock h2 0.4.20 kept every payload of 256 bytes or more aside and flushed it before
//! the next frame: one write syscall per gRPC message of a put with a 256-byte value, per range
//! response, per watch event. This test queues such messages on many streams over a real
//! loopback socket and counts the client's write calls.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP stream that counts the write calls that wrote something.
struct Counting {
    inner: TcpStream,
    writes: Arc<AtomicUsize>,
}

impl Counting {
    fn count(&self, r: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = r {
            if *n > 0 {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.count(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.count(&r);
        r
    }

    // As a TCP socket: h2 picks its smaller chain threshold (256 bytes) for vectored streams.
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Answers every stream once its body has been read, and reports each body.
async fn serve(listener: TcpListener, bodies: tokio::sync::mpsc::UnboundedSender<Vec<u8>>) {
    let (tcp, _) = listener.accept().await.expect("accept");
    let mut conn = h2::server::handshake(tcp).await.expect("server handshake");
    while let Some(r) = conn.accept().await {
        let (req, mut respond) = r.expect("stream");
        let bodies = bodies.clone();
        tokio::spawn(async move {
            let mut body = req.into_body();
            let mut got = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.expect("data");
                got.extend_from_slice(&chunk);
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let _ = respond.send_response(http::Response::new(()), true);
            let _ = bodies.send(got);
        });
    }
}

/// A loopback connection to a fresh [`serve`], and the channel its bodies arrive on.
async fn connect() -> (TcpStream, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(serve(listener, tx));
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    (tcp, rx)
}

/// An h2 client over `io`, ready to send, its connection driven by a task of its own.
async fn client<T>(io: T) -> h2::client::SendRequest<Bytes>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, conn) = h2::client::handshake(io).await.expect("client handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.expect("ready")
}

const STREAMS: usize = 64;
/// A put of an 8-byte key and a 256-byte value, framed for gRPC, is about this size.
const PAYLOAD: usize = 300;

#[tokio::test]
async fn many_small_data_frames_go_out_in_a_few_writes() {
    let (tcp, mut rx) = connect().await;
    assert!(
        tcp.is_write_vectored(),
        "a TCP stream takes vectored writes"
    );
    let writes = Arc::new(AtomicUsize::new(0));
    let io = Counting {
        inner: tcp,
        writes: writes.clone(),
    };
    let mut client = client(io).await;
    // Let the connection settle (preface, both SETTINGS and their acks) before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = writes.load(Ordering::Relaxed);

    // Queue every stream without yielding: the connection task (on this same current-thread
    // runtime) writes them all in its next turn.
    let payload = Bytes::from(vec![7u8; PAYLOAD]);
    let mut responses = Vec::with_capacity(STREAMS);
    for _ in 0..STREAMS {
        let req = http::Request::post("http://test/x")
            .body(())
            .expect("request");
        let (resp, mut send) = client.send_request(req, false).expect("send_request");
        send.send_data(payload.clone(), true).expect("send_data");
        responses.push(resp);
    }
    for _ in 0..STREAMS {
        let n = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("every body arrives")
            .expect("server running");
        assert_eq!(n.len(), PAYLOAD);
    }
    let used = writes.load(Ordering::Relaxed) - before;
    for r in responses {
        r.await.expect("response");
    }
    // 64 streams of headers (~10 bytes each once HPACK indexes them) and 300-byte payloads
    // are about 20 KiB: two or three 16 KiB buffers. Stock h2 needs at least one per stream.
    assert!(
        used <= STREAMS / 8,
        "{used} write calls for {STREAMS} streams of {PAYLOAD}-byte payloads"
    );
}

/// Payloads around the copy limit (4 KiB) and above it, mixed with small ones, so that copied
/// and chained frames share the write buffer: every body arrives whole and unchanged.
#[tokio::test]
async fn payloads_around_the_copy_limit_arrive_intact() {
    let (tcp, mut rx) = connect().await;
    let mut client = client(tcp).await;

    let sizes = [
        300, 4095, 4096, 4097, 300, 6000, 16_384, 300, 40_000, 12_000,
    ];
    let mut want: Vec<Vec<u8>> = Vec::new();
    let mut responses = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        // A pattern that differs by stream and by offset, so a misplaced byte shows.
        let body: Vec<u8> = (0..n).map(|j| (i * 31 + j * 7) as u8).collect();
        let req = http::Request::post("http://test/x")
            .body(())
            .expect("request");
        let (resp, mut send) = client.send_request(req, false).expect("send_request");
        send.reserve_capacity(n);
        send.send_data(Bytes::from(body.clone()), true)
            .expect("send_data");
        want.push(body);
        responses.push(resp);
    }
    let mut got = Vec::new();
    for _ in 0..sizes.len() {
        got.push(
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("every body arrives")
                .expect("server running"),
        );
    }
    for r in responses {
        r.await.expect("response");
    }
    // Streams are answered in whatever order their bodies complete.
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

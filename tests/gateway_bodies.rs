//! The JSON gateway's request bodies against a real `kvd`, over raw HTTP/1.1 with chunked
//! bodies (no length announced, so nothing is refused before it is read): a body, or one
//! message of a streamed body, is refused once it passes the gateway's limit, and the
//! connection closes; bodies up to the limit, and streams of messages, still work.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// The default `--max-request-bytes` plus the transport's 512 KiB, twice (JSON's base64).
const MAX_BODY: usize = 2 * (1_572_864 + 512 * 1024);

/// One HTTP/1.1 request whose body is sent in chunks, its response read as it arrives.
struct Raw {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    got: Vec<u8>,
}

impl Raw {
    async fn post(c: &Cluster, path: &str) -> Raw {
        let port = c.members[0].client_port;
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (rd, mut wr) = s.into_split();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        );
        wr.write_all(head.as_bytes()).await.unwrap();
        Raw {
            rd,
            wr,
            got: Vec::new(),
        }
    }

    async fn chunk(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut c = format!("{:x}\r\n", data.len()).into_bytes();
        c.extend_from_slice(data);
        c.extend_from_slice(b"\r\n");
        self.wr.write_all(&c).await
    }

    async fn end(&mut self) {
        self.wr.write_all(b"0\r\n\r\n").await.unwrap();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got).into_owned()
    }

    /// Reads until the response so far contains `want`.
    async fn read_until(&mut self, want: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.text().contains(want) {
            let mut b = [0u8; 65536];
            let n = tokio::time::timeout_at(deadline.into(), self.rd.read(&mut b))
                .await
                .unwrap_or_else(|_| panic!("no {want:?} within {within:?}: {}", self.text()))
                .unwrap();
            assert!(n > 0, "closed before {want:?}: {}", self.text());
            self.got.extend_from_slice(&b[..n]);
        }
    }

    fn status(&self) -> u16 {
        self.text()
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

/// Streams filler chunks into `raw`'s body for as long as the server takes them, while the
/// response is read: the response is complete and the connection closed within `within` of
/// the body passing the limit. Returns the response.
async fn stream_until_refused(raw: Raw, within: Duration) -> String {
    let Raw {
        mut rd,
        mut wr,
        mut got,
    } = raw;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let passed = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let writer = {
        let (sent, passed) = (sent.clone(), passed.clone());
        tokio::spawn(async move {
            let filler = vec![b'A'; 64 * 1024];
            let mut c = format!("{:x}\r\n", filler.len()).into_bytes();
            c.extend_from_slice(&filler);
            c.extend_from_slice(b"\r\n");
            // Long past the limit, or until the server stops taking the body.
            while sent.load(std::sync::atomic::Ordering::Relaxed) < 40 * MAX_BODY {
                if wr.write_all(&c).await.is_err() {
                    return;
                }
                let now = sent.fetch_add(filler.len(), std::sync::atomic::Ordering::Relaxed);
                if now + filler.len() > MAX_BODY {
                    passed.lock().unwrap().get_or_insert_with(Instant::now);
                }
            }
        })
    };
    let closed = loop {
        let mut b = [0u8; 65536];
        match tokio::time::timeout(Duration::from_secs(60), rd.read(&mut b)).await {
            Err(_) => panic!("still open after 60 s: {}", String::from_utf8_lossy(&got)),
            Ok(Ok(0)) | Ok(Err(_)) => break Instant::now(),
            Ok(Ok(n)) => got.extend_from_slice(&b[..n]),
        }
    };
    writer.abort();
    let passed = passed
        .lock()
        .unwrap()
        .expect("the body passed the limit before the connection closed");
    assert!(
        closed.duration_since(passed) < within,
        "closed {:?} after the body passed the limit",
        closed.duration_since(passed)
    );
    String::from_utf8_lossy(&got).into_owned()
}

fn assert_refused(resp: &str) {
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp, ""));
    assert!(head.starts_with("HTTP/1.1 429 "), "{resp}");
    assert!(
        body.contains(r#""code":8"#)
            && body.contains("grpc: received message larger than max (")
            && body.contains(" vs. 2097152)"),
        "{body}"
    );
}

#[tokio::test]
async fn endless_chunked_bodies_are_refused_at_the_limit() {
    let c = Cluster::start(1).await;
    c.wait_for_leader(Duration::from_secs(10)).await;

    // A watch whose first message never ends (no token needed to open one).
    let mut raw = Raw::post(&c, "/v3/watch").await;
    raw.chunk(br#"{"create_request":{"key":""#).await.unwrap();
    let resp = stream_until_refused(raw, Duration::from_secs(2)).await;
    assert_refused(&resp);

    // A unary call's body.
    let mut raw = Raw::post(&c, "/v3/kv/put").await;
    raw.chunk(br#"{"key":"YQ==","value":""#).await.unwrap();
    let resp = stream_until_refused(raw, Duration::from_secs(2)).await;
    assert_refused(&resp);

    // A later message of a watch that is already streaming responses: the response ends
    // with the refusal as its error chunk.
    let mut raw = Raw::post(&c, "/v3/watch").await;
    raw.chunk(br#"{"create_request":{"key":"YQ=="}}"#)
        .await
        .unwrap();
    raw.read_until(r#""created":true"#, Duration::from_secs(10))
        .await;
    raw.chunk(br#"{"create_request":{"key":""#).await.unwrap();
    let resp = stream_until_refused(raw, Duration::from_secs(2)).await;
    assert!(resp.starts_with("HTTP/1.1 200 "), "{resp}");
    assert!(
        resp.contains(r#"{"error":{"grpc_code":8,"http_code":429,"message":"grpc: received message larger than max ("#),
        "{resp}"
    );

    // The member serves on.
    let mut kv = c.kv(0).await;
    common::put(&mut kv, "after", "1").await.unwrap();
}

#[tokio::test]
async fn bodies_up_to_the_limit_and_streams_of_messages_work() {
    let c = Cluster::start(1).await;
    c.wait_for_leader(Duration::from_secs(10)).await;
    let put = br#"{"key":"YQ==","value":"MQ=="}"#;

    // A unary body of exactly the limit (the message and whitespace), in chunks.
    let mut raw = Raw::post(&c, "/v3/kv/put").await;
    raw.chunk(put).await.unwrap();
    let pad = vec![b' '; MAX_BODY - put.len()];
    for part in pad.chunks(100_000) {
        raw.chunk(part).await.unwrap();
    }
    raw.end().await;
    raw.read_until(r#""revision""#, Duration::from_secs(10))
        .await;
    assert_eq!(raw.status(), 200, "{}", raw.text());

    // One byte more is refused.
    let mut raw = Raw::post(&c, "/v3/kv/put").await;
    raw.chunk(put).await.unwrap();
    for part in pad.chunks(100_000) {
        raw.chunk(part).await.unwrap();
    }
    raw.chunk(b" ").await.unwrap();
    raw.end().await;
    raw.read_until("\r\n\r\n{", Duration::from_secs(10)).await;
    assert_refused(&raw.text());

    // A watch body: a message at the limit (whitespace before it counts), then more
    // messages in later chunks, each answered while the body is still open.
    let mut raw = Raw::post(&c, "/v3/watch").await;
    let create = br#"{"create_request":{"key":"YQ=="}}"#;
    let pad = vec![b'\n'; MAX_BODY - create.len()];
    for part in pad.chunks(100_000) {
        raw.chunk(part).await.unwrap();
    }
    raw.chunk(create).await.unwrap();
    raw.read_until(r#""created":true"#, Duration::from_secs(10))
        .await;
    assert_eq!(raw.status(), 200, "{}", raw.text());
    raw.chunk(br#"{"create_request":{"key":"Yg=="}} {"progress"#)
        .await
        .unwrap();
    raw.chunk(br#"_request":{}}"#).await.unwrap();
    raw.read_until(r#""watch_id":"1","created":true"#, Duration::from_secs(10))
        .await;
    raw.read_until(r#""watch_id":"-1""#, Duration::from_secs(10))
        .await;
    let mut kv = c.kv(0).await;
    common::put(&mut kv, "b", "x").await.unwrap();
    raw.read_until(r#""events""#, Duration::from_secs(10)).await;
}

//! A full paginated listing, as Kubernetes' API server lists a resource: pages of `--page`
//! keys over the whole key space, every page after the first pinned to the first page's
//! revision, each page starting just after the previous page's last key. One connection,
//! one request at a time: the time is the listing's latency, not a throughput.

use std::time::Instant;

use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::RangeRequest;
use tonic::transport::Channel;

/// Lists everything from `""` to the end of the key space; prints keys, pages, value bytes
/// and seconds (JSON with `--json`).
pub async fn run(
    channel: Channel,
    page: i64,
    serializable: bool,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(page > 0, "--page must be positive");
    let mut kv = KvClient::new(channel).max_decoding_message_size(usize::MAX);
    let started = Instant::now();
    let (mut keys, mut pages, mut bytes) = (0u64, 0u64, 0u64);
    let mut from = vec![0u8];
    let mut revision = 0;
    loop {
        let r = kv
            .range(RangeRequest {
                key: from.clone(),
                range_end: vec![0u8],
                limit: page,
                revision,
                serializable,
                ..Default::default()
            })
            .await?
            .into_inner();
        pages += 1;
        if revision == 0 {
            revision = r.header.as_ref().map_or(0, |h| h.revision);
        }
        keys += r.kvs.len() as u64;
        bytes += r.kvs.iter().map(|kv| kv.value.len() as u64).sum::<u64>();
        match r.kvs.last() {
            Some(last) if r.more => {
                from = last.key.clone();
                from.push(0);
            }
            _ => break,
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "keys": keys, "pages": pages, "value_bytes": bytes,
                "revision": revision, "seconds": secs,
            })
        );
    } else {
        println!("listed {keys} keys ({bytes} value bytes) in {pages} pages at revision {revision}: {secs:.3} s");
    }
    Ok(())
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::format::{self, Frame, FRAME_HEADER_LEN, HEADER_LEN};
use super::*;

pub(super) fn dir() -> PathBuf {
    PathBuf::from("/data/wal")
}

pub(super) fn entry(index: u64, len: usize) -> Record {
    Record::Entry {
        index,
        data: (0..len).map(|i| (index as usize * 31 + i) as u8).collect(),
    }
}

fn open_sim(fs: &SimFs, segment_size: u64) -> Result<(Wal, Vec<Record>), WalError> {
    open_sim_opts(
        fs,
        WalOptions {
            segment_size,
            ..Default::default()
        },
    )
}

fn open_sim_opts(fs: &SimFs, opts: WalOptions) -> Result<(Wal, Vec<Record>), WalError> {
    Wal::open_with_fs(Arc::new(fs.clone()), &dir(), opts)
}

/// A SimFs holding exactly these (durable) segment files.
pub(super) fn sim_with_files(files: &[(PathBuf, Vec<u8>)]) -> SimFs {
    let fs = SimFs::new();
    fs.create_dir_all(&dir()).unwrap();
    for (p, data) in files {
        let mut f = fs.create_file(p).unwrap();
        f.append(data).unwrap();
        f.sync_data().unwrap();
    }
    fs.sync_dir(&dir()).unwrap();
    fs
}

/// Every segment file (oldest first) with its frames, without the zeros reserved after them.
pub(super) fn segment_files(fs: &SimFs) -> Vec<(PathBuf, Vec<u8>)> {
    let mut names = fs.list_dir(&dir()).unwrap();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let p = dir().join(n);
            (p.clone(), written_part(fs, &p))
        })
        .collect()
}

/// `path`'s header and frames, without the zeros reserved after them.
pub(super) fn written_part(fs: &SimFs, path: &Path) -> Vec<u8> {
    let mut d = fs.file_contents(path).unwrap();
    let end = frames_end(&d);
    if d.get(end..)
        .is_some_and(|rest| rest.iter().all(|&b| b == 0))
    {
        d.truncate(end);
    }
    d
}

/// Where the frames of a segment end: the first offset that does not parse.
pub(super) fn frames_end(data: &[u8]) -> usize {
    let mut pos = HEADER_LEN;
    while let Ok((_, next)) = format::decode_frame(data, pos) {
        pos = next;
    }
    pos
}

/// (offset, end, frame) of every frame in a segment (its written part).
fn frames(data: &[u8]) -> Vec<(usize, usize, Frame)> {
    let mut out = Vec::new();
    let mut pos = HEADER_LEN;
    while pos < data.len() {
        let (f, next) = format::decode_frame(data, pos).unwrap();
        out.push((pos, next, f));
        pos = next;
    }
    out
}

fn sample_records() -> Vec<Vec<Record>> {
    vec![
        vec![Record::Vote(b"term=1,node=1".to_vec())],
        vec![entry(1, 10), entry(2, 0), entry(3, 100)],
        vec![Record::Committed(b"1-2".to_vec())],
        vec![Record::TruncateAfter { index: Some(2) }, entry(3, 7)],
        vec![Record::Vote(b"term=2,node=3".to_vec()), entry(4, 5000)],
        vec![Record::PurgeUpTo {
            index: 1,
            data: b"1-1".to_vec(),
        }],
        vec![Record::TruncateAfter { index: None }],
        vec![entry(5, 3)],
    ]
}

#[test]
fn round_trip_real_fs() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal");
    let batches = sample_records();
    let (wal, recovered) = Wal::open(&path, WalOptions::default()).unwrap();
    assert!(recovered.is_empty());
    for b in &batches {
        wal.write_sync(b.clone()).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(wal.write(vec![entry(6, 1)])).unwrap();
    let stats = wal.stats();
    drop(wal);
    let mut want: Vec<Record> = batches.concat();
    want.push(entry(6, 1));
    assert_eq!(stats.records, want.len() as u64);
    assert_eq!(stats.fsyncs, batches.len() as u64 + 1);
    assert!(stats.fsync_buckets.windows(2).all(|w| w[0] <= w[1]));
    assert!(stats.fsync_buckets[13] <= stats.fsyncs);
    assert!(stats.bytes_written > 5000);

    let (wal, got) = Wal::open(&path, WalOptions::default()).unwrap();
    assert_eq!(got, want);
    drop(wal);
    // Reopening without writing changes nothing.
    let (_wal, got) = Wal::open(&path, WalOptions::default()).unwrap();
    assert_eq!(got, want);
}

#[test]
fn wal_is_send_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Wal>();
    check::<SimFs>();
}

#[test]
fn torn_tail_repaired_on_real_fs() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal");
    let (wal, _) = Wal::open(&path, WalOptions::default()).unwrap();
    wal.write_sync(vec![entry(1, 10), entry(2, 10)]).unwrap();
    drop(wal);
    let seg = super::segment_path(&path, 0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let good = frames_end(&bytes);
    // A torn write: garbage inside the segment's reserved zeros.
    bytes[good + 100..good + 4096].fill(0x5a);
    std::fs::write(&seg, &bytes).unwrap();
    let (wal, got) = Wal::open(&path, WalOptions::default()).unwrap();
    assert_eq!(got, vec![entry(1, 10), entry(2, 10)]);
    let now = std::fs::read(&seg).unwrap();
    assert_eq!(now[..good], bytes[..good]);
    assert!(now[good..].iter().all(|&b| b == 0), "the garbage was cut");
    wal.write_sync(vec![entry(3, 1)]).unwrap();
    drop(wal);
    let (_w, got) = Wal::open(&path, WalOptions::default()).unwrap();
    assert_eq!(got.len(), 3);
}

#[test]
fn closed_and_drop_semantics() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 1..=50 {
        let tx = tx.clone();
        wal.submit(
            vec![entry(i, 10)],
            Box::new(move |r| tx.send((i, r.is_ok())).unwrap()),
        );
    }
    let w2 = wal.clone();
    drop(wal);
    w2.close();
    // Everything queued before close was flushed and acknowledged, in order.
    let got: Vec<(u64, bool)> = rx.try_iter().collect();
    assert_eq!(got, (1..=50).map(|i| (i, true)).collect::<Vec<_>>());
    assert!(matches!(
        w2.write_sync(vec![entry(51, 1)]),
        Err(WalError::Closed)
    ));
    drop(w2);
    let (_w, recs) = open_sim(&fs, 1 << 20).unwrap();
    assert_eq!(recs.len(), 50);
}

#[test]
fn truncation_at_every_offset_of_last_record() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    let written = vec![entry(1, 20), entry(2, 30), Record::Vote(b"v".to_vec())];
    wal.write_sync(written[..2].to_vec()).unwrap();
    wal.write_sync(written[2..].to_vec()).unwrap();
    let last = entry(3, 40);
    wal.write_sync(vec![last.clone()]).unwrap();
    drop(wal);
    let files = segment_files(&fs);
    assert_eq!(files.len(), 1);
    let (path, data) = &files[0];
    let fr = frames(data);
    let (last_start, last_end, _) = fr
        .iter()
        .rev()
        .find(|(_, _, f)| *f == Frame::Record(last.clone()))
        .cloned()
        .unwrap();
    for cut in last_start..data.len() {
        let fs = sim_with_files(&[(path.clone(), data[..cut].to_vec())]);
        let (wal, got) = open_sim(&fs, 1 << 20).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let mut want = written.clone();
        if cut >= last_end {
            want.push(last.clone());
        }
        assert_eq!(got, want, "cut at {cut}");
        wal.write_sync(vec![entry(9, 5)]).unwrap();
        drop(wal);
        let (_wal, got) = open_sim(&fs, 1 << 20).unwrap();
        want.push(entry(9, 5));
        assert_eq!(got, want, "reopen after cut at {cut}");
    }
}

#[test]
fn flipped_byte_mid_log_is_corrupt() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    for i in 1..=10 {
        wal.write_sync(vec![entry(i, 16)]).unwrap();
    }
    drop(wal);
    let (path, data) = segment_files(&fs).remove(0);
    let fr = frames(&data);
    // The third batch's entry; later batches follow it.
    let (start, end, _) = fr
        .iter()
        .find(|(_, _, f)| *f == Frame::Record(entry(3, 16)))
        .cloned()
        .unwrap();
    for b in start..end {
        let mut bad = data.clone();
        bad[b] ^= 0x40;
        let fs = sim_with_files(&[(path.clone(), bad)]);
        match open_sim(&fs, 1 << 20) {
            Err(WalError::Corrupt { file, offset, .. }) => {
                assert_eq!(file, path);
                assert_eq!(offset, start as u64, "flip at {b}");
            }
            other => panic!(
                "flip at {b}: expected Corrupt, got {:?}",
                other.map(|r| r.1)
            ),
        }
    }
}

#[test]
fn corruption_in_earlier_segment_is_refused() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 200).unwrap();
    for i in 1..=20 {
        wal.write_sync(vec![entry(i, 50)]).unwrap();
    }
    drop(wal);
    let files = segment_files(&fs);
    assert!(files.len() > 3);
    // Damage the end of the first segment: its own batch is complete but a
    // later segment exists, so this cannot be a torn write.
    let (p0, d0) = &files[0];
    let fr = frames(d0);
    let (start, _, _) = fr[fr.len() - 2].clone();
    let mut bad = d0.clone();
    bad.truncate(start + 3);
    let mut damaged = files.clone();
    damaged[0] = (p0.clone(), bad);
    let fs = sim_with_files(&damaged);
    match open_sim(&fs, 200) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!(&file, p0);
            assert_eq!(offset, start as u64);
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|r| r.1)),
    }
    // A garbage header on a non-last segment is refused too.
    let mut damaged = files.clone();
    damaged[1].1[0] ^= 1;
    let fs = sim_with_files(&damaged);
    assert!(matches!(
        open_sim(&fs, 200),
        Err(WalError::BadHeader { .. })
    ));
}

#[test]
fn torn_tail_of_zero_and_garbage_pages_is_repaired() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    let mut want = Vec::new();
    for i in 1..=5 {
        let b = vec![entry(i, 300), Record::Committed(vec![i as u8])];
        wal.write_sync(b.clone()).unwrap();
        want.extend(b);
    }
    drop(wal);
    let (path, data) = segment_files(&fs).remove(0);
    let mut rng = StdRng::seed_from_u64(7);
    let mut garbage = vec![0u8; 8192];
    rng.fill(&mut garbage[..]);
    let partial_record = {
        let mut v = Vec::new();
        format::encode_record(&entry(6, 9000), &mut v).unwrap();
        v.truncate(5000);
        v
    };
    let tails: Vec<(&str, Vec<u8>)> = vec![
        ("zeros", vec![0u8; 8192]),
        ("garbage", garbage.clone()),
        (
            "partial+zeros",
            [partial_record.clone(), vec![0; 4096]].concat(),
        ),
        ("partial+garbage", [partial_record, garbage].concat()),
        ("short", vec![3, 0, 0]),
    ];
    for (name, tail) in tails {
        let fs = sim_with_files(&[(path.clone(), [data.clone(), tail].concat())]);
        let (wal, got) = open_sim(&fs, 1 << 20).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}");
        assert_eq!(written_part(&fs, &path), data, "{name}: truncated");
        wal.write_sync(vec![entry(6, 1)]).unwrap();
        drop(wal);
        let (_w, got) = open_sim(&fs, 1 << 20).unwrap();
        assert_eq!(got.last(), Some(&entry(6, 1)), "{name}");
    }
}

#[test]
fn torn_page_inside_last_batch_is_repaired() {
    // Pages of the in-flight write survive independently: a zeroed page in
    // the middle of the last batch, with later pages (and even the batch's
    // end marker) intact, is still a torn write, not corruption.
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    wal.write_sync(vec![entry(1, 10)]).unwrap();
    let big: Vec<Record> = (2..40).map(|i| entry(i, 500)).collect();
    wal.write_sync(big.clone()).unwrap();
    drop(wal);
    let (path, mut data) = segment_files(&fs).remove(0);
    let fr = frames(&data);
    let want: Vec<Record> = fr
        .iter()
        .filter(|(_, end, _)| *end <= 8192)
        .filter_map(|(_, _, f)| match f {
            Frame::Record(r) => Some(r.clone()),
            Frame::BatchEnd { .. } => None,
        })
        .collect();
    // Frames of the same batch, including its end marker, survive after the hole.
    assert!(matches!(fr.last(), Some((s, _, Frame::BatchEnd { .. })) if *s > 12288));
    data[8192..12288].fill(0);
    let fs = sim_with_files(&[(path.clone(), data.clone())]);
    let (_w, got) = open_sim(&fs, 1 << 20).unwrap();
    assert!(want.len() > 2 && want.len() < 1 + big.len());
    assert_eq!(got, want);
    assert!(written_part(&fs, &path).len() <= 8192);
}

#[test]
fn header_problems() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 100).unwrap();
    for i in 1..=5 {
        wal.write_sync(vec![entry(i, 80)]).unwrap();
    }
    drop(wal);
    let files = segment_files(&fs);
    let n = files.len();
    assert!(n >= 3);
    // Crash right after creating the next segment: empty, zero or half header.
    for tail in [
        vec![],
        vec![0u8; 24],
        format::encode_header(n as u64)[..10].to_vec(),
    ] {
        let mut f = files.clone();
        f.push((super::segment_path(&dir(), n as u64), tail));
        let fs = sim_with_files(&f);
        let (_w, got) = open_sim(&fs, 100).unwrap();
        assert_eq!(got, (1..=5).map(|i| entry(i, 80)).collect::<Vec<_>>());
        assert_eq!(segment_files(&fs).len(), n);
    }
    // A segment from a newer format version is refused, wherever it is.
    let mut f = files.clone();
    f[n - 1].1[8..12].copy_from_slice(&2u32.to_le_bytes());
    let fs = sim_with_files(&f);
    match open_sim(&fs, 100) {
        Err(WalError::IncompatibleVersion { file, found }) => {
            assert_eq!(file, f[n - 1].0);
            assert_eq!(found, 2);
        }
        other => panic!("expected IncompatibleVersion, got {:?}", other.map(|r| r.1)),
    }
}

#[test]
fn fsync_failure_poisons_the_wal() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    wal.write_sync(vec![entry(1, 1)]).unwrap();
    // Batch = one append + one sync: fail the sync only.
    fs.fail_once_after(1);
    assert!(matches!(
        wal.write_sync(vec![entry(2, 1)]),
        Err(WalError::Io(_))
    ));
    // The disk "works" again, but nothing is ever acknowledged after a failed fsync.
    assert!(matches!(
        wal.write_sync(vec![entry(3, 1)]),
        Err(WalError::Poisoned(_))
    ));
}

#[test]
fn group_commit_batches_concurrent_writers() {
    let fs = SimFs::new();
    fs.set_sync_delay(Some(Duration::from_millis(1)));
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    let wal = Arc::new(wal);
    let threads: Vec<_> = (0..64u64)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    wal.write_sync(vec![entry(t * 1000 + i, 32)]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = wal.stats();
    assert_eq!(s.records, 64 * 20);
    assert!(
        s.fsyncs < s.records / 2,
        "{} fsyncs for {} records",
        s.fsyncs,
        s.records
    );
    assert_eq!(s.fsyncs, s.batches);
}

#[test]
fn rotation_and_purge() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal");
    let opts = WalOptions {
        segment_size: 1024,
        ..Default::default()
    };
    let (wal, _) = Wal::open(&path, opts.clone()).unwrap();
    let vote = Record::Vote(b"term=7".to_vec());
    wal.write_sync(vec![vote.clone(), Record::Committed(b"c0".to_vec())])
        .unwrap();
    for i in 1..=100 {
        wal.write_sync(vec![entry(i, 100)]).unwrap();
    }
    let count = || std::fs::read_dir(&path).unwrap().count();
    let before = count();
    assert!(before > 8, "{before} segments");
    let purge = Record::PurgeUpTo {
        index: 80,
        data: b"x-80".to_vec(),
    };
    wal.write_sync(vec![purge.clone()]).unwrap();
    // Unlinking happens on the flusher after the purge is durable; another
    // durable write orders us after it.
    wal.write_sync(vec![entry(101, 100)]).unwrap();
    let after = count();
    assert!(after <= 4, "{before} -> {after} segments");
    drop(wal);

    let (wal, got) = Wal::open(&path, opts.clone()).unwrap();
    let last_vote = got.iter().rev().find(|r| matches!(r, Record::Vote(_)));
    assert_eq!(last_vote, Some(&vote));
    let entries: Vec<&Record> = got
        .iter()
        .filter(|r| matches!(r, Record::Entry { index, .. } if *index > 80))
        .collect();
    let want: Vec<Record> = (81..=101).map(|i| entry(i, 100)).collect();
    assert_eq!(entries, want.iter().collect::<Vec<_>>());
    assert!(got.contains(&purge));
    assert!(got.contains(&Record::Committed(b"c0".to_vec())));
    // Segments stay contiguous and the WAL keeps working.
    wal.write_sync(vec![entry(102, 1)]).unwrap();
    drop(wal);
    let (_w, got) = Wal::open(&path, opts).unwrap();
    assert_eq!(got.last(), Some(&entry(102, 1)));
}

// ---------------------------------------------------------------------------
// Power-loss simulation.

/// The observable state a sequence of records produces. Entries at or below
/// the purge index may legitimately be gone, so they are not compared.
#[derive(Debug, Default, Clone, PartialEq)]
struct Model {
    entries: BTreeMap<u64, Vec<u8>>,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purge: Option<(u64, Vec<u8>)>,
}

impl Model {
    fn apply(&mut self, r: &Record) {
        match r {
            Record::Entry { index, data } => {
                self.entries.insert(*index, data.clone());
            }
            Record::Vote(v) => self.vote = Some(v.clone()),
            Record::Committed(c) => self.committed = Some(c.clone()),
            Record::TruncateAfter { index } => match index {
                Some(i) => {
                    self.entries.split_off(&(i + 1));
                }
                None => self.entries.clear(),
            },
            Record::PurgeUpTo { index, data } => self.purge = Some((*index, data.clone())),
        }
    }
    /// Equality of what must survive: everything but purged entries.
    fn same_visible(&self, other: &Model) -> bool {
        let floor = self.purge.as_ref().map_or(0, |p| p.0 + 1);
        let ofloor = other.purge.as_ref().map_or(0, |p| p.0 + 1);
        self.vote == other.vote
            && self.committed == other.committed
            && self.purge == other.purge
            && self
                .entries
                .range(floor..)
                .eq(other.entries.range(ofloor..))
    }
}

struct Gen {
    next: u64,
    purged: u64,
}

impl Gen {
    fn record(&mut self, rng: &mut StdRng, allow_purge: bool) -> Record {
        let roll = rng.gen_range(0..100);
        match roll {
            0..=59 => {
                let len = if rng.gen_bool(0.2) {
                    rng.gen_range(0..6000)
                } else {
                    rng.gen_range(0..200)
                };
                let r = Record::Entry {
                    index: self.next,
                    data: (0..len).map(|_| rng.gen()).collect(),
                };
                self.next += 1;
                r
            }
            60..=69 => Record::Vote(rng.gen::<[u8; 12]>().to_vec()),
            70..=79 => Record::Committed(rng.gen::<[u8; 10]>().to_vec()),
            80..=89 if self.next - 1 > self.purged => {
                let i = rng.gen_range(self.purged..self.next);
                self.next = i + 1;
                Record::TruncateAfter { index: Some(i) }
            }
            _ if allow_purge && self.next - 1 > self.purged => {
                let i = rng.gen_range(self.purged + 1..self.next);
                self.purged = i;
                Record::PurgeUpTo {
                    index: i,
                    data: i.to_le_bytes().to_vec(),
                }
            }
            _ => Record::Vote(vec![roll as u8]),
        }
    }
}

/// Checks recovered records against the submitted history; returns how many
/// history records the recovered state corresponds to.
fn check_recovery(
    recovered: &[Record],
    history: &[Record],
    acked: usize,
    literal: bool,
) -> Result<usize, String> {
    if literal {
        let n = recovered.len();
        if n > history.len() || recovered != &history[..n] {
            return Err(format!(
                "recovered {n} records are not a prefix of the {} submitted",
                history.len()
            ));
        }
        if n < acked {
            return Err(format!("lost acknowledged records: {n} < {acked}"));
        }
        return Ok(n);
    }
    let mut got = Model::default();
    for r in recovered {
        got.apply(r);
    }
    let mut m = Model::default();
    let mut best = None;
    for (k, r) in std::iter::once(None)
        .chain(history.iter().map(Some))
        .enumerate()
    {
        if let Some(r) = r {
            m.apply(r);
        }
        if k >= acked && m.same_visible(&got) {
            best = Some(k);
        }
    }
    best.ok_or_else(|| {
        format!(
            "recovered state matches no prefix of length >= {acked} of {} submitted",
            history.len()
        )
    })
}

/// Coverage counters, so a vacuous run (e.g. nothing ever lost) is noticed.
#[derive(Debug, Default)]
struct Coverage {
    lives: u64,
    /// Unacknowledged records that did not survive.
    lost_unacked: u64,
    /// Unacknowledged records that survived anyway.
    kept_unacked: u64,
    failed_callbacks: u64,
    max_segments: usize,
}

/// One randomized run: several lives, each ended by a power loss.
fn power_loss_run(seed: u64, cov: &mut Coverage, unsafe_no_fsync: bool) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let fs = SimFs::new();
    let literal = rng.gen_bool(0.3);
    let segment_size = if literal {
        1 << 30
    } else {
        [300, 2000, 20_000][rng.gen_range(0..3)]
    };
    let mut history: Vec<Record> = Vec::new();
    let mut acked = 0usize;
    let mut gen = Gen { next: 1, purged: 0 };
    for life in 0..4 {
        // Sometimes crash during recovery itself.
        let opts = WalOptions {
            segment_size,
            // A literal run's one segment would otherwise reserve 64 MiB of simulated file.
            reserve: 64 << 10,
            unsafe_no_fsync,
        };
        if rng.gen_bool(0.2) {
            fs.fail_after(rng.gen_range(0..6));
            if let Ok((w, _)) = open_sim_opts(&fs, opts.clone()) {
                drop(w);
            }
            fs.crash(&mut rng);
        }
        let (wal, recovered) =
            open_sim_opts(&fs, opts).map_err(|e| format!("life {life}: open: {e}"))?;
        let k = check_recovery(&recovered, &history, acked, literal)
            .map_err(|e| format!("life {life}: {e}"))?;
        cov.lives += 1;
        cov.lost_unacked += (history.len() - k) as u64;
        cov.kept_unacked += (k - acked) as u64;
        cov.max_segments = cov.max_segments.max(fs.list_dir(&dir()).unwrap().len());
        history.truncate(k);
        acked = k;
        // Regenerate indexes from the recovered state.
        let mut m = Model::default();
        history.iter().for_each(|r| m.apply(r));
        gen.next = m
            .entries
            .keys()
            .next_back()
            .map_or(1, |i| i + 1)
            .max(m.purge.as_ref().map_or(1, |p| p.0 + 1));
        gen.purged = m.purge.as_ref().map_or(0, |p| p.0);

        if rng.gen_bool(0.5) {
            fs.fail_after(rng.gen_range(0..30));
        }
        let (tx, rx) = mpsc::channel::<(usize, bool)>();
        let n_submits = rng.gen_range(0..40);
        let mut outstanding = 0;
        let mut results = Vec::new();
        for _ in 0..n_submits {
            let n = rng.gen_range(1..=4);
            let recs: Vec<Record> = (0..n).map(|_| gen.record(&mut rng, !literal)).collect();
            history.extend(recs.iter().cloned());
            let end = history.len();
            let tx = tx.clone();
            let done: WalCallback = Box::new(move |r| tx.send((end, r.is_ok())).unwrap());
            // Some written in place by this thread, when the flusher is idle (decision 0034).
            if rng.gen_bool(0.3) {
                wal.write_here(recs, done);
            } else {
                wal.submit(recs, done);
            }
            outstanding += 1;
            if rng.gen_bool(0.3) {
                for _ in 0..outstanding {
                    results.push(rx.recv().unwrap());
                }
                outstanding = 0;
            }
        }
        // Power loss at an arbitrary moment: I/O stops, then the machine dies.
        if rng.gen_bool(0.5) {
            std::thread::sleep(Duration::from_micros(rng.gen_range(0..300)));
        }
        fs.fail_after(0);
        drop(wal);
        drop(tx);
        results.extend(rx.iter());
        let mut seen_err = false;
        for (end, ok) in results {
            if ok {
                if seen_err {
                    return Err(format!("life {life}: acknowledged after a failure"));
                }
                acked = acked.max(end);
            } else {
                seen_err = true;
                cov.failed_callbacks += 1;
            }
        }
        fs.crash(&mut rng);
    }
    Ok(())
}

/// The power-loss check must be able to fail: a WAL that acknowledges before fdatasync
/// loses acknowledged records in some of the same seeded runs.
#[test]
fn power_loss_check_catches_ack_before_fsync() {
    let mut cov = Coverage::default();
    let caught: Vec<String> = (0..100)
        .filter_map(|seed| power_loss_run(seed, &mut cov, true).err())
        .collect();
    assert!(
        caught
            .iter()
            .any(|e| e.contains("lost acknowledged") || e.contains("matches no prefix")),
        "no run caught an unsynced acknowledgement: {caught:?}"
    );
}

#[test]
fn power_loss_random_workloads() {
    let seeds: u64 = std::env::var("WAL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let base: u64 = std::env::var("WAL_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut cov = Coverage::default();
    for seed in base..base + seeds {
        if let Err(e) = power_loss_run(seed, &mut cov, false) {
            panic!("power-loss run failed, seed {seed} (WAL_SEED_BASE={seed} WAL_SEEDS=1): {e}");
        }
    }
    eprintln!("{cov:?}");
    if seeds >= 100 {
        assert!(cov.lost_unacked > 0 && cov.kept_unacked > 0 && cov.failed_callbacks > 0);
        assert!(cov.max_segments > 5);
    }
}

#[test]
fn crash_at_every_io_point() {
    // A deterministic workload (write_sync per submission, so the I/O
    // sequence does not depend on timing) crashed at each I/O op in turn.
    let mut rng = StdRng::seed_from_u64(42);
    let mut gen = Gen { next: 1, purged: 0 };
    let workload: Vec<Vec<Record>> = (0..40)
        .map(|_| {
            let n = rng.gen_range(1..=3);
            (0..n).map(|_| gen.record(&mut rng, true)).collect()
        })
        .collect();
    let run = |fs: &SimFs| -> usize {
        let Ok((wal, _)) = open_sim(fs, 700) else {
            return 0;
        };
        let mut acked = 0;
        for b in &workload {
            if wal.write_sync(b.clone()).is_err() {
                break;
            }
            acked += b.len();
        }
        acked
    };
    let clean = SimFs::new();
    let total_records: usize = workload.iter().map(Vec::len).sum();
    assert_eq!(run(&clean), total_records);
    let total_ops = clean.mutating_ops();
    assert!(total_ops > 100);
    // The workload must exercise rotation and purge-driven unlinking.
    let names = clean.list_dir(&dir()).unwrap();
    assert!(names.len() > 1, "{names:?}");
    assert!(
        !names.contains(&"0000000000000000.wal".to_string()),
        "{names:?}"
    );
    let history: Vec<Record> = workload.concat();
    for n in 0..=total_ops {
        let fs = SimFs::new();
        fs.fail_after(n);
        let acked = run(&fs);
        for round in 0..3 {
            let mut rng = StdRng::seed_from_u64(n * 3 + round);
            fs.crash(&mut rng);
            let (wal, recovered) = open_sim(&fs, 700)
                .unwrap_or_else(|e| panic!("fail_after({n}), crash {round}: open: {e}"));
            check_recovery(&recovered, &history, acked, false)
                .unwrap_or_else(|e| panic!("fail_after({n}), crash {round}: {e}"));
            drop(wal);
        }
    }
}

#[test]
fn simfs_crash_keeps_synced_and_drops_unsynced_entries() {
    let fs = SimFs::new();
    let d = Path::new("/d");
    fs.create_dir_all(d).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    let mut f = fs.create_file(&d.join("a")).unwrap();
    f.append(b"hello").unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(d).unwrap();
    f.append(&[7u8; 10000]).unwrap();
    let _g = fs.create_file(&d.join("b")).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    fs.crash(&mut rng);
    let a = fs.file_contents(&d.join("a")).unwrap();
    assert!(a.starts_with(b"hello") && a.len() <= 10005);
    // Handles from before the crash are dead.
    assert!(f.append(b"x").is_err());
    // An unsynced directory entry vanishes or survives, depending on the seed.
    let mut saw = [false, false];
    for seed in 0..32 {
        let fs = SimFs::new();
        fs.create_dir_all(d).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        fs.create_file(&d.join("b")).unwrap();
        fs.crash(&mut StdRng::seed_from_u64(seed));
        saw[fs.file_contents(&d.join("b")).is_some() as usize] = true;
    }
    assert_eq!(saw, [true, true]);
}

#[test]
fn simfs_unsynced_directory_can_vanish_with_its_synced_files() {
    let mut saw = [false, false];
    for seed in 0..32 {
        let fs = SimFs::new();
        fs.create_dir_all(Path::new("/a/b")).unwrap();
        let mut f = fs.create_file(Path::new("/a/b/f")).unwrap();
        f.append(b"x").unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(Path::new("/a/b")).unwrap();
        fs.crash(&mut StdRng::seed_from_u64(seed));
        saw[fs.file_contents(Path::new("/a/b/f")).is_some() as usize] = true;
    }
    assert_eq!(saw, [true, true]);
}

/// A WAL opened in a directory that does not exist yet (first start): the directories it
/// creates must survive a power loss, or so do none of the records fsynced inside them.
#[test]
fn wal_directories_created_at_first_start_survive_power_loss() {
    for seed in 0..32 {
        let fs = SimFs::new();
        let d = Path::new("/data/member/wal");
        let (wal, _) = Wal::open_with_fs(Arc::new(fs.clone()), d, WalOptions::default()).unwrap();
        wal.write_sync(vec![entry(1, 10)]).unwrap();
        drop(wal);
        fs.crash(&mut StdRng::seed_from_u64(seed));
        let (_w, got) = Wal::open_with_fs(Arc::new(fs.clone()), d, WalOptions::default())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(got, vec![entry(1, 10)], "seed {seed}");
    }
}

#[test]
fn create_dir_durable_syncs_the_parent_of_every_directory_it_creates() {
    let fs = SimFs::new();
    fs.create_dir_all(Path::new("/x")).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    let before = fs.mutating_ops();
    create_dir_durable(&fs, Path::new("/x/a/b/c")).unwrap();
    // One sync_dir each for /x, /x/a and /x/a/b; an existing directory costs nothing.
    assert_eq!(fs.mutating_ops() - before, 3);
    create_dir_durable(&fs, Path::new("/x/a/b/c")).unwrap();
    assert_eq!(fs.mutating_ops() - before, 3);
    for seed in 0..16 {
        let fs2 = fs.clone();
        fs2.crash(&mut StdRng::seed_from_u64(seed));
        assert!(fs2.list_dir(Path::new("/x/a/b/c")).is_ok(), "seed {seed}");
    }
}

/// Writes `n` single-entry batches and returns the segment's bytes, plus the
/// (start, end) of the frame holding entry `k`.
fn one_segment_with_entries(n: u64, k: u64) -> (PathBuf, Vec<u8>, usize) {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    for i in 1..=n {
        wal.write_sync(vec![entry(i, 16)]).unwrap();
    }
    drop(wal);
    let (path, data) = segment_files(&fs).remove(0);
    let (start, _, _) = frames(&data)
        .into_iter()
        .find(|(_, _, f)| *f == Frame::Record(entry(k, 16)))
        .unwrap();
    (path, data, start)
}

/// The last complete batch is followed only by torn bytes of a later batch (no valid frame
/// in them). Those bytes exist only because the later batch was written, which happens only
/// after the damaged batch's fdatasync: so the damaged batch was acknowledged, and dropping
/// it would lose acknowledged records.
#[test]
fn damage_in_a_batch_followed_by_torn_bytes_of_a_later_batch_is_corrupt() {
    let (path, data, start) = one_segment_with_entries(5, 5);
    let partial = {
        let mut v = Vec::new();
        format::encode_record(&entry(6, 9000), &mut v).unwrap();
        v.truncate(5000);
        v
    };
    for (name, tail) in [("short", vec![3u8, 0, 0]), ("partial", partial)] {
        let mut bad = [data.clone(), tail].concat();
        bad[start + FRAME_HEADER_LEN + 3] ^= 0x10;
        let fs = sim_with_files(&[(path.clone(), bad.clone())]);
        match open_sim(&fs, 1 << 20) {
            Err(WalError::Corrupt { file, offset, .. }) => {
                assert_eq!(file, path, "{name}");
                assert_eq!(offset, start as u64, "{name}");
            }
            other => panic!("{name}: expected Corrupt, got {:?}", other.map(|r| r.1)),
        }
        // Nothing was truncated.
        assert_eq!(fs.file_contents(&path).unwrap(), bad, "{name}");
    }
    // Without the later bytes the same damage is a torn tail (it cannot be told apart), and
    // zeros are no later bytes: they are what the segment's reserved blocks hold.
    for (name, tail) in [("nothing", vec![]), ("zeros", vec![0u8; 4096])] {
        let mut bad = [data.clone(), tail].concat();
        bad[start + FRAME_HEADER_LEN + 3] ^= 0x10;
        let fs = sim_with_files(&[(path.clone(), bad)]);
        let (_w, got) = open_sim(&fs, 1 << 20).unwrap();
        assert_eq!(
            got,
            (1..=4).map(|i| entry(i, 16)).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

/// A later segment file exists only if every batch of the earlier one was fdatasynced, even
/// when it holds no valid frame (or only a torn header).
#[test]
fn damage_before_an_empty_or_torn_next_segment_is_corrupt() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 200).unwrap();
    for i in 1..=8 {
        wal.write_sync(vec![entry(i, 50)]).unwrap();
    }
    drop(wal);
    let files = segment_files(&fs);
    let n = files.len();
    assert!(n >= 3, "{n} segments");
    let (last_path, last_data) = files[n - 1].clone();
    let fr = frames(&last_data);
    // The last batch's entry: nothing of a later batch follows it in this file.
    let (start, _, _) = fr
        .iter()
        .rev()
        .find(|(_, _, f)| matches!(f, Frame::Record(Record::Entry { .. })))
        .cloned()
        .unwrap();
    let next = super::segment_path(&dir(), n as u64);
    let header = format::encode_header(n as u64).to_vec();
    for (name, next_data) in [
        ("header only", header.clone()),
        ("header + zeros", [header.clone(), vec![0; 100]].concat()),
        ("torn header", header[..10].to_vec()),
        ("empty", vec![]),
    ] {
        let mut f = files.clone();
        f[n - 1].1[start + FRAME_HEADER_LEN + 1] ^= 1;
        f.push((next.clone(), next_data));
        let fs = sim_with_files(&f);
        match open_sim(&fs, 200) {
            Err(WalError::Corrupt { file, offset, .. }) => {
                assert_eq!(file, last_path, "{name}");
                assert_eq!(offset, start as u64, "{name}");
            }
            other => panic!("{name}: expected Corrupt, got {:?}", other.map(|r| r.1)),
        }
        assert_eq!(segment_files(&fs).len(), n + 1, "{name}: nothing removed");
    }
}

/// Segments 0..n written, no purge; one in the middle vanishes. The older ones hold entries
/// no purge point covers: refuse, naming the missing segment, and delete nothing.
#[test]
fn hole_not_covered_by_the_purge_point_is_refused() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 200).unwrap();
    for i in 1..=20 {
        wal.write_sync(vec![entry(i, 50)]).unwrap();
    }
    drop(wal);
    let mut files = segment_files(&fs);
    assert!(files.len() >= 5);
    let (missing, _) = files.remove(2);
    let fs = sim_with_files(&files);
    match open_sim(&fs, 200) {
        Err(e @ WalError::MissingSegment { .. }) => {
            let WalError::MissingSegment { missing: m, .. } = &e else {
                unreachable!()
            };
            assert_eq!(m, &missing);
            assert!(
                e.to_string().contains(&missing.display().to_string()),
                "{e}"
            );
        }
        other => panic!("expected MissingSegment, got {:?}", other.map(|r| r.1)),
    }
    assert_eq!(segment_files(&fs), files, "nothing deleted");
}

/// An interrupted purge: the PurgeUpTo is durable, the unlink of its newest condemned segment
/// reached the disk but not those of older ones. Those are covered and are removed.
/// If the missing segment held entries above the purge point, the log after the hole does not
/// continue from it: refused.
#[test]
fn hole_left_by_an_interrupted_purge() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 200).unwrap();
    for i in 1..=12 {
        wal.write_sync(vec![entry(i, 50)]).unwrap();
    }
    let before = segment_files(&fs);
    let purge = Record::PurgeUpTo {
        index: 6,
        data: b"6".to_vec(),
    };
    wal.write_sync(vec![purge.clone()]).unwrap();
    wal.write_sync(vec![entry(13, 50)]).unwrap();
    drop(wal);
    let after = segment_files(&fs);
    let removed: Vec<_> = before
        .iter()
        .filter(|(p, _)| !after.iter().any(|(q, _)| q == p))
        .cloned()
        .collect();
    assert!(removed.len() >= 2, "{} removed", removed.len());
    // Covered: the older condemned segments survive, the newest condemned one is gone.
    let mut files = removed[..removed.len() - 1].to_vec();
    files.extend(after.iter().cloned());
    let fs2 = sim_with_files(&files);
    let (_w, got) = open_sim(&fs2, 200).unwrap();
    assert_eq!(segment_files(&fs2).len(), after.len());
    let entries: Vec<u64> = got
        .iter()
        .filter_map(|r| match r {
            Record::Entry { index, .. } if *index > 6 => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(entries, (7..=13).collect::<Vec<_>>());
    assert!(got.contains(&purge));

    // Not covered: the first surviving segment after the purge is missing too, so the log
    // after the hole starts above the purge point + 1.
    let mut files = removed.clone();
    files.extend(after[1..].iter().cloned());
    let fs3 = sim_with_files(&files);
    match open_sim(&fs3, 200) {
        Err(WalError::MissingSegment { missing, .. }) => assert_eq!(missing, after[0].0),
        other => panic!("expected MissingSegment, got {:?}", other.map(|r| r.1)),
    }
    assert_eq!(segment_files(&fs3), files, "nothing deleted");
}

/// An oversized record is refused by itself; the WAL keeps working (refused in the flusher,
/// it would poison the WAL and stop the member; see
/// docs/decisions/0009-request-size-bounded-at-start.md).
#[test]
fn oversized_record_is_refused_without_poisoning() {
    let fs = SimFs::new();
    let (wal, _) = open_sim(&fs, 1 << 20).unwrap();
    wal.write_sync(vec![entry(1, 10)]).unwrap();
    // Zeroed allocations are lazy: this costs no 128 MiB of writes.
    let huge = Record::Entry {
        index: 2,
        data: vec![0; format::MAX_PAYLOAD - 7],
    };
    match wal.write_sync(vec![huge]) {
        Err(WalError::RecordTooLarge { len }) => assert_eq!(len, format::MAX_PAYLOAD + 1),
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    wal.write_sync(vec![entry(2, 10)]).unwrap();
    drop(wal);
    let (_w, got) = open_sim(&fs, 1 << 20).unwrap();
    assert_eq!(got, vec![entry(1, 10), entry(2, 10)]);
}

/// Entries read back by index: across segments, after a rewrite, across a reopen (from the
/// recovered frames), and cut short once a purge unlinks their segment.
#[test]
fn entries_are_read_back_by_index() {
    let fs = SimFs::new();
    let (w, _) = open_sim(&fs, 4096).unwrap();
    for i in 0..40 {
        w.write_sync(vec![entry(i, 300)]).unwrap();
    }
    assert!(
        segment_files(&fs).len() > 2,
        "the test needs several segments"
    );
    let data_of = |i: u64| match entry(i, 300) {
        Record::Entry { data, .. } => data,
        _ => unreachable!(),
    };
    let got = w.read_entries(0..40, usize::MAX).unwrap();
    assert_eq!(got, (0..40).map(data_of).collect::<Vec<_>>());
    assert_eq!(w.read_entries(5..9, 1).unwrap(), vec![data_of(5)]);
    assert_eq!(w.read_entries(38..100, usize::MAX).unwrap().len(), 2);

    // A rewrite after a truncation replaces what an index reads back.
    w.write_sync(vec![
        Record::TruncateAfter { index: Some(29) },
        Record::Entry {
            index: 30,
            data: b"new".to_vec(),
        },
    ])
    .unwrap();
    assert_eq!(w.read_entries(29..40, usize::MAX).unwrap().len(), 2);
    assert_eq!(
        w.read_entries(30..31, usize::MAX).unwrap(),
        vec![b"new".to_vec()]
    );
    drop(w);

    let (w, _) = open_sim(&fs, 4096).unwrap();
    assert_eq!(w.read_entries(0..29, usize::MAX).unwrap().len(), 29);
    assert_eq!(
        w.read_entries(30..31, usize::MAX).unwrap(),
        vec![b"new".to_vec()]
    );
    w.write_sync(vec![Record::PurgeUpTo {
        index: 20,
        data: vec![],
    }])
    .unwrap();
    let rest = w.read_entries(0..31, usize::MAX).unwrap();
    assert_eq!(rest.len(), 10, "entries 21..=30");
    assert_eq!(rest[0], data_of(21));
}

/// An entry whose bytes changed on disk after it was written is refused when read back
/// (`Corrupt`, naming the file and the frame), not returned.
#[test]
fn a_damaged_entry_is_refused_when_read_back() {
    let fs = SimFs::new();
    let (w, _) = open_sim(&fs, 1 << 20).unwrap();
    for i in 0..10 {
        w.write_sync(vec![entry(i, 100)]).unwrap();
    }
    let (path, data) = segment_files(&fs).pop().unwrap();
    let (at, _, _) = frames(&data)
        .into_iter()
        .find(|(_, _, f)| matches!(f, Frame::Record(Record::Entry { index: 5, .. })))
        .unwrap();
    let mut f = fs.open_file(&path).unwrap();
    f.write_at((at + FRAME_HEADER_LEN + 20) as u64, &[0xff])
        .unwrap();
    assert_eq!(w.read_entries(0..5, usize::MAX).unwrap().len(), 5);
    match w.read_entries(4..8, usize::MAX) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!((file, offset), (path, at as u64))
        }
        other => panic!("{other:?}"),
    }
}

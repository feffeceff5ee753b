//! Reserved segment blocks: a new segment reserves `segment_size` bytes of zeros, recovery
//! treats zeros after the last frame of the last segment as its clean end, and rotation cuts
//! what a segment did not fill, so no other segment ever ends in zeros.

use std::sync::Arc;

use super::tests::{dir, entry, frames_end, sim_with_files};
use super::*;

fn open(fs: &SimFs, segment_size: u64) -> (Wal, Vec<Record>) {
    let opts = WalOptions {
        segment_size,
        ..Default::default()
    };
    Wal::open_with_fs(Arc::new(fs.clone()), &dir(), opts).unwrap()
}

/// The segment files, oldest first, reserved zeros and all.
fn segments(fs: &SimFs) -> Vec<Vec<u8>> {
    let mut names = fs.list_dir(&dir()).unwrap();
    names.sort();
    names
        .iter()
        .map(|n| fs.file_contents(&dir().join(n)).unwrap())
        .collect()
}

#[test]
fn a_new_segment_reserves_its_blocks_on_a_real_file_system() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal");
    let opts = WalOptions {
        segment_size: 1 << 20,
        ..Default::default()
    };
    let (wal, _) = Wal::open(&path, opts.clone()).unwrap();
    wal.write_sync(vec![entry(1, 100), entry(2, 100)]).unwrap();
    drop(wal);
    let seg = segment_path(&path, 0);
    // Every file system the tests run on (ext4, XFS, tmpfs) reserves with fallocate.
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), 1 << 20);
    let (wal, got) = Wal::open(&path, opts.clone()).unwrap();
    assert_eq!(got, vec![entry(1, 100), entry(2, 100)]);
    wal.write_sync(vec![entry(3, 100)]).unwrap();
    drop(wal);
    let (_wal, got) = Wal::open(&path, opts).unwrap();
    assert_eq!(got.len(), 3, "writing resumed where the frames ended");
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), 1 << 20);
}

#[test]
fn zeros_after_the_last_frame_are_a_clean_end_and_writing_resumes_there() {
    let fs = SimFs::new();
    let (wal, _) = open(&fs, 64 << 10);
    wal.write_sync(vec![entry(1, 300)]).unwrap();
    drop(wal);
    let before = segments(&fs).remove(0);
    assert_eq!(before.len(), 64 << 10, "the segment's blocks are reserved");
    let end = frames_end(&before);
    assert!(before[end..].iter().all(|&b| b == 0));

    let (wal, got) = open(&fs, 64 << 10);
    assert_eq!(got, vec![entry(1, 300)]);
    assert_eq!(
        segments(&fs).remove(0),
        before,
        "a clean end is not repaired"
    );
    wal.write_sync(vec![entry(2, 300)]).unwrap();
    drop(wal);
    let after = segments(&fs).remove(0);
    assert_eq!(after[..end], before[..end]);
    assert!(
        frames_end(&after) > end,
        "the next batch starts at the old end"
    );
    let (_wal, got) = open(&fs, 64 << 10);
    assert_eq!(got, vec![entry(1, 300), entry(2, 300)]);
}

#[test]
fn rotation_cuts_the_reservation_so_only_the_last_segment_ends_in_zeros() {
    let fs = SimFs::new();
    let (wal, _) = open(&fs, 4096);
    let mut want = Vec::new();
    for i in 1..=40 {
        wal.write_sync(vec![entry(i, 500)]).unwrap();
        want.push(entry(i, 500));
    }
    drop(wal);
    let segs = segments(&fs);
    assert!(segs.len() > 3, "{} segments", segs.len());
    for (k, s) in segs[..segs.len() - 1].iter().enumerate() {
        assert_eq!(frames_end(s), s.len(), "segment {k} holds only frames");
    }
    let entries = |got: Vec<Record>| -> Vec<Record> {
        got.into_iter()
            .filter(|r| matches!(r, Record::Entry { .. }))
            .collect()
    };
    let (_wal, got) = open(&fs, 4096);
    assert_eq!(entries(got), want);
}

/// A segment reserved for a bigger segment size than the next run's: the next run rotates
/// out of it early, and the zeros it leaves must not read as damage in a segment that has a
/// successor.
#[test]
fn a_smaller_segment_size_after_a_restart_still_opens() {
    let fs = SimFs::new();
    let (wal, _) = open(&fs, 1 << 20);
    wal.write_sync(vec![entry(1, 100)]).unwrap();
    drop(wal);
    let (wal, _) = open(&fs, 4096);
    for i in 2..=30 {
        wal.write_sync(vec![entry(i, 500)]).unwrap();
    }
    drop(wal);
    assert!(segments(&fs).len() > 2);
    let (_wal, got) = open(&fs, 4096);
    let n = got
        .iter()
        .filter(|r| matches!(r, Record::Entry { .. }))
        .count();
    assert_eq!(n, 30);
}

/// A segment written before segments reserved their blocks ends at its last frame; it gets
/// its reservation when opened, and its frames are untouched.
#[test]
fn a_segment_without_a_reservation_gets_one_when_opened() {
    let fs = SimFs::new();
    let (wal, _) = open(&fs, 1 << 16);
    wal.write_sync(vec![entry(1, 100), entry(2, 100)]).unwrap();
    drop(wal);
    let path = segment_path(&dir(), 0);
    let full = segments(&fs).remove(0);
    let written = full[..frames_end(&full)].to_vec();
    let legacy = sim_with_files(&[(path, written.clone())]);

    let (wal, got) = open(&legacy, 1 << 16);
    assert_eq!(got, vec![entry(1, 100), entry(2, 100)]);
    let now = segments(&legacy).remove(0);
    assert_eq!(now.len(), 1 << 16);
    assert_eq!(now[..written.len()], written[..]);
    wal.write_sync(vec![entry(3, 100)]).unwrap();
    drop(wal);
    let (_wal, got) = open(&legacy, 1 << 16);
    assert_eq!(got.len(), 3);
}

/// Garbage inside the reserved zeros (a torn write of the last batch) is cut, and the cut
/// segment is reserved again.
#[test]
fn a_torn_tail_inside_the_reservation_is_cut_and_reserved_again() {
    let fs = SimFs::new();
    let (wal, _) = open(&fs, 1 << 16);
    wal.write_sync(vec![entry(1, 100)]).unwrap();
    drop(wal);
    let mut data = segments(&fs).remove(0);
    let end = frames_end(&data);
    data[end + 4000..end + 4100].fill(0xa5);
    let path = segment_path(&dir(), 0);
    let torn = sim_with_files(&[(path, data)]);

    let (_wal, got) = open(&torn, 1 << 16);
    assert_eq!(got, vec![entry(1, 100)]);
    let now = segments(&torn).remove(0);
    assert_eq!(now.len(), 1 << 16);
    assert!(now[end..].iter().all(|&b| b == 0), "the garbage is gone");
}

/// A page lost inside the last batch, its later frames (end marker included) intact, then the
/// reserved zeros: a torn write, repaired, since zeros after the batch prove no later batch.
#[test]
fn a_lost_page_in_the_last_batch_before_the_reserved_zeros_is_torn() {
    let fs = SimFs::new();
    let (wal, _) = open(&fs, 1 << 16);
    wal.write_sync(vec![entry(1, 10)]).unwrap();
    wal.write_sync((2..40).map(|i| entry(i, 500)).collect())
        .unwrap();
    drop(wal);
    let mut data = segments(&fs).remove(0);
    assert!(frames_end(&data) > 12288 && data.len() == 1 << 16);
    data[8192..12288].fill(0);
    let torn = sim_with_files(&[(segment_path(&dir(), 0), data)]);
    let (_wal, got) = open(&torn, 1 << 16);
    assert_eq!(got.first(), Some(&entry(1, 10)));
    assert!(got.len() < 39, "the batch is cut at the lost page");
}

/// A reservation that fails (a full disk, say) only costs speed: the WAL opens and keeps
/// taking writes, which grow the segment by appends.
#[test]
fn a_failed_reservation_is_not_an_error() {
    let setup = || {
        let fs = SimFs::new();
        let (wal, _) = open(&fs, 1 << 16);
        wal.write_sync(vec![entry(1, 100)]).unwrap();
        drop(wal);
        fs
    };
    // The first I/O of reopening is the last segment's reservation.
    let probe = setup();
    probe.fail_after(0);
    let opts = WalOptions {
        segment_size: 1 << 16,
        ..Default::default()
    };
    assert!(Wal::open_with_fs(Arc::new(probe.clone()), &dir(), opts).is_err());
    assert_eq!(probe.tripped_on(), Some("allocate"));

    let fs = setup();
    fs.fail_once_after(0);
    let (wal, got) = open(&fs, 1 << 16);
    assert_eq!(got, vec![entry(1, 100)]);
    wal.write_sync(vec![entry(2, 100)]).unwrap();
    drop(wal);
    let (_wal, got) = open(&fs, 1 << 16);
    assert_eq!(got, vec![entry(1, 100), entry(2, 100)]);
}

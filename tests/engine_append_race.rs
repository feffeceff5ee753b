//! An append to the history's last leaf whose leaf moved between the read and the replace (the
//! race with sled's segment cleaner, which rewrites pages in place) frees the leaves it
//! allocated and tries again, and after `APPEND_ATTEMPTS` such failures writes the entries
//! one insert at a time; either way nothing is lost or doubled, in a batch as in a
//! transaction's commit, and after a reopen (freed page ids are reused by the next appends).
//!
//! The race is made, not waited for: sled's test hook (`kvd_test_hooks::LAST_LEAF_MOVES`,
//! third_party/sled) rewrites the leaf just before the append replaces it. The hook is a
//! process-wide counter, so this binary has one test.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering::SeqCst;

use sled::kvd_test_hooks::LAST_LEAF_MOVES;
use sled::transaction::{ConflictableTransactionError, Transactional};
use sled::{Batch, Db, Tree};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn val(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; 200 + (i % 61) as usize]
}

fn batch(keys: Range<u64>, model: &mut Model) -> Batch {
    let mut b = Batch::default();
    for i in keys {
        b.insert(key(i), val(i));
        model.insert(key(i), val(i));
    }
    b
}

/// Opens the database as kvd does (no periodic flusher thread). A database just dropped may
/// still be held for a moment by one of sled's threads, so a held lock is waited for.
fn open(dir: &std::path::Path) -> (Db, Tree, Tree) {
    let config = sled::Config::new().path(dir).flush_every_ms(None);
    let mut tries = 0;
    let db = loop {
        match config.open() {
            Ok(db) => break db,
            Err(sled::Error::Io(e)) if e.kind() == std::io::ErrorKind::Other && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("opening {}: {e}", dir.display()),
        }
    };
    let history = db.open_tree("history").unwrap();
    let meta = db.open_tree("meta").unwrap();
    (db, history, meta)
}

fn check(history: &Tree, model: &Model) {
    let got: Model = history
        .iter()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    assert_eq!(got.len(), model.len(), "entries");
    assert!(got == *model, "the history differs from what was written");
    for (k, v) in model.iter().step_by(97) {
        assert_eq!(history.get(k).unwrap().as_deref(), Some(&v[..]));
    }
}

/// Sets `moves` leaf moves, runs `f`, and returns how many the appends used.
fn with_moves(moves: usize, f: impl FnOnce()) -> usize {
    LAST_LEAF_MOVES.store(moves, SeqCst);
    f();
    moves - LAST_LEAF_MOVES.swap(0, SeqCst)
}

#[test]
fn an_append_whose_leaf_moved_is_retried_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    {
        let (db, history, meta) = open(dir.path());
        // A tree that is a single leaf takes inserts; this one splits it.
        history
            .apply_batch_appending(batch(0..100, &mut model))
            .unwrap();

        // Three moves, fewer than the four attempts: the append frees and retries.
        let used = with_moves(3, || {
            history
                .apply_batch_appending(batch(100..400, &mut model))
                .unwrap()
        });
        assert_eq!(used, 3, "the append did not reach its replace three times");
        check(&history, &model);

        // A move at every attempt: the entries go in one insert at a time.
        let used = with_moves(1_000, || {
            history
                .apply_batch_appending(batch(400..700, &mut model))
                .unwrap()
        });
        assert!(used >= 4, "the appends gave up after {used} moves");
        check(&history, &model);

        // In a transaction's commit, with the meta tree beside it.
        let staged = batch(700..1000, &mut model);
        let used = with_moves(2, || {
            (&history, &meta)
                .transaction(|(h, m)| {
                    h.apply_batch_appending(&staged)?;
                    m.insert(&b"applied"[..], &999u64.to_be_bytes()[..])?;
                    Ok::<(), ConflictableTransactionError<()>>(())
                })
                .unwrap()
        });
        assert_eq!(
            used, 2,
            "the commit's append did not reach its replace twice"
        );
        check(&history, &model);
        db.flush().unwrap();
    }
    {
        let (db, history, meta) = open(dir.path());
        check(&history, &model);
        assert_eq!(
            meta.get(b"applied").unwrap().as_deref(),
            Some(&999u64.to_be_bytes()[..])
        );
        // Appends after the reopen reuse the freed pages' ids.
        for start in (1000..3000).step_by(250) {
            history
                .apply_batch_appending(batch(start..start + 250, &mut model))
                .unwrap();
        }
        check(&history, &model);
        db.flush().unwrap();
    }
    let (_db, history, _meta) = open(dir.path());
    check(&history, &model);
}

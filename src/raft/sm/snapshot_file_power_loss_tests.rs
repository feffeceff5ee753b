//! Power loss while a snapshot file is put in place (a build, or an install of another
//! member's image, or a restore's snapshot) and older ones removed, on the simulated file
//! system.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::mvcc::{META_TREE, REV_TREE};
use crate::raft::sm::snapshot_file_install::*;
use crate::wal::{create_dir_durable, SimFs};
use std::sync::Arc;

fn dir() -> &'static Path {
    Path::new("/member/sm/snap")
}

fn meta_at(index: u64) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(openraft::testing::log_id::<crate::raft::TypeConfig>(
            1, 1, index,
        )),
        ..Default::default()
    }
}

/// Entries spanning a few simulated pages, different for each `seed`.
fn entries(n: usize, seed: u8) -> Vec<Entry> {
    (0..n)
        .map(|i| {
            let tree = if i % 3 == 0 { META_TREE } else { REV_TREE };
            let v = (0..200).map(|j| (i + j) as u8 ^ seed).collect();
            (tree.to_string(), format!("k{i:06}").into_bytes(), v)
        })
        .collect()
}

fn put(fs: &Arc<dyn WalFs>, meta: &SnapshotMeta, seed: u8) -> Result<PathBuf, StoreError> {
    let e = entries(60, seed);
    write(fs, dir(), meta, e.into_iter().map(Ok::<_, StoreError>))?.publish()
}

/// What a restart finds: the newest snapshot's meta, checked whole (after the removal of
/// temporaries the state machine's open does).
fn newest(fs: &SimFs) -> Option<SnapshotMeta> {
    remove_temporaries(fs, dir()).unwrap();
    let path = snapshot_files(fs, dir()).unwrap().pop()?;
    let bytes = fs.read_file(&path).unwrap();
    let meta = snapshot_format::verify(io::Cursor::new(bytes), &path)
        .unwrap_or_else(|e| panic!("the newest snapshot does not load: {e}"));
    Some(meta)
}

/// With snapshot 10 in place, snapshot 20 is written, put in place and 10 removed: a power
/// loss at any step leaves 10 or 20 as the newest snapshot, whole, and 20 once its publish
/// returned.
#[test]
fn a_power_loss_while_a_snapshot_is_put_in_place_leaves_the_old_or_the_new_one() {
    let (old, new) = (meta_at(10), meta_at(20));
    let mut saw = (false, false);
    for n in 0.. {
        let mut done = false;
        for seed in 0..16 {
            let sim = SimFs::new();
            let fs: Arc<dyn WalFs> = Arc::new(sim.clone());
            create_dir_durable(fs.as_ref(), dir()).unwrap();
            put(&fs, &old, 1).unwrap();
            sim.fail_after(n);
            let published = put(&fs, &new, 2).is_ok();
            if published {
                let _ = remove_through(fs.as_ref(), dir(), &old);
            }
            done = !sim.failpoint_tripped();
            sim.crash(&mut StdRng::seed_from_u64(seed));
            match newest(&sim) {
                Some(m) if m == new => saw.1 = true,
                Some(m) if m == old => {
                    assert!(
                        !published,
                        "failpoint {n}, seed {seed}: a publish that returned Ok was lost"
                    );
                    saw.0 = true;
                }
                other => panic!("failpoint {n}, seed {seed}: newest snapshot {other:?}"),
            }
        }
        if done {
            assert!(n > 10, "only {n} steps");
            break;
        }
    }
    assert_eq!(saw, (true, true), "both outcomes happen");
}

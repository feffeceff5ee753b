//! Power loss during a restore's last steps (the identity written, the assembled data dir
//! renamed into place), on the simulated file system. The state machine under it stands in
//! for sled's, made durable as `write_restored` leaves it.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::wal::{sync_tree, SimFs, WalFile};

const ENGINE: &str = "member/sm/db/db";

fn ident() -> Identity {
    identity::new_cluster(
        "m1",
        &["http://10.0.0.1:2380".to_string()],
        &BTreeMap::from([("m1".to_string(), vec!["http://10.0.0.1:2380".to_string()])]),
        "token",
    )
}

/// `data_dir`'s temporary sibling holding a durable state machine, as a restore assembles it.
fn assembled(fs: &SimFs, data_dir: &Path) -> PathBuf {
    let part = part_dir(data_dir);
    let engine = part.join(ENGINE);
    create_dir_durable(fs, parent_dir_of(&engine)).unwrap();
    let mut f: Box<dyn WalFile> = fs.create_file(&engine).unwrap();
    f.append(b"restored state").unwrap();
    drop(f);
    sync_tree(fs, &part).unwrap();
    part
}

fn parent_dir_of(p: &Path) -> &Path {
    p.parent().expect("a file in a directory")
}

/// At every step, a power loss leaves no data dir (the restore did not finish: it is run
/// again) or the whole one, with its identity and state; the whole one once
/// `put_in_place` returned.
#[test]
fn a_power_loss_while_a_restore_is_put_in_place_leaves_no_data_dir_or_a_whole_one() {
    let data_dir = Path::new("/var/lib/kvd");
    let mut saw = (false, false);
    for n in 0.. {
        let mut done = false;
        for seed in 0..16 {
            let fs = SimFs::new();
            let part = assembled(&fs, data_dir);
            fs.fail_after(n);
            let placed = put_in_place(&fs, &part, data_dir, &ident()).is_ok();
            done = !fs.failpoint_tripped();
            fs.crash(&mut StdRng::seed_from_u64(seed));
            if !fs.is_dir(data_dir) {
                assert!(
                    !placed,
                    "failpoint {n}, seed {seed}: a finished restore was lost"
                );
                saw.0 = true;
                continue;
            }
            saw.1 = true;
            assert_eq!(
                fs.file_contents(&data_dir.join(ENGINE)).as_deref(),
                Some(&b"restored state"[..]),
                "failpoint {n}, seed {seed}"
            );
            let json = fs
                .file_contents(&data_dir.join("member/member.json"))
                .unwrap_or_else(|| panic!("failpoint {n}, seed {seed}: no identity"));
            let got: Identity = serde_json::from_slice(&json)
                .unwrap_or_else(|e| panic!("failpoint {n}, seed {seed}: identity: {e}"));
            assert_eq!(
                got.member_id,
                ident().member_id,
                "failpoint {n}, seed {seed}"
            );
        }
        if done {
            assert!(n >= 3, "only {n} steps");
            break;
        }
    }
    assert_eq!(saw, (true, true), "both outcomes happen");
}

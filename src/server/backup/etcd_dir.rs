//! Recognising a data dir that etcd wrote: kvd cannot read it, and starting on it as if it
//! were empty would bring up an empty cluster where the operator expects their data.

use std::path::Path;

/// What in `data_dir` shows it is etcd's, if it is etcd's and not kvd's.
pub fn etcd_marker(data_dir: &Path) -> Option<String> {
    let member = data_dir.join("member");
    if member.join("member.json").exists() {
        return None;
    }
    let db = member.join("snap").join("db");
    if db.is_file() {
        return Some(db.display().to_string());
    }
    etcd_wal_file(&member.join("wal")).map(|p| p.display().to_string())
}

/// A WAL segment etcd wrote in `dir`, if there is one: etcd names its segments
/// `<seq>-<index>.wal`, kvd `<seq>.wal`.
pub fn etcd_wal_file(dir: &Path) -> Option<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".wal") && n.contains('-'))
        .map(|n| dir.join(n))
}

/// The error kvd starts with on an etcd data dir.
pub fn refusal(data_dir: &Path, marker: &str) -> String {
    format!(
        "{} is an etcd data dir (found {marker}); kvd does not read etcd's files. To move the \
         data to kvd: take a backup with `etcdctl snapshot save FILE` (from the running etcd) and \
         restore it into a new data dir with `kvctl snapshot restore FILE --data-dir ...`",
        data_dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_layouts_are_recognised_and_kvd_ones_are_not() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(etcd_marker(d.path()), None);
        let wal = d.path().join("member/wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::write(wal.join("0000000000000000.wal"), b"").unwrap();
        assert_eq!(etcd_marker(d.path()), None, "kvd's WAL segment");
        std::fs::write(wal.join("0000000000000000-0000000000000000.wal"), b"").unwrap();
        assert!(etcd_marker(d.path())
            .unwrap()
            .ends_with("-0000000000000000.wal"));
        std::fs::create_dir_all(d.path().join("member/snap")).unwrap();
        std::fs::write(d.path().join("member/snap/db"), b"").unwrap();
        assert!(etcd_marker(d.path()).unwrap().ends_with("snap/db"));
        std::fs::write(d.path().join("member/member.json"), b"{}").unwrap();
        assert_eq!(etcd_marker(d.path()), None, "kvd's identity wins");
    }
}

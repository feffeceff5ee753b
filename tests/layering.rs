//! The layer rule, checked on the source: dependencies point down,
//! metrics ← wal ← mvcc ← raft ← server ← cmd, with `metrics` and `proto` (generated etcd and
//! peer messages) as leaves any layer may use, and `sync` (the lock-poison policy) below them
//! all. A file in a layer may name its own layer and the layers below it, never one above. The test-only crate (`testkit/`) is named by tests
//! only. The rule is about module paths, so it reads `crate::<module>` and `kvd::<module>`
//! paths; grouped imports (`crate::{a, b}`) are refused so that every path is visible here.

use std::path::{Path, PathBuf};

/// Top-level modules of the library, with their rank: a module may name ranks <= its own.
const LAYERS: &[(&str, u32)] = &[
    ("sync", 0),
    ("bbolt", 0),
    ("metrics", 0),
    ("proto", 0),
    ("wal", 1),
    ("mvcc", 2),
    ("auth", 2),
    ("raft", 3),
    ("server", 4),
];

fn rank(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every module named right after `prefix` (`crate::`, `kvd::`) in `text`.
fn named_modules<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.match_indices(prefix)
        .filter(|(i, _)| {
            // `kvd::` inside `kvd_testkit::` or another identifier is not a path into kvd.
            *i == 0 || {
                let b = text.as_bytes()[i - 1];
                !(b.is_ascii_alphanumeric() || b == b'_')
            }
        })
        .map(|(i, _)| {
            let rest = &text[i + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// Whether some `super::super::..` chain in `text` climbs out of the file's top-level module
/// to the crate root, where it could name any layer unseen by the check above.
fn super_chain_reaches_root(rel: &Path, text: &str) -> bool {
    let dirs = rel.components().count() - 1;
    let is_mod = rel.file_name().is_some_and(|n| n == "mod.rs");
    // How many `super::` the file's module is below the crate root.
    let depth = if is_mod { dirs } else { dirs + 1 };
    let longest = text
        .match_indices("super::")
        .map(|(i, _)| {
            let mut n = 0;
            let mut rest = &text[i..];
            while let Some(r) = rest.strip_prefix("super::") {
                n += 1;
                rest = r;
            }
            n
        })
        .max()
        .unwrap_or(0);
    longest >= depth
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_module_names_a_layer_above_it() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let Some(top) = rel.components().next() else {
            continue;
        };
        let top = top.as_os_str().to_str().unwrap().trim_end_matches(".rs");
        if top == "lib" {
            continue;
        }
        let own = rank(top).unwrap_or_else(|| {
            panic!(
                "{}: module `{top}` has no layer in tests/layering.rs",
                rel.display()
            )
        });
        let text = std::fs::read_to_string(f).unwrap();
        if text.contains("crate::{") {
            violations.push(format!("{}: grouped `crate::{{..}}` import", rel.display()));
        }
        for m in named_modules(&text, "crate::") {
            checked += 1;
            match rank(m) {
                Some(r) if r > own => violations.push(format!(
                    "{}: layer `{top}` names `crate::{m}`, a layer above it",
                    rel.display()
                )),
                // Leaves may name nothing but themselves and `sync`, the lock-poison policy.
                Some(0) if own == 0 && m != top && m != "sync" => violations.push(format!(
                    "{}: leaf `{top}` names `crate::{m}`",
                    rel.display()
                )),
                Some(_) => {}
                None => violations.push(format!(
                    "{}: names `crate::{m}`, which has no layer",
                    rel.display()
                )),
            }
        }
        if super_chain_reaches_root(rel, &text) {
            violations.push(format!(
                "{}: a `super::` chain reaches the crate root; name `crate::..` instead",
                rel.display()
            ));
        }
        if text.contains("kvd_testkit") {
            violations.push(format!("{}: library code names kvd_testkit", rel.display()));
        }
    }
    assert!(checked > 100, "the scan found only {checked} paths");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Inside the Raft layer, the parts named by folders keep their order (src/raft/mod.rs): the
/// leaves, then the state machine (`sm/`) and the log (`log/`), which do not know each other,
/// then the transport (`net/`), then the node. A part names the leaves and the parts below it,
/// never one above. A test module (`*_tests.rs`) may drive its part through a higher one.
#[test]
fn the_raft_layers_parts_keep_their_order() {
    const LEAVES: &[&str] = &["types", "codec", "error", "limits", "log_format"];
    let parts: &[(&str, &[&str])] = &[("sm", &[]), ("log", &[]), ("net", &["sm"])];
    let raft = root().join("src").join("raft");
    let mut violations = Vec::new();
    let mut checked = 0;
    for (part, below) in parts {
        let mut files = Vec::new();
        rust_files(&raft.join(part), &mut files);
        assert!(!files.is_empty(), "src/raft/{part} has no files");
        for f in files {
            let name = f.file_name().unwrap().to_str().unwrap();
            if name.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            if text.contains("super::super::") {
                violations.push(format!("{rel}: a `super::super::` path leaves its part"));
            }
            if text.contains("crate::raft::{") {
                violations.push(format!("{rel}: grouped `crate::raft::{{..}}` import"));
            }
            for m in named_modules(&text, "crate::raft::") {
                checked += 1;
                let allowed = m == *part || LEAVES.contains(&m) || below.contains(&m);
                if !allowed {
                    violations.push(format!("{rel}: `{part}` names `crate::raft::{m}`"));
                }
            }
        }
    }
    assert!(checked > 30, "the scan found only {checked} paths");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Where a field chain `node.<field>` reaches into the Raft node's insides; the fields are
/// private to `src/raft`, so this catches a chain through another name of the node too
/// (`ctx.node.sm`) before the compiler's message would.
fn raft_field_chains(text: &str) -> Vec<&str> {
    const INSIDES: &[&str] = &[
        "sm",
        "raft",
        "log",
        "channels",
        "reads",
        "commit_waits",
        "forwarder",
        "formats",
        "leader_contact",
        "shared",
    ];
    let mut out = Vec::new();
    for (i, _) in text.match_indices("node.") {
        let rest = &text[i + "node.".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let field = &rest[..end];
        // `node.raft()` would be a method; only a field (no call) is a chain.
        if INSIDES.contains(&field) && !rest[end..].starts_with('(') {
            out.push(field);
        }
    }
    out
}

/// Above the Raft layer, the server and the binaries talk to Raft through `RaftNode`'s methods
/// and the types `crate::raft` names: never openraft itself, never the node's fields.
#[test]
fn only_the_raft_layer_names_openraft_or_the_nodes_insides() {
    let mut files = Vec::new();
    rust_files(&root().join("src").join("server"), &mut files);
    rust_files(&root().join("cmd"), &mut files);
    assert!(files.len() > 40, "found only {} files", files.len());
    let mut violations = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(root()).unwrap().display();
        if text.contains("openraft::") {
            violations.push(format!("{rel}: names openraft"));
        }
        for field in raft_field_chains(&text) {
            violations.push(format!("{rel}: reaches into the Raft node's `{field}`"));
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn binaries_do_not_use_test_only_code() {
    let mut files = Vec::new();
    rust_files(&root().join("cmd"), &mut files);
    assert!(!files.is_empty());
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for bad in ["kvd_testkit", "simfs", "SimFs"] {
            assert!(!text.contains(bad), "{}: names {bad}", f.display());
        }
    }
}

#[test]
fn the_chain_scanner_sees_fields_not_methods() {
    let t = "self.ctx.node.sm.auth(); node.raft.metrics(); node.auth(); node.store(); node.id";
    assert_eq!(raft_field_chains(t), ["sm", "raft"]);
}

#[test]
fn the_scanner_sees_paths() {
    let t = "use crate::raft::RaftNode; let x = kvd::wal::Wal::open(); kvd_testkit::check();";
    assert_eq!(named_modules(t, "crate::"), ["raft"]);
    assert_eq!(named_modules(t, "kvd::"), ["wal"]);
}

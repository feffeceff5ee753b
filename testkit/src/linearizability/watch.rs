//! Checks watch streams recorded during a run against each other and against acknowledged
//! writes.
//!
//! For every watch: events come in revision order, no (revision, key) twice, none below the
//! start revision; every write known to be committed in the watch's complete window (start
//! revision through the last revision the watch is known to have delivered) on a watched key
//! is there, with the same value (no gaps); and each event's prev_kv is the key's previous
//! event. A write is known committed if a client got its revision back or any watch delivered
//! it; all watches must agree on what each revision did.

use std::collections::BTreeMap;

use super::history::{Input, Kv, Operation, Outcome, Output};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub key: Vec<u8>,
    pub kind: EventKind,
    /// Empty for a delete.
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub prev: Option<Kv>,
}

/// One watch stream (a re-created watch after a reconnect is a new one).
#[derive(Clone, Debug, Default)]
pub struct WatchHistory {
    pub name: String,
    /// Watched keys: those starting with this prefix.
    pub prefix: Vec<u8>,
    pub start_revision: i64,
    /// Whether prev_kv was requested.
    pub prev_kv: bool,
    pub events: Vec<WatchEvent>,
    /// The revision through which the watch has delivered everything (the last event's, or a
    /// progress notification's header revision).
    pub complete_through: i64,
}

#[derive(Clone, Debug, Default)]
pub struct WatchReport {
    pub watches: usize,
    pub events: usize,
    pub problems: Vec<String>,
}

type Slot = (i64, Vec<u8>);

/// What the write at (revision, key) did: put value, or delete (None).
fn acked_writes(ops: &[Operation]) -> BTreeMap<Slot, Option<Vec<u8>>> {
    let mut m = BTreeMap::new();
    for op in ops {
        let Outcome::Ok(out) = &op.outcome else {
            continue;
        };
        match (&op.input, out) {
            (Input::Put { value }, Output::Put { revision })
            | (
                Input::Cas { value, .. },
                Output::Cas {
                    succeeded: true,
                    revision,
                    ..
                },
            ) => {
                m.insert((*revision, op.key.clone()), Some(value.clone()));
            }
            (
                Input::Delete,
                Output::Delete {
                    deleted: true,
                    revision,
                },
            ) => {
                m.insert((*revision, op.key.clone()), None);
            }
            _ => {}
        }
    }
    m
}

fn effect(e: &WatchEvent) -> Option<Vec<u8>> {
    match e.kind {
        EventKind::Put => Some(e.value.clone()),
        EventKind::Delete => None,
    }
}

pub fn check_watches(ops: &[Operation], watches: &[WatchHistory]) -> WatchReport {
    let mut report = WatchReport {
        watches: watches.len(),
        ..Default::default()
    };
    let p = &mut report.problems;
    // Every committed write anyone saw, and disagreements about them.
    let mut known = acked_writes(ops);
    let acked = known.clone();
    for w in watches {
        for e in &w.events {
            let slot = (e.mod_revision, e.key.clone());
            match known.get(&slot) {
                Some(eff) if *eff != effect(e) => p.push(format!(
                    "{}: event {e:?} disagrees with {} ({eff:?})",
                    w.name,
                    if acked.contains_key(&slot) {
                        "an acknowledged write"
                    } else {
                        "another watch"
                    }
                )),
                Some(_) => {}
                None => {
                    known.insert(slot, effect(e));
                }
            }
        }
    }
    for w in watches {
        report.events += w.events.len();
        let mut last: BTreeMap<&[u8], &WatchEvent> = BTreeMap::new();
        let mut seen: std::collections::HashSet<(i64, &[u8])> = Default::default();
        let mut prev_rev = 0;
        for e in &w.events {
            if e.mod_revision < prev_rev {
                p.push(format!(
                    "{}: event at revision {} after revision {prev_rev}: out of order",
                    w.name, e.mod_revision
                ));
            }
            prev_rev = e.mod_revision;
            if !seen.insert((e.mod_revision, &e.key[..])) {
                p.push(format!("{}: duplicate event {e:?}", w.name));
            }
            if e.mod_revision < w.start_revision || !e.key.starts_with(&w.prefix) {
                p.push(format!("{}: event outside the watch: {e:?}", w.name));
            }
            if w.prev_kv {
                // The key's previous event: in this watch, or from everything known if the
                // watch started before the key's history did.
                let expected: Option<Option<Kv>> = match last.get(&e.key[..]) {
                    Some(prev) => Some(match prev.kind {
                        EventKind::Put => Some(Kv {
                            value: prev.value.clone(),
                            mod_revision: prev.mod_revision,
                        }),
                        EventKind::Delete => None,
                    }),
                    None if w.start_revision <= 1 => Some(None),
                    None => None,
                };
                if let Some(exp) = expected {
                    if e.prev != exp {
                        p.push(format!("{}: prev_kv of {e:?} should be {exp:?}", w.name));
                    }
                }
                if let Some(pk) = &e.prev {
                    if pk.mod_revision >= e.mod_revision {
                        p.push(format!(
                            "{}: prev_kv not older than its event: {e:?}",
                            w.name
                        ));
                    }
                }
            }
            last.insert(&e.key, e);
        }
        // No gaps: everything known committed in the complete window is delivered.
        let have: std::collections::HashSet<Slot> = w
            .events
            .iter()
            .map(|e| (e.mod_revision, e.key.clone()))
            .collect();
        for ((rev, key), eff) in known.range((w.start_revision, Vec::new())..) {
            if *rev > w.complete_through {
                break;
            }
            if key.starts_with(&w.prefix) && !have.contains(&(*rev, key.clone())) {
                p.push(format!(
                    "{}: missing revision {rev} key {:?} ({:?}) though delivered through {}",
                    w.name,
                    String::from_utf8_lossy(key),
                    eff.as_ref()
                        .map(|v| String::from_utf8_lossy(v).into_owned()),
                    w.complete_through
                ));
            }
        }
    }
    report
}

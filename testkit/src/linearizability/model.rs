//! The sequential specification of one etcd key: a register with a mod_revision.
//!
//! `step` answers: if this operation took effect now, on this state, could it have produced the
//! output it did, and what is the state after? Revisions are checked as far as the history
//! tells them: a write with a known revision must have a larger one than every write
//! linearized before it on the key (etcd's revisions grow with commit order); a write whose
//! outcome is unknown leaves the revision unknown until a read reveals it.

use super::history::{Compare, Input, Kv, Operation, Outcome, Output};

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct State {
    pub value: Option<Vec<u8>>,
    /// The revision of the write that set `value` (or deleted the key), if known.
    pub mod_revision: Option<i64>,
    /// The largest known revision of a write linearized so far on this key.
    pub floor: i64,
}

impl State {
    /// The state a successful read of `kv` implies, if it is consistent with `self`.
    fn read(&self, kv: &Option<Kv>) -> Option<State> {
        match kv {
            None => self.value.is_none().then(|| self.clone()),
            Some(kv) => {
                if self.value.as_deref() != Some(&kv.value[..]) {
                    return None;
                }
                let rev_ok = match self.mod_revision {
                    Some(r) => r == kv.mod_revision,
                    None => kv.mod_revision > self.floor,
                };
                rev_ok.then(|| State {
                    value: self.value.clone(),
                    mod_revision: Some(kv.mod_revision),
                    floor: self.floor.max(kv.mod_revision),
                })
            }
        }
    }

    /// Whether `c` holds; `None` when it depends on a revision the history does not reveal.
    fn holds(&self, c: &Compare) -> Option<bool> {
        match c {
            Compare::Value(v) => Some(self.value.as_deref() == Some(&v[..])),
            Compare::ModRevision(x) => match (&self.value, self.mod_revision) {
                (None, _) => Some(*x == 0),
                (Some(_), Some(r)) => Some(r == *x),
                (Some(_), None) => None,
            },
        }
    }

    fn written(&self, value: Option<Vec<u8>>, revision: Option<i64>) -> State {
        State {
            value,
            mod_revision: revision,
            floor: revision.map_or(self.floor, |r| r.max(self.floor)),
        }
    }
}

/// The state after `op` takes effect on `s`, or `None` if it cannot take effect there. An
/// `Unknown` operation is stepped only as "applied" (not applying it is the same as never
/// linearizing it); `Failed` operations and unknown reads never reach here.
pub fn step(s: &State, op: &Operation) -> Option<State> {
    match (&op.input, &op.outcome) {
        (Input::Put { value }, Outcome::Ok(Output::Put { revision })) => {
            (*revision > s.floor).then(|| s.written(Some(value.clone()), Some(*revision)))
        }
        (Input::Put { value }, Outcome::Unknown) => Some(s.written(Some(value.clone()), None)),
        (Input::Get, Outcome::Ok(Output::Get { kv })) => s.read(kv),
        (Input::Delete, Outcome::Ok(Output::Delete { deleted, revision })) => {
            if *deleted != s.value.is_some() {
                None
            } else if !deleted {
                Some(s.clone())
            } else {
                (*revision > s.floor).then(|| s.written(None, Some(*revision)))
            }
        }
        (Input::Delete, Outcome::Unknown) => Some(s.written(None, None)),
        (
            Input::Cas { compare, value },
            Outcome::Ok(Output::Cas {
                succeeded,
                revision,
                current,
            }),
        ) => {
            if *succeeded {
                let ok = s.holds(compare) != Some(false) && *revision > s.floor;
                ok.then(|| s.written(Some(value.clone()), Some(*revision)))
            } else {
                let after = s.read(current)?;
                (after.holds(compare) == Some(false)).then_some(after)
            }
        }
        (Input::Cas { compare, value }, Outcome::Unknown) => {
            // If the compare is false here, the txn was a read: no effect, nothing to step.
            (s.holds(compare) != Some(false)).then(|| s.written(Some(value.clone()), None))
        }
        _ => None,
    }
}

/// Whether an operation takes part in the search at all.
pub fn relevant(op: &Operation) -> bool {
    match op.outcome {
        Outcome::Ok(_) => true,
        Outcome::Unknown => op.input.is_write(),
        Outcome::Failed => false,
    }
}

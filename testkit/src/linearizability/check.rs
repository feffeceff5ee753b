//! Wing & Gong / Lowe linearizability search per key, with memoization, as porcupine does.
//!
//! Each key's operations become call and return events in a doubly linked list ordered by
//! time (calls before returns at equal times: touching operations count as concurrent).
//! The search walks the list: at a call it tries to linearize that operation next (step the
//! model; skip if the (linearized set, state) pair was seen before), at a return it backtracks,
//! since that operation must have been linearized before anything called after it. Unknown
//! operations have no return event: they are never forced, and the history is linearizable
//! once every operation that returned is linearized.
//!
//! Unknown writes are what make the search blow up (each may or may not be linearized at any
//! later point). Values being unique, an unknown write whose value some returned operation
//! observed must have taken effect before the earliest such observation returned, so it gets
//! that return time (as etcd's robustness checker does). Unknown puts nobody observed are
//! interchangeable (same effect: present with an unobservable value), as are unknown deletes:
//! within each class the search only tries the earliest-called pending one. That is sound: a
//! linearization using a later-called one at some point can swap it with the earliest, which
//! was callable there too. An unobserved unknown compare-and-set joins the unobserved puts:
//! its only possible effect is the same, and ignoring its compare is a small relaxation (it
//! could only matter to a later delete that found the key) that keeps the search polynomial.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use super::history::{Input, Operation, Outcome, Output};
use super::model::{relevant, step, State};

#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Give up on a key (inconclusive, reported as such) after this long.
    pub per_key_timeout: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            per_key_timeout: Duration::from_secs(60),
        }
    }
}

/// A key whose history has no linearization.
#[derive(Clone, Debug)]
pub struct Anomaly {
    pub key: Vec<u8>,
    /// What kind of violation the culprit shows, in words.
    pub kind: String,
    /// The operation (by call order) whose addition makes the key's history non-linearizable:
    /// every earlier-called operation alone (later ones as unknown) is linearizable.
    pub culprit: Operation,
    /// The culprit's neighbours: operations concurrent with it and the last ones before it.
    pub context: Vec<Operation>,
}

impl std::fmt::Display for Anomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "key {:?}: {}: {}",
            String::from_utf8_lossy(&self.key),
            self.kind,
            self.culprit
        )?;
        for op in &self.context {
            writeln!(f, "    {op}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub keys: usize,
    /// Operations that took part (returned, or unknown writes).
    pub operations: usize,
    pub anomalies: Vec<Anomaly>,
    /// Keys the search gave up on.
    pub inconclusive: Vec<Vec<u8>>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.anomalies.is_empty() && self.inconclusive.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} keys, {} operations, {} anomalies, {} inconclusive",
            self.keys,
            self.operations,
            self.anomalies.len(),
            self.inconclusive.len()
        )?;
        for a in &self.anomalies {
            write!(f, "{a}")?;
        }
        for k in &self.inconclusive {
            writeln!(f, "key {:?}: search timed out", String::from_utf8_lossy(k))?;
        }
        Ok(())
    }
}

/// Checks a whole history, key by key.
pub fn check_history(ops: &[Operation], opts: &CheckOptions) -> Report {
    let mut by_key: BTreeMap<&[u8], Vec<Operation>> = BTreeMap::new();
    for op in ops.iter().filter(|o| relevant(o)) {
        by_key.entry(&op.key).or_default().push(op.clone());
    }
    let mut report = Report {
        keys: by_key.len(),
        ..Default::default()
    };
    for (key, mut ops) in by_key {
        report.operations += ops.len();
        ops.sort_by_key(|o| o.call);
        let ops = prepare(ops);
        let deadline = Instant::now() + opts.per_key_timeout;
        match linearizable(&ops, deadline) {
            Some(true) => {}
            None => report.inconclusive.push(key.to_vec()),
            Some(false) => match explain(key, &ops, deadline) {
                Some(a) => report.anomalies.push(a),
                None => report.inconclusive.push(key.to_vec()),
            },
        }
    }
    report
}

/// Finds the first operation (by call) that breaks linearizability: the smallest `k` such that
/// the first `k` operations, with every later one made unknown, are not linearizable. Making an
/// operation unknown only relaxes the history, so this is monotone in `k`: binary search.
fn explain(key: &[u8], ops: &[Operation], deadline: Instant) -> Option<Anomaly> {
    let relaxed = |k: usize| -> Vec<Operation> {
        let mut v: Vec<Operation> = ops.to_vec();
        for op in &mut v[k..] {
            op.outcome = Outcome::Unknown;
        }
        v.retain(relevant);
        prepare(v)
    };
    let (mut lo, mut hi) = (0, ops.len()); // prefix lo is linearizable, prefix hi is not
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        match linearizable(&relaxed(mid), deadline)? {
            true => lo = mid,
            false => hi = mid,
        }
    }
    let culprit = ops[hi - 1].clone();
    Some(Anomaly {
        key: key.to_vec(),
        kind: kind_of(&culprit, ops),
        context: context_of(&culprit, &ops[..hi - 1]),
        culprit,
    })
}

fn kind_of(op: &Operation, ops: &[Operation]) -> String {
    let read = match &op.outcome {
        Outcome::Ok(Output::Get { kv }) => kv.clone(),
        Outcome::Ok(Output::Cas {
            succeeded: false,
            current,
            ..
        }) => current.clone(),
        _ => return "no linearization includes this write".into(),
    };
    let Some(kv) = read else {
        return "read absent, but a write must precede it".into();
    };
    let written = ops.iter().any(|o| match &o.input {
        Input::Put { value } | Input::Cas { value, .. } => *value == kv.value,
        _ => false,
    });
    if written {
        "stale or out-of-order read".into()
    } else {
        "read of a value never written".into()
    }
}

/// Operations overlapping the culprit plus the last few that completed before its call.
fn context_of(culprit: &Operation, before: &[Operation]) -> Vec<Operation> {
    const BEFORE: usize = 4;
    const MAX: usize = 16;
    let returned = |o: &Operation| matches!(o.outcome, Outcome::Ok(_));
    let mut done: Vec<&Operation> = before
        .iter()
        .filter(|o| returned(o) && o.ret < culprit.call)
        .collect();
    done.sort_by_key(|o| o.ret);
    let mut out: Vec<Operation> = done
        .iter()
        .rev()
        .take(BEFORE)
        .rev()
        .map(|o| (*o).clone())
        .collect();
    out.extend(
        before
            .iter()
            .filter(|o| !returned(o) || o.ret >= culprit.call)
            .rev()
            .take(MAX - out.len())
            .cloned(),
    );
    out.sort_by_key(|o| o.call);
    out
}

/// Whether an operation has a return event the search must respect.
fn returned(op: &Operation) -> bool {
    matches!(op.outcome, Outcome::Ok(_)) || op.ret != UNKNOWN_RET
}

const UNKNOWN_RET: u64 = u64::MAX;

fn observed_value(op: &Operation) -> Option<&[u8]> {
    let kv = match &op.outcome {
        Outcome::Ok(Output::Get { kv }) => kv,
        Outcome::Ok(Output::Cas {
            succeeded: false,
            current,
            ..
        }) => current,
        Outcome::Ok(Output::Cas {
            succeeded: true, ..
        }) => match &op.input {
            Input::Cas {
                compare: super::history::Compare::Value(v),
                ..
            } => return Some(v),
            _ => return None,
        },
        _ => return None,
    };
    kv.as_ref().map(|kv| &kv.value[..])
}

/// Gives observed unknown writes the return time of their first observation, and unobserved
/// unknown puts and compare-and-sets one shared value (see the module doc). Other unknown operations' `ret` becomes
/// `UNKNOWN_RET`.
/// The value unobserved unknown puts are given: no read can return it.
const UNOBSERVED: &[u8] = b"\0unobserved";

fn prepare(ops: Vec<Operation>) -> Vec<Operation> {
    let mut first_seen: std::collections::HashMap<&[u8], u64> = Default::default();
    for op in &ops {
        if let Some(v) = observed_value(op) {
            let t = first_seen.entry(v).or_insert(op.ret);
            *t = (*t).min(op.ret);
        }
    }
    let seen = |op: &Operation| -> Option<u64> {
        match &op.input {
            Input::Put { value } | Input::Cas { value, .. } => first_seen.get(&value[..]).copied(),
            _ => None,
        }
    };
    let mut out = Vec::with_capacity(ops.len());
    for op in &ops {
        let mut op = op.clone();
        if op.outcome == Outcome::Unknown {
            let t = seen(&op);
            match (&mut op.input, t) {
                (_, Some(t)) => op.ret = t.max(op.call),
                (Input::Put { .. } | Input::Cas { .. }, None) => {
                    op.input = Input::Put {
                        value: UNOBSERVED.to_vec(),
                    };
                    op.ret = UNKNOWN_RET;
                }
                (_, None) => op.ret = UNKNOWN_RET,
            }
        }
        out.push(op);
    }
    out
}

const NONE: usize = usize::MAX;

/// Doubly linked list of call/return events; removed nodes keep their links so they can be
/// put back in LIFO order (Knuth's dancing links).
struct Events {
    prev: Vec<usize>,
    next: Vec<usize>,
    /// Node -> (operation, is call).
    node: Vec<(usize, bool)>,
    call_of: Vec<usize>,
    ret_of: Vec<usize>,
}

const HEAD: usize = 0;

impl Events {
    fn new(ops: &[Operation]) -> Events {
        let mut evs: Vec<(u64, bool, usize)> = Vec::new(); // (time, is_return, op)
        for (i, op) in ops.iter().enumerate() {
            evs.push((op.call, false, i));
            if returned(op) {
                evs.push((op.ret.max(op.call), true, i));
            }
        }
        evs.sort();
        let n = evs.len() + 1;
        let mut e = Events {
            prev: (0..n).map(|i| if i == 0 { NONE } else { i - 1 }).collect(),
            next: (0..n)
                .map(|i| if i + 1 < n { i + 1 } else { NONE })
                .collect(),
            node: vec![(NONE, false)],
            call_of: vec![NONE; ops.len()],
            ret_of: vec![NONE; ops.len()],
        };
        for (j, (_, is_ret, op)) in evs.into_iter().enumerate() {
            e.node.push((op, !is_ret));
            if is_ret {
                e.ret_of[op] = j + 1;
            } else {
                e.call_of[op] = j + 1;
            }
        }
        e
    }

    fn unlink(&mut self, n: usize) {
        let (p, x) = (self.prev[n], self.next[n]);
        self.next[p] = x;
        if x != NONE {
            self.prev[x] = p;
        }
    }

    fn relink(&mut self, n: usize) {
        let (p, x) = (self.prev[n], self.next[n]);
        self.next[p] = n;
        if x != NONE {
            self.prev[x] = n;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call_of[op]);
        if self.ret_of[op] != NONE {
            self.unlink(self.ret_of[op]);
        }
    }

    fn unlift(&mut self, op: usize) {
        if self.ret_of[op] != NONE {
            self.relink(self.ret_of[op]);
        }
        self.relink(self.call_of[op]);
    }
}

/// `Some(linearizable?)`, or `None` past the deadline.
fn linearizable(ops: &[Operation], deadline: Instant) -> Option<bool> {
    let mut ev = Events::new(ops);
    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut pending = ops.iter().filter(|o| returned(o)).count();
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state = State::default();
    // Interchangeable classes (module doc): 1 = unobserved unknown put, 2 = unknown delete.
    let class: Vec<usize> = ops
        .iter()
        .map(|o| match (&o.input, returned(o)) {
            (Input::Put { .. }, false) => 1,
            (Input::Delete, false) => 2,
            _ => 0,
        })
        .collect();
    let mut tried = [false; 3]; // in this walk, the earliest pending one of the class was tried
    let mut entry = ev.next[HEAD];
    let mut iterations = 0u64;
    loop {
        if pending == 0 {
            return Some(true);
        }
        iterations += 1;
        if iterations.is_multiple_of(4096) && Instant::now() > deadline {
            return None;
        }
        if entry == NONE || !ev.node[entry].1 {
            // A return (or the end): its operation must already be linearized. Backtrack.
            let Some((op, prev_state)) = stack.pop() else {
                return Some(false);
            };
            state = prev_state;
            linearized[op / 64] &= !(1 << (op % 64));
            if returned(&ops[op]) {
                pending += 1;
            }
            ev.unlift(op);
            entry = ev.next[ev.call_of[op]];
            // Resuming mid-walk: the earlier calls of op's class were passed over already.
            tried = [false; 3];
            let mut e = ev.next[HEAD];
            while e != entry {
                if ev.node[e].1 {
                    tried[class[ev.node[e].0]] = true;
                }
                e = ev.next[e];
            }
            tried[0] = false;
            continue;
        }
        let op = ev.node[entry].0;
        let c = class[op];
        if c != 0 && tried[c] {
            entry = ev.next[entry];
            continue;
        }
        tried[c] = c != 0;
        if let Some(next) = step(&state, &ops[op]) {
            linearized[op / 64] |= 1 << (op % 64);
            if cache.insert((linearized.clone(), next.clone())) {
                stack.push((op, std::mem::replace(&mut state, next)));
                if returned(&ops[op]) {
                    pending -= 1;
                }
                ev.lift(op);
                entry = ev.next[HEAD];
                tried = [false; 3];
                continue;
            }
            linearized[op / 64] &= !(1 << (op % 64));
        }
        entry = ev.next[entry];
    }
}

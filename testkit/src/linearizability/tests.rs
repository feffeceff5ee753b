//! Known-good and known-bad histories for both checkers.

use std::time::Duration;

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::history::*;
use super::watch::{check_watches, EventKind, WatchEvent, WatchHistory};
use super::{check_history, CheckOptions, Report};

fn kv(v: &str, rev: i64) -> Option<Kv> {
    Some(Kv {
        value: v.into(),
        mod_revision: rev,
    })
}

fn op(client: u64, call: u64, ret: u64, input: Input, outcome: Outcome) -> Operation {
    Operation {
        client,
        key: b"k".to_vec(),
        input,
        call,
        ret,
        outcome,
    }
}

fn put(c: u64, call: u64, ret: u64, v: &str, rev: i64) -> Operation {
    op(
        c,
        call,
        ret,
        Input::Put { value: v.into() },
        Outcome::Ok(Output::Put { revision: rev }),
    )
}

fn put_unknown(c: u64, call: u64, v: &str) -> Operation {
    op(c, call, 0, Input::Put { value: v.into() }, Outcome::Unknown)
}

fn get(c: u64, call: u64, ret: u64, read: Option<Kv>) -> Operation {
    op(
        c,
        call,
        ret,
        Input::Get,
        Outcome::Ok(Output::Get { kv: read }),
    )
}

fn del(c: u64, call: u64, ret: u64, deleted: bool, rev: i64) -> Operation {
    op(
        c,
        call,
        ret,
        Input::Delete,
        Outcome::Ok(Output::Delete {
            deleted,
            revision: rev,
        }),
    )
}

fn cas(c: u64, call: u64, ret: u64, cmp: Compare, v: &str, out: Output) -> Operation {
    op(
        c,
        call,
        ret,
        Input::Cas {
            compare: cmp,
            value: v.into(),
        },
        Outcome::Ok(out),
    )
}

fn check(ops: &[Operation]) -> Report {
    check_history(ops, &CheckOptions::default())
}

fn assert_ok(ops: &[Operation]) {
    let r = check(ops);
    assert!(r.is_ok(), "expected linearizable:\n{r}");
}

fn assert_anomaly(ops: &[Operation], kind: &str) -> Report {
    let r = check(ops);
    assert_eq!(r.anomalies.len(), 1, "expected one anomaly:\n{r}");
    assert!(r.anomalies[0].kind.contains(kind), "{r}");
    r
}

#[test]
fn sequential_history_is_linearizable() {
    assert_ok(&[
        get(1, 0, 1, None),
        put(1, 2, 3, "a", 2),
        get(2, 4, 5, kv("a", 2)),
        del(1, 6, 7, true, 3),
        get(2, 8, 9, None),
        del(2, 10, 11, false, 3),
    ]);
}

#[test]
fn stale_read_is_flagged_with_the_read_as_culprit() {
    let r = assert_anomaly(
        &[
            put(1, 0, 10, "a", 2),
            put(1, 20, 30, "b", 3),
            get(2, 40, 50, kv("a", 2)),
        ],
        "stale",
    );
    let a = &r.anomalies[0];
    assert_eq!(a.culprit.input, Input::Get);
    assert_eq!(a.context.len(), 2, "{r}");
}

#[test]
fn lost_write_is_flagged() {
    assert_anomaly(&[put(1, 0, 10, "a", 2), get(2, 20, 30, None)], "absent");
}

#[test]
fn read_of_never_written_value_is_flagged() {
    assert_anomaly(
        &[put(1, 0, 10, "a", 2), get(2, 20, 30, kv("zzz", 5))],
        "never written",
    );
}

#[test]
fn concurrent_write_and_reads_in_either_order_are_fine() {
    // The put spans both reads: one may see it and the other not, in that real-time order.
    assert_ok(&[
        put(1, 0, 100, "a", 2),
        get(2, 10, 20, None),
        get(3, 30, 40, kv("a", 2)),
    ]);
    assert_ok(&[
        put(1, 0, 100, "a", 2),
        get(2, 10, 20, kv("a", 2)),
        get(3, 15, 40, None), // overlaps the first read: may be ordered before it
    ]);
}

#[test]
fn new_then_old_read_is_flagged() {
    assert_anomaly(
        &[
            put(1, 0, 100, "a", 2),
            get(2, 10, 20, kv("a", 2)),
            get(3, 30, 40, None),
        ],
        "absent",
    );
}

#[test]
fn unknown_write_may_become_visible_later() {
    assert_ok(&[
        put_unknown(1, 0, "a"),
        get(2, 1000, 1010, None),
        get(2, 2000, 2010, kv("a", 7)),
        put(3, 3000, 3010, "b", 9),
        get(2, 4000, 4010, kv("b", 9)),
    ]);
}

#[test]
fn unknown_write_may_never_be_visible() {
    assert_ok(&[
        put(1, 0, 10, "a", 2),
        put_unknown(1, 20, "b"),
        get(2, 1000, 1010, kv("a", 2)),
    ]);
}

#[test]
fn unknown_write_cannot_vanish_once_seen() {
    assert_anomaly(
        &[
            put_unknown(1, 0, "a"),
            get(2, 10, 20, kv("a", 4)),
            get(2, 30, 40, None),
        ],
        "absent",
    );
}

#[test]
fn unknown_write_cannot_take_effect_before_its_call() {
    assert_anomaly(
        &[get(2, 0, 10, kv("a", 4)), put_unknown(1, 20, "a")],
        "stale",
    );
}

#[test]
fn failed_operations_are_ignored() {
    let failed = op(1, 0, 5, Input::Put { value: "x".into() }, Outcome::Failed);
    assert_ok(&[failed, get(2, 10, 20, None)]);
}

#[test]
fn revisions_must_grow_with_linearization_order() {
    assert_anomaly(&[put(1, 0, 10, "a", 5), put(1, 20, 30, "b", 4)], "write");
    assert_anomaly(
        &[put(1, 0, 10, "a", 5), get(2, 20, 30, kv("a", 6))],
        "stale",
    );
}

#[test]
fn compare_and_set_follows_its_compare() {
    let ok = Output::Cas {
        succeeded: true,
        revision: 3,
        current: None,
    };
    assert_ok(&[
        put(1, 0, 10, "a", 2),
        cas(2, 20, 30, Compare::Value("a".into()), "b", ok.clone()),
        get(1, 40, 50, kv("b", 3)),
        cas(
            2,
            60,
            70,
            Compare::ModRevision(2),
            "c",
            Output::Cas {
                succeeded: false,
                revision: 3,
                current: kv("b", 3),
            },
        ),
        cas(
            2,
            80,
            90,
            Compare::ModRevision(3),
            "d",
            Output::Cas {
                succeeded: true,
                revision: 4,
                current: None,
            },
        ),
    ]);
    // Succeeded although the value was different.
    assert_anomaly(
        &[
            put(1, 0, 10, "a", 2),
            cas(2, 20, 30, Compare::Value("x".into()), "b", ok),
        ],
        "write",
    );
    // Failed although the compare held.
    assert_anomaly(
        &[
            put(1, 0, 10, "a", 2),
            cas(
                2,
                20,
                30,
                Compare::Value("a".into()),
                "b",
                Output::Cas {
                    succeeded: false,
                    revision: 2,
                    current: kv("a", 2),
                },
            ),
        ],
        "stale",
    );
}

#[test]
fn delete_reports_whether_the_key_existed() {
    assert_anomaly(&[put(1, 0, 10, "a", 2), del(2, 20, 30, false, 2)], "write");
}

#[test]
fn keys_are_checked_independently() {
    let mut ops = vec![
        put(1, 0, 10, "a", 2),
        put(1, 20, 30, "b", 3),
        get(2, 40, 50, kv("a", 2)),
    ];
    for o in &mut ops {
        o.key = b"x".to_vec();
    }
    ops.push(put(3, 0, 100, "c", 4));
    ops.push(get(3, 200, 300, kv("c", 4)));
    let r = check(&ops);
    assert_eq!(r.keys, 2);
    assert_eq!(r.anomalies.len(), 1, "{r}");
    assert_eq!(r.anomalies[0].key, b"x");
}

/// A linearizable history from a simulated atomic register: each operation takes effect at a
/// random instant inside its interval; some writes time out (unknown) whether or not applied.
fn simulated(seed: u64, clients: u64, per_client: usize) -> Vec<Operation> {
    let mut rng = StdRng::seed_from_u64(seed);
    // (effect time, client, call, ret, kind)
    let mut planned = Vec::new();
    for c in 0..clients {
        let mut t = rng.gen_range(0..50u64);
        for _ in 0..per_client {
            let call = t;
            let ret = call + rng.gen_range(1..200u64);
            let at = rng.gen_range(call..=ret);
            planned.push((at, c, call, ret, rng.gen_range(0..10u32)));
            t = ret + rng.gen_range(0..30u64);
        }
    }
    planned.sort();
    let mut state: Option<Kv> = None;
    let mut rev = 1;
    let mut ops = Vec::new();
    for (i, (_, c, call, ret, kind)) in planned.into_iter().enumerate() {
        let value = format!("v{i}").into_bytes();
        let (input, out) = match kind {
            0..=3 => {
                rev += 1;
                state = Some(Kv {
                    value: value.clone(),
                    mod_revision: rev,
                });
                (Input::Put { value }, Output::Put { revision: rev })
            }
            4 => {
                let deleted = state.is_some();
                if deleted {
                    rev += 1;
                }
                state = None;
                (
                    Input::Delete,
                    Output::Delete {
                        deleted,
                        revision: rev,
                    },
                )
            }
            5 | 6 => {
                let expect = state.as_ref().map_or(0, |k| k.mod_revision);
                let expect = if kind == 5 { expect } else { expect + 1 };
                let succeeded = state.as_ref().map_or(0, |k| k.mod_revision) == expect;
                let current = state.clone();
                if succeeded {
                    rev += 1;
                    state = Some(Kv {
                        value: value.clone(),
                        mod_revision: rev,
                    });
                }
                (
                    Input::Cas {
                        compare: Compare::ModRevision(expect),
                        value,
                    },
                    Output::Cas {
                        succeeded,
                        revision: rev,
                        current: if succeeded { None } else { current },
                    },
                )
            }
            _ => (Input::Get, Output::Get { kv: state.clone() }),
        };
        let unknown = input.is_write() && rng.gen_bool(0.05);
        ops.push(op(
            c,
            call,
            ret,
            input,
            if unknown {
                Outcome::Unknown
            } else {
                Outcome::Ok(out)
            },
        ));
    }
    ops
}

#[test]
fn simulated_concurrent_histories_pass_quickly() {
    for seed in 0..20 {
        let ops = simulated(seed, 8, 150);
        let t = std::time::Instant::now();
        let r = check_history(
            &ops,
            &CheckOptions {
                per_key_timeout: Duration::from_secs(20),
            },
        );
        assert!(r.is_ok(), "seed {seed}: {r}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "seed {seed}: {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_corrupted_simulated_history_is_caught() {
    // Make one late read return the first value ever written: stale, given later writes.
    for seed in 0..10 {
        let mut ops = simulated(seed, 4, 100);
        let first = ops
            .iter()
            .find_map(|o| match (&o.input, &o.outcome) {
                (Input::Put { value }, Outcome::Ok(Output::Put { revision })) => Some(Kv {
                    value: value.clone(),
                    mod_revision: *revision,
                }),
                _ => None,
            })
            .unwrap();
        let last_ret = ops.iter().map(|o| o.ret).max().unwrap();
        ops.push(put(9, last_ret + 10, last_ret + 20, "final", 100_000));
        ops.push(get(9, last_ret + 30, last_ret + 40, Some(first)));
        assert_eq!(check(&ops).anomalies.len(), 1, "seed {seed}");
    }
}

fn ev(key: &str, rev: i64, value: Option<&str>, prev: Option<Kv>) -> WatchEvent {
    WatchEvent {
        key: key.into(),
        kind: if value.is_some() {
            EventKind::Put
        } else {
            EventKind::Delete
        },
        value: value.unwrap_or("").into(),
        mod_revision: rev,
        prev,
    }
}

fn watch(events: Vec<WatchEvent>, through: i64) -> WatchHistory {
    WatchHistory {
        name: "w".into(),
        prefix: b"k".to_vec(),
        start_revision: 1,
        prev_kv: true,
        events,
        complete_through: through,
    }
}

fn good_events() -> Vec<WatchEvent> {
    vec![
        ev("k", 2, Some("a"), None),
        ev("k", 3, None, kv("a", 2)),
        ev("k", 4, Some("c"), None),
    ]
}

fn acked() -> Vec<Operation> {
    vec![
        put(1, 0, 10, "a", 2),
        del(1, 20, 30, true, 3),
        put(1, 40, 50, "c", 4),
    ]
}

#[test]
fn consistent_watch_passes() {
    let r = check_watches(&acked(), &[watch(good_events(), 4)]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.events, 3);
}

#[test]
fn watch_gap_duplicate_order_and_prev_kv_are_flagged() {
    let mut gap = good_events();
    gap.remove(1);
    let r = check_watches(&acked(), &[watch(gap, 4)]);
    assert!(
        r.problems.iter().any(|p| p.contains("missing revision 3")),
        "{:?}",
        r.problems
    );

    let mut dup = good_events();
    dup.push(dup[2].clone());
    let r = check_watches(&acked(), &[watch(dup, 4)]);
    assert!(
        r.problems.iter().any(|p| p.contains("duplicate")),
        "{:?}",
        r.problems
    );

    let mut order = good_events();
    order.swap(0, 2);
    let r = check_watches(&acked(), &[watch(order, 4)]);
    assert!(
        r.problems.iter().any(|p| p.contains("out of order")),
        "{:?}",
        r.problems
    );

    let mut prev = good_events();
    prev[1].prev = kv("b", 2);
    let r = check_watches(&acked(), &[watch(prev, 4)]);
    assert!(
        r.problems.iter().any(|p| p.contains("prev_kv")),
        "{:?}",
        r.problems
    );

    let mut wrong = good_events();
    wrong[2].value = b"zzz".to_vec();
    let r = check_watches(&acked(), &[watch(wrong, 4)]);
    assert!(
        r.problems.iter().any(|p| p.contains("disagrees")),
        "{:?}",
        r.problems
    );
}

#[test]
fn watch_is_only_held_to_its_complete_window() {
    let mut short = good_events();
    short.pop();
    let r = check_watches(&acked(), &[watch(short, 3)]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

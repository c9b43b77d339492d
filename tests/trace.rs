//! A job's spans make a picture of it: the Chrome trace of a run has a `compute` span
//! for every rank and iteration, each rank on its own track, inside the job's span, and
//! the straggler's waits show.

#[path = "../examples/support/trace.rs"]
mod trace;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

#[test]
fn the_trace_of_a_run_has_a_compute_span_for_every_rank_and_iteration_on_its_own_track() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let (workers, iterations) = (3, 4);
    trace::record(&path, workers, iterations).unwrap();
    let events: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let begins = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "B" && e["name"] == name)
            .collect()
    };
    // tracing-chrome writes a field's value as text.
    let arg = |e: &Value, key: &str| {
        let v = &e["args"][key];
        v.as_u64().or_else(|| v.as_str()?.parse().ok())
    };

    let mut computes = BTreeSet::new();
    let mut tracks: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for e in begins("compute") {
        let (rank, iteration) = (arg(e, "rank").unwrap(), arg(e, "iteration").unwrap());
        assert_eq!(arg(e, "attempt"), Some(0), "{e}");
        computes.insert((rank, iteration));
        tracks
            .entry(rank)
            .or_default()
            .insert(e["tid"].as_u64().unwrap());
    }
    let expected: BTreeSet<(u64, u64)> = (0..workers as u64)
        .flat_map(|r| (1..=iterations).map(move |i| (r, i)))
        .collect();
    assert_eq!(computes, expected);
    // One track per rank: each rank's computes on one thread, no two ranks on the same.
    let all: BTreeSet<u64> = tracks.values().flatten().copied().collect();
    assert!(tracks.values().all(|t| t.len() == 1), "{tracks:?}");
    assert_eq!(all.len(), workers, "{tracks:?}");

    // The job's span and one span per iteration (entered on each thread that works in
    // it), with its number.
    assert_eq!(begins("job").len(), 1);
    let its: BTreeSet<u64> = begins("iteration")
        .iter()
        .filter_map(|e| arg(e, "iteration"))
        .collect();
    assert_eq!(its, (1..=iterations).collect());
    assert_eq!(begins("master_compute").len(), iterations as usize);

    // Each iteration is one slice, on the job's thread, from its start to its end: it
    // holds every compute of that iteration, whichever thread ran it.
    let ends = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "E" && e["name"] == name)
            .collect()
    };
    let ts = |e: &Value| e["ts"].as_f64().unwrap();
    let (its_b, its_e) = (begins("iteration"), ends("iteration"));
    assert_eq!(its_b.len(), iterations as usize, "one slice per iteration");
    assert_eq!(its_e.len(), iterations as usize, "one slice per iteration");
    // Each compute's (iteration, start, end): a thread's computes do not nest, so its
    // n-th begin and n-th end are one compute.
    let mut computes_timed = Vec::new();
    for tid in tracks.values().flatten() {
        let on = |list: Vec<&Value>| -> Vec<Value> {
            list.into_iter()
                .filter(|e| e["tid"].as_u64() == Some(*tid))
                .cloned()
                .collect()
        };
        for (cb, ce) in on(begins("compute")).iter().zip(on(ends("compute")).iter()) {
            computes_timed.push((arg(cb, "iteration").unwrap(), ts(cb), ts(ce)));
        }
    }
    for (b, e) in its_b.iter().zip(&its_e) {
        let i = arg(b, "iteration").unwrap();
        assert_eq!(b["tid"], e["tid"], "begun and ended on one thread");
        let (start, end) = (ts(b), ts(e));
        assert!(start < end);
        let inside = computes_timed
            .iter()
            .filter(|(ci, _, _)| *ci == i)
            .map(|&(_, cb, ce)| (cb, ce))
            .collect::<Vec<_>>();
        assert_eq!(inside.len(), workers, "iteration {i}");
        for (cb, ce) in inside {
            assert!(
                start <= cb && ce <= end,
                "iteration {i} [{start}, {end}] holds its compute [{cb}, {ce}]"
            );
        }
    }
    // Every rank but the straggler waits in its barrier every iteration.
    let syncs = begins("sync");
    assert_eq!(syncs.len(), workers * iterations as usize);
}

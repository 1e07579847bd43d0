//! Tests of the attention split: parts add up to the attention time, and
//! the `n/a` cases.

use super::*;

fn pass(kind: PassKind, attention_s: f64, graph: bool, parts: Option<PartTimes>) -> PassRecord {
    PassRecord {
        kind,
        batch_size: 4,
        rows: 10,
        metadata_s: 0.001,
        attention_s,
        kv_bytes: 1e6,
        flops: 1e9,
        graph,
        parts,
    }
}

fn parts(kv_write_s: f64, context_s: f64, decode_s: f64, context_flops: f64) -> PartTimes {
    PartTimes {
        kv_write_s,
        context_s,
        decode_s,
        concurrent_s: 0.0,
        context_flops,
    }
}

fn report(rec: &Recorder, split_timing: &str) -> Report {
    let (modes, by_batch_size, totals) = rec.summarise(100.0);
    Report {
        config: RunConfig {
            split_timing: split_timing.into(),
            ..RunConfig::default()
        },
        modes,
        totals,
        by_batch_size,
        ..Report::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

/// Eager mixed / extend passes with measured parts and a graph decode
/// pass (whole replay as decode): the parts add up to the attention
/// time per mode and over the run; the context TFLOP/s is the context
/// FLOPs over the context seconds only.
#[test]
fn split_parts_sum_to_attention_time() {
    let rec = Recorder {
        passes: vec![
            pass(
                PassKind::Mixed,
                0.010,
                false,
                Some(parts(0.001, 0.006, 0.002, 3e12)),
            ),
            pass(
                PassKind::Mixed,
                0.020,
                false,
                Some(parts(0.002, 0.014, 0.003, 9e12)),
            ),
            pass(
                PassKind::Extend,
                0.005,
                false,
                Some(parts(0.0004, 0.004, 0.0, 2e12)),
            ),
            pass(
                PassKind::Decode,
                0.003,
                true,
                Some(parts(0.0, 0.0, 0.003, 0.0)),
            ),
        ],
        ..Recorder::default()
    };
    let r = report(&rec, "on: CUDA events");
    let t = r.totals.split.as_ref().expect("run split");
    assert_eq!(t.passes, 4);
    assert!(close(t.attention_s, r.totals.attention_s));
    assert!(close(
        t.context_s + t.decode_s + t.kv_write_s + t.other_s,
        t.attention_s
    ));
    assert!(close(t.context_s, 0.024));
    assert!(close(t.decode_s, 0.008));
    assert!(close(t.graph_replay_s, 0.003));
    assert!(close(t.kv_write_s, 0.0034));
    assert!(close(t.other_s, 0.038 - 0.024 - 0.008 - 0.0034));
    assert!(close(t.context_flops, 14e12));
    assert!(close(t.context_tflops_per_s.unwrap(), 14.0 / 0.024));
    for m in &r.modes {
        let p = m.split.as_ref().expect("mode split");
        assert!(close(p.attention_s, m.attention_s), "{}", m.mode);
        assert!(
            close(
                p.context_s + p.decode_s + p.kv_write_s + p.other_s,
                m.attention_s
            ),
            "{}",
            m.mode
        );
    }
    let mixed = r.modes.iter().find(|m| m.mode == "mixed").unwrap();
    let ms = mixed.split.as_ref().unwrap();
    assert_eq!(ms.passes, 2);
    assert!(close(ms.context_tflops_per_s.unwrap(), 12.0 / 0.020));
    assert!(close(ms.other_s, 0.030 - 0.020 - 0.005 - 0.003));
    let decode = r.modes.iter().find(|m| m.mode == "decode").unwrap();
    assert_eq!(decode.split.as_ref().unwrap().context_tflops_per_s, None);

    let text = r.table();
    assert!(text.contains("| attention split | context kernel 0.024 s (63.2%), decode kernel 0.008 s (21.1%, 0.003 s of it whole CUDA-graph replays"), "{text}");
    assert!(
        text.contains("K/V write 0.003 s (8.9%), other 0.003 s (6.8%) of 0.038 s |"),
        "{text}"
    );
    assert!(
        text.contains("| context kernel | 583.33 TFLOP/s (1.400e13 causal FLOPs in 0.024 s) |"),
        "{text}"
    );
    assert!(
        text.contains("| mixed | 0.020 s | 0.005 s | 0.000 s | 0.003 s | 0.002 s | 600.00 |"),
        "{text}"
    );
    assert!(
        text.contains(
            "| decode | 0.000 s | 0.003 s (graph replays) | 0.000 s | 0.000 s | 0.000 s | n/a |"
        ),
        "{text}"
    );
    // The JSON carries the same fields.
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["totals"]["split"]["passes"], 4);
    assert!(close(
        json["totals"]["split"]["context_tflops_per_s"]
            .as_f64()
            .unwrap(),
        14.0 / 0.024
    ));
    assert!(json["modes"][2]["split"]["context_tflops_per_s"].is_null());
}

/// A mixed pass whose context and decode launches ran concurrently: the
/// time they shared counts in both spans and once in `concurrent_s`, so
/// the parts still add up to the attention time, and the report says so.
#[test]
fn split_with_concurrent_launches_adds_up() {
    let mut both = parts(0.001, 0.006, 0.003, 6e12);
    both.concurrent_s = 0.002;
    let rec = Recorder {
        passes: vec![
            pass(PassKind::Mixed, 0.009, false, Some(both)),
            pass(
                PassKind::Mixed,
                0.011,
                false,
                Some(parts(0.001, 0.006, 0.003, 6e12)),
            ),
        ],
        ..Recorder::default()
    };
    let r = report(&rec, "on: CUDA events");
    let t = r.totals.split.as_ref().unwrap();
    assert!(close(t.concurrent_s, 0.002));
    assert!(close(t.other_s, 0.020 - 0.012 - 0.006 + 0.002 - 0.002));
    assert!(close(
        t.context_s + t.decode_s - t.concurrent_s + t.kv_write_s + t.other_s,
        t.attention_s
    ));
    let text = r.table();
    assert!(
        text.contains(
            "decode kernel 0.006 s (30.0%), of these two 0.002 s (10.0%) at the same time"
        ),
        "{text}"
    );
    assert!(
        text.contains("MHA_KIT_MIXED_OVERLAP=off times it alone"),
        "{text}"
    );
    assert!(
        text.contains("| mixed | 0.012 s | 0.006 s | 0.002 s | 0.002 s | 0.002 s | 1000.00 |"),
        "{text}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert!(close(
        json["totals"]["split"]["concurrent_s"].as_f64().unwrap(),
        0.002
    ));
}

/// No context work: the context kernel's TFLOP/s is n/a (JSON null),
/// the split is still printed; only the passes with a split count.
#[test]
fn split_without_context_work_is_na() {
    let rec = Recorder {
        passes: vec![
            pass(
                PassKind::Decode,
                0.002,
                false,
                Some(parts(0.0004, 0.0, 0.0012, 0.0)),
            ),
            pass(PassKind::Decode, 0.004, false, None),
        ],
        ..Recorder::default()
    };
    let r = report(&rec, "on: CUDA events");
    let t = r.totals.split.as_ref().unwrap();
    assert_eq!((t.passes, t.context_tflops_per_s), (1, None));
    assert!(close(t.attention_s, 0.002));
    assert!(close(t.other_s, 0.0004));
    let text = r.table();
    assert!(
        text.contains("| context kernel | n/a (no context work) |"),
        "{text}"
    );
    assert!(text.contains("of 0.002 s over 1 of 2 passes |"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["totals"]["split"]["context_tflops_per_s"].is_null());
}

/// Context launches that did no work (0 FLOPs) are n/a too, not 0.
#[test]
fn split_with_zero_context_flops_is_na() {
    let s = AttentionSplit::over(&[pass(
        PassKind::Extend,
        0.001,
        false,
        Some(parts(0.0, 0.0005, 0.0, 0.0)),
    )])
    .unwrap();
    assert_eq!(s.context_tflops_per_s, None);
    assert_eq!(AttentionSplit::over(&[]), None);
}

/// Not measured (CPU executor, `--split-timing off`): no split in the
/// JSON and the rows say why, never numbers.
#[test]
fn split_not_measured_says_why() {
    let rec = Recorder {
        passes: vec![pass(PassKind::Mixed, 0.01, false, None)],
        ..Recorder::default()
    };
    let cpu = report(
        &rec,
        "n/a on the CPU executor (no CUDA events; --split-timing has no effect)",
    );
    assert_eq!(cpu.totals.split, None);
    assert!(cpu.modes.iter().all(|m| m.split.is_none()));
    let text = cpu.table();
    assert!(text.contains("| attention split | n/a on the CPU executor (no CUDA events; --split-timing has no effect) |"), "{text}");
    assert!(
        text.contains("| context kernel | n/a (no attention split) |"),
        "{text}"
    );
    assert!(!text.contains("mode (attention split)"), "{text}");
    let json = serde_json::to_value(&cpu).unwrap();
    assert!(json["totals"]["split"].is_null());
    assert!(json["modes"][0]["split"].is_null());
    let off = report(&rec, "off (--split-timing off)");
    assert!(off
        .table()
        .contains("| attention split | n/a: split timing off (--split-timing off) |"));
}

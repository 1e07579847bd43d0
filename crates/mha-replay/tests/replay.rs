//! End-to-end replays on the CPU executor (CI): a 20-request slice of the
//! embedded conv trace with request and token counts checked against the
//! CSV itself and 0 mismatches; speculative and hybrid-SWA / FP8 slices;
//! the binary's exit codes and error messages.

use std::process::Command;

use clap::Parser;
use mha_replay::{run_args, Args, Report};

/// `(ContextTokens, GeneratedTokens)` of the first `n` rows of the vendored
/// conv trace, read with a plain split (independent of the crate's parser).
fn first_rows(n: usize) -> Vec<(u64, u64)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/azure-llm-2023-conv.csv");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .skip(1)
        .take(n)
        .map(|l| {
            let f: Vec<&str> = l.trim_end().split(',').collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

fn replay(args: &[&str]) -> Report {
    let mut all = vec!["mha-replay", "--device", "cpu"];
    all.extend_from_slice(args);
    run_args(&Args::try_parse_from(all).unwrap()).unwrap()
}

fn assert_clean(r: &Report) {
    assert!(r.check.pairs > 0, "nothing was checked");
    assert_eq!(r.check.mismatched_pairs, 0, "{:?}", r.check.first_mismatch);
    assert_eq!(r.device_errors.count, 0);
    assert!(r.passed());
}

#[test]
fn twenty_requests_match_the_trace() {
    let r = replay(&[
        "--requests",
        "20",
        "--check-fraction",
        "0.25",
        "--seed",
        "3",
    ]);
    let rows = first_rows(20);
    let w = &r.workload;
    assert_eq!((w.requests, w.finished, w.trace_requests), (20, 20, 19_366));
    assert_eq!(w.trace_prompt_tokens, rows.iter().map(|r| r.0).sum::<u64>());
    assert_eq!(
        w.trace_generated_tokens,
        rows.iter().map(|r| r.1).sum::<u64>()
    );
    // CPU defaults cap prompts at 192 and outputs at 32 tokens.
    assert_eq!((w.max_context, w.max_output), (Some(192), Some(32)));
    assert_eq!(
        w.prompt_tokens,
        rows.iter().map(|r| r.0.min(192)).sum::<u64>()
    );
    assert_eq!(
        w.generated_tokens,
        rows.iter().map(|r| r.1.min(32)).sum::<u64>()
    );
    assert_eq!(w.capped_prompts, rows.iter().filter(|r| r.0 > 192).count());
    // Every mode the scheduler produced is in the report; tokens add up:
    // prompt tokens are prefilled once, every generated token but the
    // first of each request is a decode row.
    let rows_of = |m: &str| r.modes.iter().find(|x| x.mode == m).map_or(0, |x| x.rows);
    assert_eq!(
        rows_of("extend") + rows_of("mixed") + rows_of("decode"),
        w.prompt_tokens + w.generated_tokens - 20
    );
    assert!(r.totals.kv_bytes_read > 0.0 && r.totals.step_p99_ms >= r.totals.step_p50_ms);
    assert_clean(&r);
}

#[test]
fn speculative_replay_is_exact() {
    let r = replay(&[
        "--requests",
        "10",
        "--spec-steps",
        "3",
        "--check-fraction",
        "0.3",
        "--max-output",
        "24",
    ]);
    let rows = first_rows(10);
    assert_eq!(
        r.workload.generated_tokens,
        rows.iter().map(|r| r.1.min(24)).sum::<u64>()
    );
    for m in [
        "target_verify",
        "draft_decode",
        "draft_extend_v2",
        "draft_extend",
    ] {
        assert!(r.modes.iter().any(|x| x.mode == m), "mode {m} missing");
    }
    assert_clean(&r);
}

/// The hybrid gpt-oss slice: 2 layers (one SWA), FP8 KV, prompts longer
/// than the 127-token window, pages of 7 tokens.
const HYBRID_FP8: &[&str] = &[
    "--model",
    "gpt-oss-20b",
    "--layers",
    "2",
    "--kv-dtype",
    "fp8",
    "--max-context",
    "150",
    "--max-output",
    "6",
    "--page-size",
    "7",
    "--prefill-chunk",
    "64",
];

#[test]
fn hybrid_swa_fp8_replay_is_exact() {
    let mut flags = vec!["--requests", "4", "--check-fraction", "0.5"];
    flags.extend_from_slice(HYBRID_FP8);
    let r = replay(&flags);
    assert_eq!(r.config.swa_layers, 1);
    assert_clean(&r);
}

/// `--dcp N`: decode / verify / draft passes computed by N simulated
/// decode context-parallel ranks (page interleave) and merged — 0
/// mismatches against the checker's unsplit recomputation, on the dense
/// tiny model with speculation (verify, draft decode, draft extend) and on
/// the hybrid gpt-oss model (window + sinks, FP8), and the same workload
/// as the unsplit run.
#[test]
fn decode_context_parallel_replay_is_exact() {
    for (ranks, extra) in [
        ("2", &["--spec-steps", "2", "--max-output", "12"][..]),
        ("3", HYBRID_FP8),
    ] {
        let mut flags = vec!["--requests", "6", "--check-fraction", "0.5"];
        flags.extend_from_slice(extra);
        let one = replay(&flags);
        flags.extend_from_slice(&["--dcp", ranks]);
        let r = replay(&flags);
        assert_eq!(r.config.decode_cp_ranks.to_string(), ranks);
        assert_clean(&r);
        assert_eq!(r.workload, one.workload, "{ranks} ranks: the same workload");
        assert_eq!(
            r.check.pairs, one.check.pairs,
            "{ranks} ranks: the same checks"
        );
    }
}

/// `--tp N`: every layer's heads sharded over N simulated ranks, each its
/// own backend and engine, outputs joined head-wise — 0 mismatches, the
/// same workload and checks as one rank, and a report line per rank that
/// adds up to the totals. Tiny (4/1/64: the one KV head replicated on each
/// rank) with speculation; gpt-oss (64/8, sinks sliced per rank, a window,
/// FP8) over 4 ranks of 2 KV heads; with `--dcp` inside each rank.
#[test]
fn tensor_parallel_replay_is_exact() {
    for (ranks, extra, kv) in [
        (
            2,
            &["--spec-steps", "2", "--max-output", "12"][..],
            ["0..1", "0..1"],
        ),
        (4, HYBRID_FP8, ["0..2", "6..8"]),
        (2, &["--dcp", "2"][..], ["0..1", "0..1"]),
    ] {
        let mut flags = vec!["--requests", "6", "--check-fraction", "0.5"];
        flags.extend_from_slice(extra);
        let one = replay(&flags);
        let n = ranks.to_string();
        flags.extend_from_slice(&["--tp", &n]);
        let r = replay(&flags);
        assert_eq!(r.config.tp_ranks, ranks);
        assert_clean(&r);
        assert_eq!(r.workload, one.workload, "{ranks} ranks: the same workload");
        assert_eq!(
            r.check.pairs, one.check.pairs,
            "{ranks} ranks: the same checks"
        );
        // Per-head arithmetic is unchanged: the joined rows are the
        // unsharded rows bit for bit.
        assert_eq!(r.check.max_abs_err, one.check.max_abs_err);
        assert_eq!(r.check.output_hash, one.check.output_hash);
        assert_eq!(r.ranks.len(), ranks);
        assert_eq!(r.ranks[0].kv_heads, kv[0]);
        assert_eq!(r.ranks[ranks - 1].kv_heads, kv[1]);
        let q: Vec<&str> = r.ranks.iter().map(|x| x.q_heads.as_str()).collect();
        let hq: usize = r.config.heads.split('/').next().unwrap().parse().unwrap();
        let want: Vec<String> = (0..ranks)
            .map(|i| format!("{}..{}", i * hq / ranks, (i + 1) * hq / ranks))
            .collect();
        assert_eq!(q, want);
        let attn: f64 = r.ranks.iter().map(|x| x.attention_s).sum();
        assert!((attn - r.totals.attention_s).abs() <= 1e-9 * attn.max(1.0));
        let kv_read: f64 = r.ranks.iter().map(|x| x.kv_bytes_read).sum();
        assert!((kv_read - r.totals.kv_bytes_read).abs() <= 1e-6 * kv_read.max(1.0));
        assert!(r.ranks.iter().all(|x| x.device_errors == 0));
        assert!(r.table().contains("| rank | device | Q heads |"));
        assert!(r.ranks.iter().all(|x| x.device == "cpu"));
        assert_eq!(r.config.tp_gpus, "one");
        assert!(one.ranks.is_empty());
    }
}

/// An engine that keeps every sampled row it returns.
struct Recording {
    inner: mha_replay::engine::CpuEngine,
    seen: Vec<mha_replay::engine::SampledRows>,
}

impl mha_replay::engine::Engine for Recording {
    fn info(&self) -> mha_replay::engine::EngineInfo {
        self.inner.info()
    }
    fn copy_ceiling_gbps(&mut self) -> f64 {
        self.inner.copy_ceiling_gbps()
    }
    fn run_pass(
        &mut self,
        backend: &mut mha_backend::MhaBackend,
        pass: &mha_replay::pass::Pass,
        layers: &[mha_backend::HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> mha_replay::Result<mha_replay::engine::PassOutput> {
        let out = self
            .inner
            .run_pass(backend, pass, layers, metadata_ready, sample)?;
        self.seen.extend(out.sampled.iter().cloned());
        Ok(out)
    }
}

/// Bit-identical per head: each `--tp 2` rank's sampled rows (gpt-oss,
/// 32 query heads and 4 KV heads a rank) equal the same heads of the
/// one-rank run's rows, element for element.
#[test]
fn tensor_parallel_ranks_are_bit_identical_per_head() {
    let mut flags = vec![
        "mha-replay",
        "--device",
        "cpu",
        "--requests",
        "4",
        "--check-fraction",
        "0.5",
    ];
    flags.extend_from_slice(HYBRID_FP8);
    let run = |tp: usize| -> Vec<Vec<mha_replay::engine::SampledRows>> {
        let mut f = flags.clone();
        let n = tp.to_string();
        f.extend_from_slice(&["--tp", &n]);
        let setup = mha_replay::Setup::from_args(&Args::try_parse_from(&f).unwrap()).unwrap();
        let mut engines: Vec<Recording> = (0..tp)
            .map(|_| Recording {
                inner: mha_replay::engine::CpuEngine::new(mha_replay::gen::Generator::new(
                    setup.seed,
                )),
                seen: Vec::new(),
            })
            .collect();
        let mut refs: Vec<&mut dyn mha_replay::engine::Engine> = engines
            .iter_mut()
            .map(|e| e as &mut dyn mha_replay::engine::Engine)
            .collect();
        let r = mha_replay::replay::run_ranks(&setup, &mut refs, &indicatif::ProgressBar::hidden())
            .unwrap();
        assert_clean(&r);
        engines.into_iter().map(|e| e.seen).collect()
    };
    let whole = run(1).pop().unwrap();
    let ranks = run(2);
    let d = 64;
    let width = 64 * d;
    assert!(!whole.is_empty());
    for (r, seen) in ranks.iter().enumerate() {
        assert_eq!(seen.len(), whole.len());
        let w = width / 2;
        for (a, b) in whole.iter().zip(seen) {
            assert_eq!((a.layer, a.part), (b.layer, b.part));
            let n = a.rows.len() / width;
            assert_eq!(b.rows.len(), n * w);
            for j in 0..n {
                assert_eq!(
                    &a.rows[j * width + r * w..][..w],
                    &b.rows[j * w..][..w],
                    "rank {r}, layer {}, part {}, row {j}",
                    a.layer,
                    a.part
                );
            }
        }
    }
}

/// Outputs that come back one pass late from every rank's engine are
/// joined with the right pass (the pipelined CUDA engine's behaviour).
#[test]
fn tensor_parallel_with_pipelined_engines() {
    let args = Args::try_parse_from([
        "mha-replay",
        "--device",
        "cpu",
        "--requests",
        "8",
        "--check-fraction",
        "0.3",
        "--spec-steps",
        "2",
        "--tp",
        "2",
    ])
    .unwrap();
    let sync = run_args(&args).unwrap();
    let setup = mha_replay::Setup::from_args(&args).unwrap();
    let mut late: Vec<OneLate> = (0..2)
        .map(|_| OneLate {
            inner: mha_replay::engine::CpuEngine::new(mha_replay::gen::Generator::new(setup.seed)),
            held: None,
        })
        .collect();
    let mut refs: Vec<&mut dyn mha_replay::engine::Engine> = late
        .iter_mut()
        .map(|e| e as &mut dyn mha_replay::engine::Engine)
        .collect();
    let r = mha_replay::replay::run_ranks(&setup, &mut refs, &indicatif::ProgressBar::hidden())
        .unwrap();
    assert_clean(&r);
    assert_eq!(r.check.pairs, sync.check.pairs);
    assert_eq!(r.check.max_abs_err, sync.check.max_abs_err);
    assert_eq!(r.check.output_hash, sync.check.output_hash);
    assert_eq!(r.workload, sync.workload);
    // One engine for two ranks is refused, not run.
    let mut one = mha_replay::engine::CpuEngine::new(mha_replay::gen::Generator::new(setup.seed));
    assert!(mha_replay::replay::run(&setup, &mut one, &indicatif::ProgressBar::hidden()).is_err());
}

fn bin(args: &[&str], dir: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mha-replay"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn binary_errors_name_the_flag_or_line() {
    let dir = std::env::temp_dir().join(format!("mha-replay-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(
        &bad,
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n1,10,2\r\n2,x,2",
    )
    .unwrap();
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--page-size", "0"], "--page-size"),
        (vec!["--spec-steps", "16"], "--spec-steps"),
        (vec!["--check-fraction", "1.5"], "--check-fraction"),
        (vec!["--device", "tpu"], "--device"),
        (vec!["--requests", "20000"], "--requests"),
        (vec!["--kv-pages", "3"], "--kv-pages"),
        (vec!["--max-batch", "0"], "--max-batch"),
        (vec!["--trace", bad.to_str().unwrap()], "bad.csv:3:"),
        (vec!["--trace", "/no/such/trace.csv"], "/no/such/trace.csv"),
        (vec!["--plot", "out.svg"], "--plot"),
        (vec!["--split-timing", "maybe"], "--split-timing"),
        (vec!["--dcp", "0"], "--dcp"),
        (vec!["--dcp", "65"], "--dcp"),
        (vec!["--skip-softmax-decode", "-1"], "--skip-softmax-decode"),
        (
            vec!["--skip-softmax-decode", "nan"],
            "--skip-softmax-decode",
        ),
        (vec!["--tp", "0"], "--tp"),
        (vec!["--tp", "3"], "--tp"),
        (vec!["--model", "gpt-oss-20b", "--tp", "128"], "--tp"),
    ];
    if !kernel_rt::gpu_available() {
        // Without a GPU, `--device cuda:N` is a flag error (never a CPU
        // fallback); with one it would start the full CUDA job.
        cases.push((vec!["--device", "cuda:0"], "--device"));
    }
    for (args, want) in cases {
        let (code, _, err) = bin(&args, &dir);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A small run writes the table, the JSON and the PNG, exit 0.
    let (code, out, err) = bin(
        &[
            "--requests",
            "5",
            "--json",
            "r.json",
            "--plot",
            "r.png",
            "--max-context",
            "64",
        ],
        &dir,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("device cpu") && out.contains("| mismatches | 0 pairs"),
        "{out}"
    );
    // No CUDA events on the CPU executor: the split says so, never numbers.
    assert!(
        out.contains(
            "| attention split | n/a on the CPU executor (no CUDA events; --split-timing has no effect) |"
        ) && out.contains("| context kernel | n/a (no attention split) |"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    assert_eq!(json["workload"]["requests"], 5);
    assert_eq!(json["check"]["mismatched_pairs"], 0);
    assert!(json["totals"]["split"].is_null() && json["modes"][0]["split"].is_null());
    assert!(json["config"]["split_timing"]
        .as_str()
        .is_some_and(|s| s.starts_with("n/a on the CPU executor")));
    assert_eq!(&std::fs::read(dir.join("r.png")).unwrap()[1..4], b"PNG");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An engine that hands each pass back one submission late (as the CUDA
/// engine's two-deep pipeline does), over the CPU engine.
struct OneLate {
    inner: mha_replay::engine::CpuEngine,
    held: Option<mha_replay::engine::PassOutput>,
}

impl mha_replay::engine::Engine for OneLate {
    fn info(&self) -> mha_replay::engine::EngineInfo {
        self.inner.info()
    }
    fn copy_ceiling_gbps(&mut self) -> f64 {
        self.inner.copy_ceiling_gbps()
    }
    fn run_pass(
        &mut self,
        backend: &mut mha_backend::MhaBackend,
        pass: &mha_replay::pass::Pass,
        layers: &[mha_backend::HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> mha_replay::Result<mha_replay::engine::PassOutput> {
        self.inner
            .run_pass(backend, pass, layers, metadata_ready, sample)
    }
    fn submit_pass(
        &mut self,
        backend: &mut mha_backend::MhaBackend,
        pass: &mha_replay::pass::Pass,
        layers: &[mha_backend::HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> mha_replay::Result<Vec<mha_replay::engine::PassOutput>> {
        let out = self
            .inner
            .run_pass(backend, pass, layers, metadata_ready, sample)?;
        Ok(self.held.replace(out).into_iter().collect())
    }
    fn flush(&mut self) -> mha_replay::Result<Vec<mha_replay::engine::PassOutput>> {
        Ok(self.held.take().into_iter().collect())
    }
}

/// Outputs that come back one pass late are attributed to the right pass:
/// the report equals the synchronous engine's (counts, per-mode rows,
/// checked pairs, errors), speculative passes included.
#[test]
fn pipelined_engine_reports_like_the_synchronous_one() {
    for extra in [&[][..], &["--spec-steps", "2"][..]] {
        let mut flags = vec![
            "mha-replay",
            "--device",
            "cpu",
            "--requests",
            "12",
            "--check-fraction",
            "0.2",
            "--seed",
            "4",
        ];
        flags.extend_from_slice(extra);
        let args = Args::try_parse_from(&flags).unwrap();
        let sync = run_args(&args).unwrap();
        let setup = mha_replay::Setup::from_args(&args).unwrap();
        let mut late = OneLate {
            inner: mha_replay::engine::CpuEngine::new(mha_replay::gen::Generator::new(4)),
            held: None,
        };
        let r =
            mha_replay::replay::run(&setup, &mut late, &indicatif::ProgressBar::hidden()).unwrap();
        assert_clean(&r);
        assert_eq!(r.check.pairs, sync.check.pairs);
        assert_eq!(r.check.max_abs_err, sync.check.max_abs_err);
        let rows = |r: &Report| -> Vec<(String, u64, u64)> {
            r.modes
                .iter()
                .map(|m| (m.mode.clone(), m.passes, m.rows))
                .collect()
        };
        assert_eq!(rows(&r), rows(&sync));
        assert_eq!(r.workload.generated_tokens, sync.workload.generated_tokens);
    }
}

/// The output hash names the sampled outputs: the same flags give the same
/// hash, another seed (other Q/K/V) another one, and 16 hex digits.
#[test]
fn output_hash_follows_the_outputs() {
    let flags = ["--requests", "5", "--check-fraction", "0.5", "--seed", "8"];
    let a = replay(&flags);
    let b = replay(&flags);
    assert_eq!(a.check.output_hash, b.check.output_hash);
    assert_eq!(a.check.output_hash.len(), 16);
    let mut other = flags;
    other[5] = "9";
    assert_ne!(replay(&other).check.output_hash, a.check.output_hash);
}

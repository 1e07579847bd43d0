//! The human-readable report table (markdown) and its number formats.

use std::fmt::Write as _;

use super::{ratio, Report, Totals};

fn bytes_h(b: f64) -> String {
    if b >= 1e12 {
        format!("{:.2} TB", b / 1e12)
    } else if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.0} B", b)
    }
}

fn rate_h(gbps: f64) -> String {
    if gbps >= 1.0 {
        format!("{gbps:.1} GB/s")
    } else {
        format!("{:.1} MB/s", gbps * 1e3)
    }
}

/// Seconds with 3 decimals (no `-0.000`).
fn secs_h(s: f64) -> String {
    format!("{:.3} s", if s.abs() < 5e-4 { 0.0 } else { s })
}

/// TFLOP/s, or `n/a`.
fn tflops_h(t: Option<f64>) -> String {
    t.map_or("n/a".into(), |t| format!("{t:.2}"))
}

fn flops_h(gflops: f64) -> String {
    if gflops >= 1000.0 {
        format!("{:.1} TFLOP/s", gflops / 1e3)
    } else {
        format!("{gflops:.2} GFLOP/s")
    }
}

/// The `attention split` and `context kernel` rows of the totals table.
fn split_rows(t: &Totals, split_timing: &str) -> (String, String) {
    let Some(p) = &t.split else {
        let why = if split_timing.starts_with("n/a") {
            split_timing.to_string()
        } else {
            format!("n/a: split timing {split_timing}")
        };
        return (why, "n/a (no attention split)".into());
    };
    let pct = |x: f64| 100.0 * ratio(x, p.attention_s);
    let graph = if p.graph_replay_s > 0.0 {
        format!(
            ", {} of it whole CUDA-graph replays (their K/V writes and metadata included)",
            secs_h(p.graph_replay_s)
        )
    } else {
        String::new()
    };
    let coverage = if p.passes < t.passes {
        format!(" over {} of {} passes", p.passes, t.passes)
    } else {
        String::new()
    };
    let concurrent = if p.concurrent_s > 0.0 {
        format!(
            ", of these two {} ({:.1}%) at the same time (mixed passes' context and decode \
             launches run concurrently; counted in both)",
            secs_h(p.concurrent_s),
            pct(p.concurrent_s)
        )
    } else {
        String::new()
    };
    let split = format!(
        "context kernel {} ({:.1}%), decode kernel {} ({:.1}%{graph}){concurrent}, K/V write {} ({:.1}%), other {} ({:.1}%) of {}{coverage}",
        secs_h(p.context_s),
        pct(p.context_s),
        secs_h(p.decode_s),
        pct(p.decode_s),
        secs_h(p.kv_write_s),
        pct(p.kv_write_s),
        secs_h(p.other_s),
        pct(p.other_s),
        secs_h(p.attention_s),
    );
    let shared = if p.concurrent_s > 0.0 {
        "; its spans include the GPU it shared with concurrent decode launches: \
         MHA_KIT_MIXED_OVERLAP=off times it alone"
    } else {
        ""
    };
    let context = match p.context_tflops_per_s {
        Some(tf) => format!(
            "{tf:.2} TFLOP/s ({:.3e} causal FLOPs in {}{shared})",
            p.context_flops,
            secs_h(p.context_s)
        ),
        None => "n/a (no context work)".into(),
    };
    (split, context)
}

impl Report {
    /// The human-readable table (markdown).
    pub fn table(&self) -> String {
        let c = &self.config;
        let w = &self.workload;
        let t = &self.totals;
        let k = &self.check;
        let mut s = String::new();
        let cap = |v: Option<u32>| v.map_or("none".to_string(), |v| format!("{v} tokens"));
        let _ = writeln!(s, "## mha-replay: {} on {}\n", c.model, c.executor);
        let _ = writeln!(s, "| | |\n|---|---|");
        let mut row = |a: &str, b: String| {
            let _ = writeln!(s, "| {a} | {b} |");
        };
        row("executor", format!("{} ({})", c.executor, c.time_domain));
        row(
            "model",
            format!(
                "{}: {} layers, Hq/Hkv/D {}{}, KV {}",
                c.model,
                c.layers,
                c.heads,
                if c.swa_layers > 0 {
                    format!(
                        ", {} SWA layer{}",
                        c.swa_layers,
                        if c.swa_layers == 1 { "" } else { "s" }
                    )
                } else {
                    String::new()
                },
                c.kv_dtype
            ),
        );
        row(
            "scheduler",
            format!(
                "page {} tokens, {} KV pages, max batch {}, prefill chunk {}, spec steps {}{}",
                c.page_size,
                c.kv_pages,
                c.max_batch,
                c.prefill_chunk,
                c.spec_steps,
                if c.dcp_gpus == "spread" {
                    format!(
                        ", decode context parallel over {} ranks, one a GPU (page interleave; partial states all-gathered over NCCL and merged on every rank; rank table)",
                        c.decode_cp_ranks
                    )
                } else if c.decode_cp_ranks > 1 {
                    format!(
                        ", decode context parallel over {} simulated ranks (page interleave)",
                        c.decode_cp_ranks
                    )
                } else {
                    String::new()
                }
            ),
        );
        if c.tp_ranks > 1 && c.tp_gpus == "spread" {
            row(
                "tensor parallel",
                format!(
                    "heads sharded over {} ranks, each on its own GPU (rank table), run concurrently (a pass takes its slowest rank's device time; the attention split sums the GPUs)",
                    c.tp_ranks
                ),
            );
        } else if c.tp_ranks > 1 {
            row(
                "tensor parallel",
                format!(
                    "heads sharded over {} simulated ranks, run one after another on {} (times add up)",
                    c.tp_ranks, c.executor
                ),
            );
        }
        row(
            "trace",
            format!("{}, {} requests", w.trace, w.trace_requests),
        );
        row(
            "requests",
            format!("{} replayed, {} finished", w.requests, w.finished),
        );
        row(
            "prompt tokens",
            format!(
                "{} prefilled (trace: {}; cap {}, {} prompts capped)",
                w.prompt_tokens,
                w.trace_prompt_tokens,
                cap(w.max_context),
                w.capped_prompts
            ),
        );
        row(
            "generated tokens",
            format!(
                "{} (trace: {}; cap {}, {} outputs capped)",
                w.generated_tokens,
                w.trace_generated_tokens,
                cap(w.max_output),
                w.capped_outputs
            ),
        );
        row(
            "passes",
            format!("{} in {} scheduler steps", t.passes, t.scheduler_steps),
        );
        let _ = writeln!(
            s,
            "\n| mode | passes | mean bs | tokens | attention time | KV read | bandwidth | GFLOP/s |\n|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for m in &self.modes {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} | {} | {:.3} s | {} | {} | {:.2} |",
                m.mode,
                m.passes,
                m.mean_batch,
                m.rows,
                m.attention_s,
                bytes_h(m.kv_bytes_read),
                rate_h(m.bandwidth_gbps),
                m.gflops_per_s
            );
        }
        if self.modes.iter().any(|m| m.split.is_some()) {
            let _ = writeln!(
                s,
                "\n| mode (attention split) | context kernel | decode kernel | both at once | K/V write | other | context TFLOP/s |\n|---|---:|---:|---:|---:|---:|---:|"
            );
            for m in &self.modes {
                let Some(p) = &m.split else { continue };
                let _ = writeln!(
                    s,
                    "| {} | {} | {}{} | {} | {} | {} | {} |",
                    m.mode,
                    secs_h(p.context_s),
                    secs_h(p.decode_s),
                    if p.graph_replay_s > 0.0 {
                        " (graph replays)"
                    } else {
                        ""
                    },
                    secs_h(p.concurrent_s),
                    secs_h(p.kv_write_s),
                    secs_h(p.other_s),
                    tflops_h(p.context_tflops_per_s)
                );
            }
        }
        if !self.ranks.is_empty() {
            // Context-parallel ranks check their own outputs: two more columns.
            let dcp = c.dcp_gpus == "spread";
            let _ = writeln!(
                s,
                "\n| rank | device | Q heads | KV heads | attention time | metadata | KV read | bandwidth | device errors |{}\n|---:|---|---|---|---:|---:|---:|---:|---:|{}",
                if dcp { " mismatched pairs | sampled rows hash |" } else { "" },
                if dcp { "---:|---|" } else { "" }
            );
            for r in &self.ranks {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.3} s | {:.3} s | {} | {} | {} |{}",
                    r.rank,
                    r.device,
                    r.q_heads,
                    r.kv_heads,
                    r.attention_s,
                    r.metadata_s,
                    bytes_h(r.kv_bytes_read),
                    rate_h(r.bandwidth_gbps),
                    r.device_errors,
                    if dcp {
                        format!(" {} | {} |", r.mismatched_pairs, r.output_hash)
                    } else {
                        String::new()
                    }
                );
            }
        }
        let _ = writeln!(s, "\n| total | |\n|---|---|");
        let mut row = |a: &str, b: String| {
            let _ = writeln!(s, "| {a} | {b} |");
        };
        row(
            "attention time (KV write + attention)",
            format!("{:.3} s ({})", t.attention_s, c.time_domain),
        );
        let (split, context) = split_rows(t, &c.split_timing);
        row("attention split", split);
        row("context kernel", context);
        row("KV bytes read", bytes_h(t.kv_bytes_read));
        row(
            "decode/verify bandwidth",
            format!(
                "{} = {:.2}% of the copy ceiling {} (measured at start)",
                rate_h(t.decode_bandwidth_gbps),
                100.0 * t.decode_share_of_ceiling,
                rate_h(t.copy_ceiling_gbps)
            ),
        );
        row(
            "prefill-like passes",
            format!(
                "{} (all attention FLOPs of extend / mixed passes over their whole attention \
                 time, decode rows and K/V writes included; the context kernel's own rate is \
                 in the context kernel row)",
                flops_h(t.prefill_gflops_per_s)
            ),
        );
        row(
            "step time",
            format!("p50 {:.3} ms, p99 {:.3} ms", t.step_p50_ms, t.step_p99_ms),
        );
        row(
            "graph vs eager",
            if c.cuda_graphs.starts_with("n/a") {
                c.cuda_graphs.clone()
            } else {
                format!("{} graph / {} eager passes", t.graph_passes, t.eager_passes)
            },
        );
        row(
            "metadata share",
            if t.graph_passes > 0 {
                format!(
                    "{:.2}% of step time (host time in init_forward_metadata of eager passes; graph passes build it inside the graph)",
                    100.0 * t.metadata_share
                )
            } else {
                format!(
                    "{:.2}% of step time (host time in init_forward_metadata)",
                    100.0 * t.metadata_share
                )
            },
        );
        row(
            "check",
            format!(
                "{} (call, request) pairs, {} rows, {} elements (fraction {})",
                k.pairs, k.rows, k.elements, c.check_fraction
            ),
        );
        row(
            "max error (checked)",
            format!(
                "{:.3e} abs, {:.3} of tolerance",
                k.max_abs_err, k.max_tolerance_ratio
            ),
        );
        row(
            "output hash",
            format!("{} (sampled rows, FNV-1a)", k.output_hash),
        );
        row(
            "mismatches",
            format!(
                "{} pairs, {} elements",
                k.mismatched_pairs, k.mismatched_elements
            ),
        );
        row(
            "device errors",
            if self.device_errors.families.is_empty() {
                format!("{}", self.device_errors.count)
            } else {
                format!(
                    "{} ({})",
                    self.device_errors.count,
                    self.device_errors
                        .families
                        .iter()
                        .map(|f| format!("{} {}: {}", f.family, f.count, f.events.join(", ")))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            },
        );
        row(
            "host time",
            format!(
                "{:.2} s wall ({:.2} s generating Q/K/V, {:.2} s checking)",
                t.wall_s, t.generate_s, t.check_s
            ),
        );
        s
    }
}

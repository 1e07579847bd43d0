//! The report: per-pass records aggregated per mode and per batch size,
//! printed as a table and serialised as JSON (same fields).
//!
//! With the attention split measured (CUDA engine, `--split-timing on`),
//! each mode and the whole run also get an [`AttentionSplit`]: attention
//! time as context-kernel, decode-kernel, K/V-write and other seconds
//! (adding up to the attention time) and the context kernel's own TFLOP/s.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mha_backend::PartTimes;

use crate::check::CheckStats;
use crate::pass::PassKind;

/// One pass as measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassRecord {
    /// Kind.
    pub kind: PassKind,
    /// Requests.
    pub batch_size: usize,
    /// Query rows.
    pub rows: usize,
    /// Metadata seconds.
    pub metadata_s: f64,
    /// KV write + attention seconds (all layers).
    pub attention_s: f64,
    /// KV bytes read by attention (all layers).
    pub kv_bytes: f64,
    /// Attention FLOPs (all layers).
    pub flops: f64,
    /// Ran from a CUDA graph.
    pub graph: bool,
    /// `attention_s` by part and the context kernel's FLOPs, when measured
    /// ([`crate::engine::PassOutput::parts`]).
    pub parts: Option<PartTimes>,
}

impl PassRecord {
    /// Step time: metadata + layers.
    pub fn step_s(&self) -> f64 {
        self.metadata_s + self.attention_s
    }
}

/// Per-mode totals.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ModeReport {
    /// Mode name.
    pub mode: String,
    /// Passes.
    pub passes: u64,
    /// Query rows (tokens) processed.
    pub rows: u64,
    /// Mean requests per pass.
    pub mean_batch: f64,
    /// Seconds in KV write + attention.
    pub attention_s: f64,
    /// Seconds building metadata.
    pub metadata_s: f64,
    /// KV bytes read.
    pub kv_bytes_read: f64,
    /// `kv_bytes_read / attention_s`, GB/s.
    pub bandwidth_gbps: f64,
    /// Attention FLOPs.
    pub flops: f64,
    /// `flops / attention_s`, GFLOP/s.
    pub gflops_per_s: f64,
    /// Attention time by part (`null` when not measured).
    pub split: Option<AttentionSplit>,
}

/// Attention time of a set of passes split by part (device seconds, all
/// layers), over the passes whose split was measured.
///
/// `context_s + decode_s + kv_write_s + other_s = attention_s`. Eager
/// passes: CUDA events around the context-kernel launches, the
/// decode-kernel launches (with their split-counter resets) and the K/V
/// writes; `other_s` is the rest of their attention time (copies, uploads,
/// gaps between launches). Graph replays cannot be timed inside: each
/// replay counts whole as decode time (its metadata launch and K/V writes
/// included), shown as `graph_replay_s`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AttentionSplit {
    /// Passes with a measured split.
    pub passes: u64,
    /// Their attention time, seconds.
    pub attention_s: f64,
    /// Seconds in context-kernel launches (prefill / extend / mixed chunks).
    pub context_s: f64,
    /// Seconds in decode-kernel launches (decode, verify, draft passes,
    /// mixed passes' one-token tails), graph replays included.
    pub decode_s: f64,
    /// The part of `decode_s` that is whole CUDA-graph replays.
    pub graph_replay_s: f64,
    /// Seconds in K/V-write kernels of eager passes.
    pub kv_write_s: f64,
    /// `attention_s − context_s − decode_s − kv_write_s`.
    pub other_s: f64,
    /// Causal FLOPs given to the context kernel (`4 · Hq · D` per visible
    /// (query, key) pair).
    pub context_flops: f64,
    /// `context_flops / context_s`, TFLOP/s; `null` without context work.
    pub context_tflops_per_s: Option<f64>,
}

impl AttentionSplit {
    /// The split over `passes` (those with [`PassRecord::parts`]); `None`
    /// when none has one.
    pub fn over<'a>(passes: impl IntoIterator<Item = &'a PassRecord>) -> Option<Self> {
        let mut s = Self::default();
        for p in passes {
            let Some(t) = &p.parts else { continue };
            s.passes += 1;
            s.attention_s += p.attention_s;
            s.context_s += t.context_s;
            s.decode_s += t.decode_s;
            s.kv_write_s += t.kv_write_s;
            s.context_flops += t.context_flops;
            if p.graph {
                s.graph_replay_s += t.decode_s;
            }
        }
        if s.passes == 0 {
            return None;
        }
        s.other_s = s.attention_s - s.context_s - s.decode_s - s.kv_write_s;
        s.context_tflops_per_s = (s.context_s > 0.0 && s.context_flops > 0.0)
            .then(|| s.context_flops / s.context_s / 1e12);
        Some(s)
    }
}

/// One (series, batch size) of the target's passes (the plot's points).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct BatchPoint {
    /// `decode` (DECODE and TARGET_VERIFY passes) or `prefill` (EXTEND and MIXED).
    pub series: String,
    /// Requests per pass.
    pub batch_size: usize,
    /// Passes with this batch size.
    pub passes: u64,
    /// Mean step time, ms.
    pub mean_step_ms: f64,
    /// KV bytes read / attention time, GB/s.
    pub bandwidth_gbps: f64,
}

/// The workload actually replayed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Workload {
    /// Trace name.
    pub trace: String,
    /// Requests in the whole trace.
    pub trace_requests: usize,
    /// Requests replayed (the first N by arrival).
    pub requests: usize,
    /// Requests finished.
    pub finished: usize,
    /// Prompt tokens of the replayed slice in the trace.
    pub trace_prompt_tokens: u64,
    /// Generated tokens of the replayed slice in the trace.
    pub trace_generated_tokens: u64,
    /// Prompt tokens prefilled (after `--max-context`).
    pub prompt_tokens: u64,
    /// Tokens generated (after `--max-output`).
    pub generated_tokens: u64,
    /// Requests whose prompt was capped.
    pub capped_prompts: usize,
    /// Requests whose output was capped.
    pub capped_outputs: usize,
    /// Prompt cap, tokens.
    pub max_context: Option<u32>,
    /// Output cap, tokens.
    pub max_output: Option<u32>,
}

/// The configuration, as run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RunConfig {
    /// Executor (`cpu`, `cuda:N`).
    pub executor: String,
    /// How the executor was chosen.
    pub device_notes: Vec<String>,
    /// What timings measure.
    pub time_domain: String,
    /// Model preset.
    pub model: String,
    /// Layers (target).
    pub layers: usize,
    /// `Hq/Hkv/D` of layer 0.
    pub heads: String,
    /// SWA layers (hybrid pool).
    pub swa_layers: usize,
    /// KV dtype.
    pub kv_dtype: String,
    /// Tokens per page.
    pub page_size: usize,
    /// Allocatable pages.
    pub kv_pages: usize,
    /// Request rows.
    pub max_batch: usize,
    /// Prefill chunk, tokens.
    pub prefill_chunk: usize,
    /// Draft steps (0 = off).
    pub spec_steps: usize,
    /// `on`, `off`, or not applicable.
    pub cuda_graphs: String,
    /// Attention split by part (`--split-timing`): `on: …`, `off …`, or
    /// `n/a …` (executor without CUDA events).
    pub split_timing: String,
    /// Seed.
    pub seed: u64,
    /// Check fraction.
    pub check_fraction: f64,
}

/// Totals over every pass.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Totals {
    /// Passes (forward batches).
    pub passes: u64,
    /// Scheduler steps.
    pub scheduler_steps: u64,
    /// Seconds in KV write + attention.
    pub attention_s: f64,
    /// Seconds building metadata.
    pub metadata_s: f64,
    /// Attention time by part over the run (`null` when not measured).
    pub split: Option<AttentionSplit>,
    /// `metadata_s / (metadata_s + attention_s)`.
    pub metadata_share: f64,
    /// KV bytes read by attention.
    pub kv_bytes_read: f64,
    /// Bandwidth of the target's decode-like passes, GB/s.
    pub decode_bandwidth_gbps: f64,
    /// Memory-copy ceiling measured at start, GB/s.
    pub copy_ceiling_gbps: f64,
    /// `decode_bandwidth_gbps / copy_ceiling_gbps`.
    pub decode_share_of_ceiling: f64,
    /// FLOP/s of prefill-like passes (extend, mixed, draft extend), GFLOP/s.
    pub prefill_gflops_per_s: f64,
    /// Median step time, ms.
    pub step_p50_ms: f64,
    /// 99th percentile step time, ms.
    pub step_p99_ms: f64,
    /// Passes replayed from a CUDA graph.
    pub graph_passes: u64,
    /// Passes run eagerly.
    pub eager_passes: u64,
    /// Seconds generating Q/K/V (outside the step time).
    pub generate_s: f64,
    /// Seconds in the independent checks.
    pub check_s: f64,
    /// Wall time of the whole replay.
    pub wall_s: f64,
}

/// The device error word the backend accumulated (0 expected).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DeviceErrorsReport {
    /// Events.
    pub count: u32,
    /// Flags ORed.
    pub flags: u32,
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Report {
    /// Configuration.
    pub config: RunConfig,
    /// Workload.
    pub workload: Workload,
    /// Per mode.
    pub modes: Vec<ModeReport>,
    /// Totals.
    pub totals: Totals,
    /// Independent check.
    pub check: CheckStats,
    /// Backend device errors.
    pub device_errors: DeviceErrorsReport,
    /// The target's passes by series (`decode`, `prefill`) and batch size.
    pub by_batch_size: Vec<BatchPoint>,
}

/// Collects pass records.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    /// Every pass.
    pub passes: Vec<PassRecord>,
    /// Scheduler steps.
    pub scheduler_steps: u64,
    /// Generation seconds.
    pub generate_s: f64,
    /// Check seconds.
    pub check_s: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl Recorder {
    /// Per-mode, per-batch-size and total figures.
    pub fn summarise(&self, copy_ceiling_gbps: f64) -> (Vec<ModeReport>, Vec<BatchPoint>, Totals) {
        let mut modes = Vec::new();
        for kind in PassKind::ALL {
            let ps: Vec<&PassRecord> = self.passes.iter().filter(|p| p.kind == kind).collect();
            if ps.is_empty() {
                continue;
            }
            let attn: f64 = ps.iter().map(|p| p.attention_s).sum();
            let bytes: f64 = ps.iter().map(|p| p.kv_bytes).sum();
            let flops: f64 = ps.iter().map(|p| p.flops).sum();
            modes.push(ModeReport {
                mode: kind.name().into(),
                passes: ps.len() as u64,
                rows: ps.iter().map(|p| p.rows as u64).sum(),
                mean_batch: ps.iter().map(|p| p.batch_size as f64).sum::<f64>() / ps.len() as f64,
                attention_s: attn,
                metadata_s: ps.iter().map(|p| p.metadata_s).sum(),
                kv_bytes_read: bytes,
                bandwidth_gbps: ratio(bytes, attn) / 1e9,
                flops,
                gflops_per_s: ratio(flops, attn) / 1e9,
                split: AttentionSplit::over(ps.iter().copied()),
            });
        }
        let mut by_bs: BTreeMap<(&str, usize), (u64, f64, f64, f64)> = BTreeMap::new();
        for p in &self.passes {
            let series = if p.kind.is_target_decode() {
                "decode"
            } else if matches!(p.kind, PassKind::Extend | PassKind::Mixed) {
                "prefill"
            } else {
                continue;
            };
            let e = by_bs.entry((series, p.batch_size)).or_default();
            e.0 += 1;
            e.1 += p.step_s();
            e.2 += p.kv_bytes;
            e.3 += p.attention_s;
        }
        let points = by_bs
            .into_iter()
            .map(|((series, bs), (n, step, bytes, attn))| BatchPoint {
                series: series.into(),
                batch_size: bs,
                passes: n,
                mean_step_ms: step / n as f64 * 1e3,
                bandwidth_gbps: ratio(bytes, attn) / 1e9,
            })
            .collect();
        let mut steps: Vec<f64> = self.passes.iter().map(|p| p.step_s() * 1e3).collect();
        steps.sort_by(f64::total_cmp);
        let attention_s: f64 = self.passes.iter().map(|p| p.attention_s).sum();
        let metadata_s: f64 = self.passes.iter().map(|p| p.metadata_s).sum();
        let sum = |f: &dyn Fn(&PassRecord) -> bool, g: &dyn Fn(&PassRecord) -> f64| -> f64 {
            self.passes.iter().filter(|p| f(p)).map(g).sum()
        };
        let dec_bytes = sum(&|p| p.kind.is_target_decode(), &|p| p.kv_bytes);
        let dec_time = sum(&|p| p.kind.is_target_decode(), &|p| p.attention_s);
        let pre_flops = sum(&|p| p.kind.is_prefill(), &|p| p.flops);
        let pre_time = sum(&|p| p.kind.is_prefill(), &|p| p.attention_s);
        let decode_bw = ratio(dec_bytes, dec_time) / 1e9;
        let graph_passes = self.passes.iter().filter(|p| p.graph).count() as u64;
        let totals = Totals {
            passes: self.passes.len() as u64,
            scheduler_steps: self.scheduler_steps,
            attention_s,
            metadata_s,
            split: AttentionSplit::over(&self.passes),
            metadata_share: ratio(metadata_s, metadata_s + attention_s),
            kv_bytes_read: self.passes.iter().map(|p| p.kv_bytes).sum(),
            decode_bandwidth_gbps: decode_bw,
            copy_ceiling_gbps,
            decode_share_of_ceiling: ratio(decode_bw, copy_ceiling_gbps),
            prefill_gflops_per_s: ratio(pre_flops, pre_time) / 1e9,
            step_p50_ms: percentile(&steps, 50.0),
            step_p99_ms: percentile(&steps, 99.0),
            graph_passes,
            eager_passes: self.passes.len() as u64 - graph_passes,
            generate_s: self.generate_s,
            check_s: self.check_s,
            wall_s: 0.0,
        };
        (modes, points, totals)
    }
}

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
    let split = format!(
        "context kernel {} ({:.1}%), decode kernel {} ({:.1}%{graph}), K/V write {} ({:.1}%), other {} ({:.1}%) of {}{coverage}",
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
    let context = match p.context_tflops_per_s {
        Some(tf) => format!(
            "{tf:.2} TFLOP/s ({:.3e} causal FLOPs in {})",
            p.context_flops,
            secs_h(p.context_s)
        ),
        None => "n/a (no context work)".into(),
    };
    (split, context)
}

impl Report {
    /// Whether the run is clean: no mismatch and no device error.
    pub fn passed(&self) -> bool {
        self.check.mismatched_pairs == 0 && self.device_errors.count == 0
    }

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
                "page {} tokens, {} KV pages, max batch {}, prefill chunk {}, spec steps {}",
                c.page_size, c.kv_pages, c.max_batch, c.prefill_chunk, c.spec_steps
            ),
        );
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
                "\n| mode (attention split) | context kernel | decode kernel | K/V write | other | context TFLOP/s |\n|---|---:|---:|---:|---:|---:|"
            );
            for m in &self.modes {
                let Some(p) = &m.split else { continue };
                let _ = writeln!(
                    s,
                    "| {} | {} | {}{} | {} | {} | {} |",
                    m.mode,
                    secs_h(p.context_s),
                    secs_h(p.decode_s),
                    if p.graph_replay_s > 0.0 {
                        " (graph replays)"
                    } else {
                        ""
                    },
                    secs_h(p.kv_write_s),
                    secs_h(p.other_s),
                    tflops_h(p.context_tflops_per_s)
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
            "mismatches",
            format!(
                "{} pairs, {} elements",
                k.mismatched_pairs, k.mismatched_elements
            ),
        );
        row(
            "device errors",
            format!(
                "{} (flags {:#x})",
                self.device_errors.count, self.device_errors.flags
            ),
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

#[cfg(test)]
mod tests {
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
            text.contains("| mixed | 0.020 s | 0.005 s | 0.003 s | 0.002 s | 600.00 |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| decode | 0.000 s | 0.003 s (graph replays) | 0.000 s | 0.000 s | n/a |"
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
}

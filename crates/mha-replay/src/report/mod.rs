//! The report: per-pass records aggregated per mode and per batch size,
//! printed as a table and serialised as JSON (same fields).
//!
//! With the attention split measured (CUDA engine, `--split-timing on`),
//! each mode and the whole run also get an [`AttentionSplit`]: attention
//! time as context-kernel, decode-kernel, K/V-write and other seconds
//! (adding up to the attention time) and the context kernel's own TFLOP/s.
//!
//! Submodules: `table` (the markdown table and its number formats), `tests`.

use std::collections::BTreeMap;

use mha_backend::PartTimes;

use crate::check::CheckStats;
use crate::pass::PassKind;

mod table;

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
/// `context_s + decode_s − concurrent_s + kv_write_s + other_s =
/// attention_s`. Eager passes: CUDA events around the context-kernel
/// launches, the decode-kernel launches (with their split-counter resets)
/// and the K/V writes; a mixed pass whose two launches ran concurrently
/// (mha-backend's `MixedOverlap`) counts the time they shared in both
/// `context_s` and `decode_s` and once in `concurrent_s`; `other_s` is the
/// rest of their attention time (copies, uploads, gaps between launches). Graph replays cannot be timed inside: each
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
    /// Seconds counted in both `context_s` and `decode_s` (the two launches
    /// of a mixed pass running at the same time).
    pub concurrent_s: f64,
    /// `attention_s − context_s − decode_s + concurrent_s − kv_write_s`.
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
            s.concurrent_s += t.concurrent_s;
            s.context_flops += t.context_flops;
            if p.graph {
                s.graph_replay_s += t.decode_s;
            }
        }
        if s.passes == 0 {
            return None;
        }
        s.other_s = s.attention_s - s.context_s - s.decode_s + s.concurrent_s - s.kv_write_s;
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
    /// Decode context-parallel ranks (`--dcp`; 1 = off).
    pub decode_cp_ranks: usize,
    /// Tensor-parallel ranks (`--tp`; 1 = off).
    pub tp_ranks: usize,
    /// Where the ranks ran: `one` (one after another on one executor) or
    /// `spread` (rank `r` on its own GPU, concurrently).
    pub tp_gpus: String,
    /// Where the `--dcp` ranks ran: `one` (simulated on one executor) or
    /// `spread` (rank `r` on its own GPU, states all-gathered over NCCL).
    pub dcp_gpus: String,
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

/// The device-error events the backends counted (0 expected), per kernel
/// family: a flag bit means something only within its family.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DeviceErrorsReport {
    /// Events of every family.
    pub count: u32,
    /// The families that counted events.
    pub families: Vec<FamilyErrors>,
}

/// One kernel family's device-error events.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct FamilyErrors {
    /// Kernel family (`page-table`, `swa-pool`, `fp8-kv`, `paged-attention`).
    pub family: String,
    /// Events.
    pub count: u32,
    /// The family's flag bits, OR-ed over its events.
    pub flags: u32,
    /// Names of the set flags (the family's `ErrorFlags`).
    pub events: Vec<String>,
}

impl DeviceErrorsReport {
    /// The report of `e`.
    pub fn of(e: &mha_backend::DeviceErrorReport) -> Self {
        let families = e
            .families()
            .iter()
            .filter(|(_, r, _)| !r.is_clean())
            .map(|(name, r, flags)| FamilyErrors {
                family: (*name).into(),
                count: r.count,
                flags: r.flags,
                events: mha_backend::flag_names(*r, flags),
            })
            .collect();
        Self {
            count: e.count(),
            families,
        }
    }
}

/// One rank's figures: a tensor-parallel rank (`--tp N`, N > 1: its heads
/// of layer 0 and its share of the run; one after another on one executor
/// the totals are the sums of these) or a decode context-parallel rank on
/// its own GPU (`--dcp N --dcp-gpus spread`: every head; its decode passes
/// read its interleaved pages, `1 / N` of their K/V, and it checks its own
/// merged outputs).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RankReport {
    /// Rank index.
    pub rank: usize,
    /// Global query heads of layer 0, `first..end`.
    pub q_heads: String,
    /// Global KV heads of layer 0, `first..end`.
    pub kv_heads: String,
    /// The rank's executor (`cpu`, `cuda:N`).
    pub device: String,
    /// Seconds in KV write + attention.
    pub attention_s: f64,
    /// Seconds building metadata.
    pub metadata_s: f64,
    /// KV bytes read by the rank's attention.
    pub kv_bytes_read: f64,
    /// `kv_bytes_read / attention_s`, GB/s.
    pub bandwidth_gbps: f64,
    /// The rank's attention FLOPs.
    pub flops: f64,
    /// Device-error events of the rank's backends.
    pub device_errors: u32,
    /// Context-parallel ranks: the hash of the rank's sampled output rows
    /// (every rank's should be rank 0's: each merges the same gathered
    /// states); empty for tensor-parallel ranks (checked joined).
    pub output_hash: String,
    /// Context-parallel ranks: (layer, part) pairs of the rank's own check
    /// outside tolerance; 0 for tensor-parallel ranks (checked joined).
    pub mismatched_pairs: u64,
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
    /// Per tensor-parallel rank (empty without `--tp`).
    pub ranks: Vec<RankReport>,
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

/// `bytes / seconds` in GB/s (0 for no time).
pub fn gbps(bytes: f64, seconds: f64) -> f64 {
    ratio(bytes, seconds) / 1e9
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

impl Report {
    /// Whether the run is clean: no mismatch and no device error.
    pub fn passed(&self) -> bool {
        self.check.mismatched_pairs == 0 && self.device_errors.count == 0
    }
}

#[cfg(test)]
mod tests;

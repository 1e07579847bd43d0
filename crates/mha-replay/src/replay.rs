//! The replay loop: scheduler → passes → engine → checker → report.
//!
//! Without speculation each scheduler step is one target pass: EXTEND
//! (prefill chunks only), MIXED (chunks + decodes) or DECODE. With
//! `--spec-steps S` (`N = S + 1` tokens verified) a step is an EXTEND of
//! the prefill chunks (target, then the draft model over the same chunks)
//! and a speculative iteration over the decoding requests, each holding
//! `L` tokens:
//!
//! 1. `N` slots allocated per request (target and draft pools mirror);
//! 2. `S − 1` draft decode passes (multi-step draft backend, step `s`
//!    writes position `L + s`, attends `L + s + 1` keys);
//! 3. TARGET_VERIFY of `n_i = min(N, tokens still to generate)` rows per
//!    request (ragged `verify_lens` when some `n_i < N`, else uniform);
//! 4. DRAFT_EXTEND_V2 of the `N` tokens on the draft model;
//! 5. acceptance drawn from the seed (each draft token accepted with
//!    probability 0.75 until the first rejection, at most `n_i − 1`), plus
//!    the bonus token: `c_i` tokens committed, both pools truncated to `L + c_i`.

use std::sync::Arc;
use std::time::Instant;

use indicatif::ProgressBar;
use mha_backend::{
    ForwardBatch, HeadShard, KvCacheDtype, LayerConfig, MhaBackend, MultiStepDraftBackend,
};

use crate::check::{default_check_workers, CheckPool, Checker};
use crate::config::Setup;
pub use crate::dcp::run_dcp_ranks;
use crate::engine::{Engine, PassOutput};
use crate::error::{ReplayError, Result};
use crate::gen::{unit_hash, Generator, ModelId};
use crate::pass::{part_work, Part, Pass, PassKind};
use crate::ranks::{join_ranks, Draft, Models, Rank, RankTotals, Which};
use crate::report::{
    gbps, DeviceErrorsReport, PassRecord, RankReport, Recorder, Report, RunConfig, Workload,
};
use crate::sched::{KvPools, Scheduler};
use paged_attention::nccl::DcpComm;

/// Probability that a draft token is accepted (given the previous one was).
pub const ACCEPT_PROB: f64 = 0.75;

/// Runs passes through the engines (one per rank), joins the ranks'
/// outputs, checks samples, records.
struct Runner<'a, 'e> {
    engines: &'a mut [&'e mut dyn Engine],
    checks: CheckPool,
    rec: Recorder,
    seed: u64,
    fraction: f64,
    kv_elem: f64,
    salt: u64,
    target_layers: Vec<LayerConfig>,
    draft_layers: Vec<LayerConfig>,
    /// `[rank][model]`: the rank's share of the target's / draft's layers.
    shards: Vec<[Vec<HeadShard>; 2]>,
    /// The ranks run on their own GPUs (`--tp-gpus spread`).
    concurrent: bool,
    /// Share of a decode-kernel pass's K/V this engine reads: `1 / N` for
    /// a rank of an NCCL decode context-parallel group (`--dcp-gpus
    /// spread`: it reads its interleaved pages only; approximately, since a
    /// request of fewer than `N` pages is read by the ranks holding them),
    /// else 1.
    decode_kv_share: f64,
    progress: &'a ProgressBar,
    /// Passes submitted whose outputs have not come back yet, oldest first.
    in_flight: std::collections::VecDeque<(Arc<Pass>, f64)>,
    /// Per rank: outputs that came back, waiting for the other ranks'.
    pending: Vec<std::collections::VecDeque<PassOutput>>,
    ranks: Vec<RankTotals>,
    /// Hash of the sampled rows ([`crate::check::CheckStats::output_hash`]).
    hash: Fnv1a,
}

/// FNV-1a, 64-bit.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl Runner<'_, '_> {
    fn next_salt(&mut self) -> u64 {
        self.salt += 1;
        self.salt
    }

    fn exec(
        &mut self,
        models: &mut Models,
        which: Which,
        pass: &Pass,
        metadata_ready: bool,
        extra_metadata_s: f64,
    ) -> Result<()> {
        let layers = match pass.model {
            ModelId::Target => &self.target_layers,
            ModelId::Draft => &self.draft_layers,
        };
        let mut sample = Vec::new();
        if self.fraction > 0.0 {
            for li in 0..layers.len() {
                for pi in 0..pass.parts.len() {
                    let u = unit_hash(self.seed, &[0x5A, pass.salt, li as u64, pi as u64]);
                    if u < self.fraction {
                        sample.push((li, pi));
                    }
                }
            }
        }
        for (r, rank) in models.ranks.iter_mut().enumerate() {
            let backend = rank.pick(which)?;
            let shards = &self.shards[r][pass.model as usize];
            let outs =
                self.engines[r].submit_pass(backend, pass, shards, metadata_ready, &sample)?;
            self.pending[r].extend(outs);
        }
        self.in_flight
            .push_back((Arc::new(pass.clone()), extra_metadata_s));
        self.collect()?;
        self.progress.set_message(format!(
            "{} bs {} · {} passes",
            pass.kind.name(),
            pass.batch_size(),
            self.rec.passes.len()
        ));
        Ok(())
    }

    /// Records every pass whose outputs came back from all ranks.
    fn collect(&mut self) -> Result<()> {
        while self.pending.iter().all(|q| !q.is_empty()) {
            let outs: Vec<PassOutput> = self
                .pending
                .iter_mut()
                .filter_map(std::collections::VecDeque::pop_front)
                .collect();
            self.record(outs)?;
        }
        Ok(())
    }

    /// Records the oldest in-flight pass from its ranks' outputs (rank
    /// order) and hands its samples to the checkers.
    fn record(&mut self, outs: Vec<PassOutput>) -> Result<()> {
        let (pass, extra_metadata_s) = self.in_flight.pop_front().ok_or_else(|| {
            ReplayError::Internal("engine returned a pass it was not given".into())
        })?;
        let (mut kv_bytes, mut flops) = (0.0, 0.0);
        let share = if pass.kind.decode_kernel() {
            self.decode_kv_share
        } else {
            1.0
        };
        for (r, out) in outs.iter().enumerate() {
            let (mut b, mut f) = (0.0, 0.0);
            for s in &self.shards[r][pass.model as usize] {
                let l = &s.layer;
                for p in &pass.parts {
                    let (tokens, pf) = part_work(p, l);
                    b += (tokens * l.num_kv_heads * l.head_dim * 2) as f64 * self.kv_elem * share;
                    f += pf * share;
                }
            }
            let t = &mut self.ranks[r];
            t.attention_s += out.attention_s;
            t.metadata_s += out.metadata_s;
            t.kv_bytes += b;
            t.flops += f;
            kv_bytes += b;
            flops += f;
        }
        let out = join_ranks(outs, &pass, &self.shards, self.concurrent)?;
        self.rec.generate_s += out.generate_s;
        self.rec.passes.push(PassRecord {
            kind: pass.kind,
            batch_size: pass.batch_size(),
            rows: pass.rows(),
            metadata_s: out.metadata_s + extra_metadata_s,
            attention_s: out.attention_s,
            kv_bytes,
            flops,
            graph: out.graph,
            parts: out.parts,
        });
        for s in out.sampled {
            for w in [pass.salt, s.layer as u64, s.part as u64] {
                self.hash.bytes(&w.to_le_bytes());
            }
            for x in &s.rows {
                self.hash.bytes(&x.to_le_bytes());
            }
            self.checks.submit(&pass, s.layer, s.part, s.rows)?;
        }
        Ok(())
    }

    /// Waits for every pass in flight and records it.
    fn drain(&mut self) -> Result<()> {
        for (r, e) in self.engines.iter_mut().enumerate() {
            let outs = e.flush()?;
            self.pending[r].extend(outs);
        }
        self.collect()?;
        if self.in_flight.is_empty() && self.pending.iter().all(|q| q.is_empty()) {
            Ok(())
        } else {
            Err(ReplayError::Internal(format!(
                "{} passes never came back from the engines",
                self.in_flight.len()
            )))
        }
    }
}

/// Replays `setup` on `engine`; `progress` counts finished requests.
///
/// # Errors
/// Backend errors, [`ReplayError::Internal`]. Mismatches are not errors:
/// they are in the report ([`Report::passed`]).
pub fn run(setup: &Setup, engine: &mut dyn Engine, progress: &ProgressBar) -> Result<Report> {
    run_ranks(setup, &mut [engine], progress)
}

/// [`run`] with one engine per tensor-parallel rank (`setup.tp` of them,
/// rank order): rank `r` runs its backends on its share of the heads
/// ([`Setup::rank_layers`]) through `engines[r]`; each pass's outputs are
/// joined head-wise and checked as one.
///
/// # Errors
/// As [`run`]; [`ReplayError::Internal`] when `engines.len() != setup.tp`.
pub fn run_ranks(
    setup: &Setup,
    engines: &mut [&mut dyn Engine],
    progress: &ProgressBar,
) -> Result<Report> {
    if setup.dcp_spread {
        return Err(ReplayError::Internal(
            "--dcp-gpus spread runs through replay::run_dcp_ranks (one thread a GPU)".into(),
        ));
    }
    run_ranks_with(setup, engines, progress, None)
}

/// [`run_ranks`], the backends' decode passes running a context-parallel
/// group's rank when `group` is given (`--dcp-gpus spread`;
/// [`run_dcp_ranks`] calls it once a rank, each on its own GPU).
pub(crate) fn run_ranks_with(
    setup: &Setup,
    engines: &mut [&mut dyn Engine],
    progress: &ProgressBar,
    group: Option<&crate::dcp::RankJoin<'_>>,
) -> Result<Report> {
    let wall = Instant::now();
    if engines.len() != setup.tp {
        return Err(ReplayError::Internal(format!(
            "{} engines for {} tensor-parallel ranks",
            engines.len(),
            setup.tp
        )));
    }
    let info = engines[0].info();
    let ceiling = engines[0].copy_ceiling_gbps();
    let gen = Generator::new(setup.seed);
    let built = build_ranks(setup);
    // A context-parallel rank joins its group only once every rank has
    // built its backends, and runs only once every rank has attached
    // (`RankJoin`): a rank that failed alone would leave the others
    // waiting in NCCL.
    let (ranks, shards, comm) = match group {
        None => {
            let (r, s) = built?;
            (r, s, None)
        }
        Some(g) => {
            let comm = g.join(built.as_ref().err().map(ToString::to_string))?;
            let (mut r, s) = built?;
            let attached = r.iter_mut().try_for_each(|rank| -> Result<()> {
                // The draft's steps share its main backend's executor.
                rank.target.attach_decode_comm(comm.clone())?;
                if let Some(d) = &mut rank.draft {
                    d.main()?.attach_decode_comm(comm.clone())?;
                }
                Ok(())
            });
            g.confirm(attached.as_ref().err().map(ToString::to_string))?;
            (r, s, Some(comm))
        }
    };
    let mut models = Models { ranks };
    let mut sched = Scheduler::new(setup.sched_config(), setup.jobs.clone())?;
    let mut run = Runner {
        engines,
        checks: CheckPool::new(
            Checker::new(
                gen,
                setup.seed,
                setup.kv_dtype,
                setup.model.layers.clone(),
                setup.draft_layers(),
            ),
            default_check_workers(),
        ),
        rec: Recorder::default(),
        seed: setup.seed,
        fraction: setup.check_fraction,
        kv_elem: if setup.kv_dtype == KvCacheDtype::Fp8E4m3 {
            1.0
        } else {
            2.0
        },
        salt: 0,
        target_layers: setup.model.layers.clone(),
        draft_layers: setup.draft_layers(),
        shards,
        concurrent: setup.tp_spread,
        decode_kv_share: comm
            .as_ref()
            .map_or(1.0, |c: &Arc<DcpComm>| 1.0 / c.ranks() as f64),
        progress,
        in_flight: std::collections::VecDeque::new(),
        pending: vec![std::collections::VecDeque::new(); setup.tp],
        ranks: vec![RankTotals::default(); setup.tp],
        hash: Fnv1a::new(),
    };
    progress.set_length(setup.jobs.len() as u64);
    let n_spec = setup.spec_tokens();
    let mut generated: u64 = 0;
    let mut prefilled: u64 = 0;

    while !sched.is_done() {
        sched.admit(&mut models)?;
        let tick = sched.plan();
        if tick.prefill.is_empty() && tick.decode.is_empty() {
            return Err(ReplayError::Internal(
                "a scheduler step with no work".into(),
            ));
        }
        run.rec.scheduler_steps += 1;
        let spec = n_spec > 0;
        // Prefill chunks (and, without speculation, the decodes) in one pass.
        let decode_in_pass: &[usize] = if spec { &[] } else { &tick.decode };
        if !tick.prefill.is_empty() || !decode_in_pass.is_empty() {
            let mut grow = Vec::new();
            let mut parts = Vec::new();
            let (mut prefix, mut extend) = (Vec::new(), Vec::new());
            let mut row_start = 0;
            let entries = tick
                .prefill
                .iter()
                .map(|c| (c.idx, c.len))
                .chain(decode_in_pass.iter().map(|&i| (i, 1)));
            for (idx, len) in entries {
                let r = &sched.running()[idx];
                grow.push((r.row, len));
                prefix.push(r.kv_len as i32);
                extend.push(len as i32);
                parts.push(Part {
                    req: r.job.id,
                    row_start,
                    n: len,
                    kv_len: r.kv_len + len,
                });
                row_start += len;
            }
            let rows: Vec<i64> = grow.iter().map(|g| g.0 as i64).collect();
            let locs = models.alloc_tokens(&grow)?;
            let (kind, batch) = if tick.prefill.is_empty() {
                let seq = parts.iter().map(|p| p.kv_len as i64).collect();
                (PassKind::Decode, ForwardBatch::decode(rows, seq, locs))
            } else {
                let mixed = !decode_in_pass.is_empty();
                (
                    if mixed {
                        PassKind::Mixed
                    } else {
                        PassKind::Extend
                    },
                    ForwardBatch::extend(rows, prefix, extend, locs, mixed),
                )
            };
            let pass = Pass {
                kind,
                model: ModelId::Target,
                batch,
                parts,
                salt: run.next_salt(),
            };
            run.exec(&mut models, Which::Target, &pass, false, 0.0)?;
            if models.has_draft() {
                let dp = Pass {
                    kind: PassKind::DraftExtend,
                    model: ModelId::Draft,
                    salt: run.next_salt(),
                    ..pass
                };
                run.exec(&mut models, Which::Draft, &dp, false, 0.0)?;
            }
            for c in &tick.prefill {
                sched.prefilled(*c);
                prefilled += c.len as u64;
                if sched.running()[c.idx].decoding() {
                    generated += 1;
                }
            }
            for &i in decode_in_pass {
                sched.decoded(i, 1);
                generated += 1;
            }
        }
        if spec && !tick.decode.is_empty() {
            generated += speculate(setup, &mut sched, &mut models, &mut run, &tick.decode)?;
        }
        if setup.model.hybrid {
            for r in sched.running() {
                if r.kv_len > 0 {
                    for rank in &mut models.ranks {
                        rank.target.evict_swa(r.row, r.kv_len)?;
                    }
                }
            }
        }
        let done = sched.retire(&mut models)?;
        progress.inc(done.len() as u64);
    }

    run.drain()?;
    let Runner {
        checks,
        mut rec,
        ranks: rank_totals,
        shards,
        hash,
        ..
    } = run;
    let (mut check, check_s) = checks.finish()?;
    check.output_hash = format!("{:016x}", hash.0);
    rec.check_s = check_s;
    let (modes, by_batch_size, mut totals) = rec.summarise(ceiling);
    totals.wall_s = wall.elapsed().as_secs_f64();
    let rank_errs = models.rank_device_errors()?;
    let mut errs = mha_backend::DeviceErrorReport::default();
    for e in &rank_errs {
        errs.merge(e);
    }
    let mut rank_reports = Vec::new();
    if setup.tp > 1 {
        for (r, (t, e)) in rank_totals.iter().zip(&rank_errs).enumerate() {
            let s0 = &shards[r][0][0];
            rank_reports.push(RankReport {
                rank: r,
                q_heads: format!(
                    "{}..{}",
                    s0.q_head_offset,
                    s0.q_head_offset + s0.layer.num_q_heads
                ),
                kv_heads: format!(
                    "{}..{}",
                    s0.kv_head_offset,
                    s0.kv_head_offset + s0.layer.num_kv_heads
                ),
                device: match setup.rank_executor(r) {
                    crate::config::ExecutorChoice::Cpu => "cpu".into(),
                    crate::config::ExecutorChoice::Cuda(n) => format!("cuda:{n}"),
                },
                attention_s: t.attention_s,
                metadata_s: t.metadata_s,
                kv_bytes_read: t.kv_bytes,
                bandwidth_gbps: gbps(t.kv_bytes, t.attention_s),
                flops: t.flops,
                device_errors: e.count(),
                output_hash: String::new(),
                mismatched_pairs: 0,
            });
        }
    }
    let l0 = &setup.model.layers[0];
    let report = Report {
        config: RunConfig {
            executor: info.executor,
            device_notes: setup.device_notes.clone(),
            time_domain: info.time_domain.into(),
            model: setup.model.name.into(),
            layers: setup.model.layers.len(),
            heads: format!("{}/{}/{}", l0.num_q_heads, l0.num_kv_heads, l0.head_dim),
            swa_layers: setup
                .model
                .layers
                .iter()
                .filter(|l| l.window_left.is_some())
                .count(),
            kv_dtype: match setup.kv_dtype {
                KvCacheDtype::Fp8E4m3 => "fp8 (e4m3)".into(),
                _ => "bf16".into(),
            },
            page_size: setup.page_size,
            kv_pages: setup.kv_pages,
            max_batch: setup.max_batch,
            prefill_chunk: setup.prefill_chunk,
            spec_steps: setup.spec_steps,
            decode_cp_ranks: setup.dcp,
            tp_ranks: setup.tp,
            tp_gpus: if setup.tp_spread { "spread" } else { "one" }.into(),
            dcp_gpus: if setup.dcp_spread { "spread" } else { "one" }.into(),
            cuda_graphs: if info.graphs_applicable {
                if setup.cuda_graphs { "on" } else { "off" }.into()
            } else {
                format!(
                    "n/a on the {} executor (no graphs; --cuda-graphs has no effect)",
                    setup.executor.name()
                )
            },
            split_timing: match info.split_timing {
                Some(true) => "on (CUDA events around the K/V-write, context and decode launches of eager passes; graph replays counted whole as decode)".into(),
                Some(false) => "off (--split-timing off)".into(),
                None => format!(
                    "n/a on the {} executor (no CUDA events; --split-timing has no effect)",
                    setup.executor.name()
                ),
            },
            seed: setup.seed,
            check_fraction: setup.check_fraction,
        },
        workload: Workload {
            trace: setup.trace_name.clone(),
            trace_requests: setup.trace_requests,
            requests: setup.jobs.len(),
            finished: sched.finished().len(),
            trace_prompt_tokens: setup
                .slice
                .iter()
                .map(|r| u64::from(r.context_tokens))
                .sum(),
            trace_generated_tokens: setup
                .slice
                .iter()
                .map(|r| u64::from(r.generated_tokens))
                .sum(),
            prompt_tokens: prefilled,
            generated_tokens: generated,
            capped_prompts: setup
                .slice
                .iter()
                .zip(&setup.jobs)
                .filter(|(r, j)| j.prompt < r.context_tokens as usize)
                .count(),
            capped_outputs: setup
                .slice
                .iter()
                .zip(&setup.jobs)
                .filter(|(r, j)| j.output < r.generated_tokens as usize)
                .count(),
            max_context: setup.max_context,
            max_output: setup.max_output,
        },
        modes,
        totals,
        check,
        device_errors: DeviceErrorsReport::of(&errs),
        by_batch_size,
        ranks: rank_reports,
    };
    Ok(report)
}

/// Every rank's backends and head shards ([`run_ranks`]).
type Built = (Vec<Rank>, Vec<[Vec<HeadShard>; 2]>);

fn build_ranks(setup: &Setup) -> Result<Built> {
    let mut ranks = Vec::with_capacity(setup.tp);
    let mut shards = Vec::with_capacity(setup.tp);
    for r in 0..setup.tp {
        let device = setup.rank_executor(r).device();
        let target = MhaBackend::new(setup.rank_target_config(r)?, device)?;
        let draft = match setup.rank_draft_config(r)? {
            None => None,
            Some(c) if setup.spec_steps == 1 => {
                Some(Draft::Single(Box::new(MhaBackend::new(c, device)?)))
            }
            Some(c) => Some(Draft::Multi(MultiStepDraftBackend::new(c, device)?)),
        };
        ranks.push(Rank { target, draft });
        shards.push([
            setup.rank_layers(&setup.model.layers, r)?,
            setup.rank_layers(&setup.draft_layers(), r)?,
        ]);
    }
    Ok((ranks, shards))
}

/// One speculative iteration over the decoding requests `dec`; returns the
/// tokens committed.
fn speculate(
    setup: &Setup,
    sched: &mut Scheduler,
    models: &mut Models,
    run: &mut Runner<'_, '_>,
    dec: &[usize],
) -> Result<u64> {
    let n = setup.spec_tokens();
    let s_steps = setup.spec_steps;
    let rows: Vec<i64> = dec.iter().map(|&i| sched.running()[i].row as i64).collect();
    let lens: Vec<usize> = dec.iter().map(|&i| sched.running()[i].kv_len).collect();
    let ids: Vec<usize> = dec.iter().map(|&i| sched.running()[i].job.id).collect();
    let grow: Vec<(usize, usize)> = rows.iter().map(|&r| (r as usize, n)).collect();
    let locs = models.alloc_tokens(&grow)?;
    let seq: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    let bs = dec.len();

    // 2. Draft decode steps 0..S−1 (S − 1 passes).
    if s_steps >= 2 && models.has_draft() {
        let step_locs = |s: usize| (0..bs).map(|i| locs[i * n + s]).collect::<Vec<i64>>();
        let base = ForwardBatch::draft_decode(rows.clone(), seq.clone(), step_locs(0), None);
        let t = Instant::now();
        for rank in &mut models.ranks {
            match &mut rank.draft {
                Some(Draft::Multi(m)) => m.init_forward_metadata(&base)?,
                _ => {
                    return Err(ReplayError::Internal(
                        "draft steps without a multi-step draft backend".into(),
                    ))
                }
            }
        }
        let meta_s = t.elapsed().as_secs_f64();
        for s in 0..s_steps - 1 {
            let batch = ForwardBatch {
                out_cache_loc: step_locs(s),
                ..base.clone()
            };
            let parts = (0..bs)
                .map(|i| Part {
                    req: ids[i],
                    row_start: i,
                    n: 1,
                    kv_len: lens[i] + s + 1,
                })
                .collect();
            let pass = Pass {
                kind: PassKind::DraftDecode,
                model: ModelId::Draft,
                batch,
                parts,
                salt: run.next_salt(),
            };
            let extra = if s == 0 { meta_s } else { 0.0 };
            run.exec(models, Which::DraftStep(s), &pass, true, extra)?;
        }
    }

    // 3. Target verify, n_i rows per request.
    let n_i: Vec<usize> = dec
        .iter()
        .map(|&i| sched.running()[i].remaining().min(n))
        .collect();
    let ragged = n_i.iter().any(|&x| x != n);
    let mut out = Vec::new();
    let mut parts = Vec::new();
    let mut row_start = 0;
    for i in 0..bs {
        out.extend_from_slice(&locs[i * n..i * n + n_i[i]]);
        parts.push(Part {
            req: ids[i],
            row_start,
            n: n_i[i],
            kv_len: lens[i] + n_i[i],
        });
        row_start += n_i[i];
    }
    let verify_lens = ragged.then(|| n_i.iter().map(|&x| x as i32).collect());
    let pass = Pass {
        kind: if ragged {
            PassKind::TargetVerifyRagged
        } else {
            PassKind::TargetVerify
        },
        model: ModelId::Target,
        batch: ForwardBatch::target_verify(rows.clone(), seq.clone(), out, verify_lens),
        parts,
        salt: run.next_salt(),
    };
    run.exec(models, Which::Target, &pass, false, 0.0)?;

    // 4. Draft extend over the N tokens.
    if models.has_draft() {
        let seq_n: Vec<i64> = lens.iter().map(|&l| (l + n) as i64).collect();
        let parts = (0..bs)
            .map(|i| Part {
                req: ids[i],
                row_start: i * n,
                n,
                kv_len: lens[i] + n,
            })
            .collect();
        let pass = Pass {
            kind: PassKind::DraftExtendV2,
            model: ModelId::Draft,
            batch: ForwardBatch::draft_extend_v2(rows.clone(), seq_n, locs.clone(), n as i32),
            parts,
            salt: run.next_salt(),
        };
        run.exec(models, Which::Draft, &pass, false, 0.0)?;
    }

    // 5. Acceptance and commit.
    let salt = run.salt;
    let mut committed = 0u64;
    for (i, &idx) in dec.iter().enumerate() {
        let mut accepted = 0;
        while accepted + 1 < n_i[i]
            && unit_hash(setup.seed, &[0xACC, salt, ids[i] as u64, accepted as u64]) < ACCEPT_PROB
        {
            accepted += 1;
        }
        let c = accepted + 1;
        models.truncate(rows[i] as usize, lens[i] + c)?;
        sched.decoded(idx, c);
        committed += c as u64;
    }
    Ok(committed)
}

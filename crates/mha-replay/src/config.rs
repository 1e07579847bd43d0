//! Command line (clap) and the resolved replay setup. Defaults depend on the
//! executor: the CPU executor runs the f64 reference (≈ 0.2 GMAC/s), so its
//! defaults keep a run under a minute on 2 cores; the CUDA executor's
//! defaults are the full job.
//!
//! | flag | CPU executor default | CUDA executor default |
//! |---|---|---|
//! | `--model` | `tiny` | `llama3-8b` |
//! | `--requests` | 200 | all |
//! | `--max-context` | 192 tokens | none |
//! | `--max-output` | 32 tokens | none |
//! | `--max-batch` | 32 | 256 |
//! | `--prefill-chunk` | 128 tokens | 8192 tokens |
//! | `--check-fraction` | 0.02 | 0.001 |

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, ValueEnum};
use mha_backend::{
    BackendConfig, BackendError, Device, HalfDtype, HeadShard, KvCacheDtype, LayerConfig,
    SpecConfig, MAX_DECODE_Q_LEN,
};

use crate::error::{flag_err, ReplayError, Result};
use crate::model::{ModelPreset, ModelShape};
use crate::placement::{resolve_dcp_gpus, resolve_tp_gpus};
pub use crate::placement::{RankGpus, TpGpus};
use crate::sched::{Job, SchedConfig};
use crate::trace::{Trace, TraceRequest};

/// Largest KV cache the CPU executor may allocate, bytes (8 GiB).
pub const CPU_KV_LIMIT_BYTES: u64 = 8 << 30;

/// `--kv-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtypeArg {
    /// bf16 cache (bit copy of the new K/V).
    Bf16,
    /// FP8 e4m3 cache (fused quantize + write with the layer's scales).
    Fp8,
}

/// `--cuda-graphs`, `--split-timing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// A count or "no limit" (`all` / `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<usize>);

impl FromStr for Limit {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "all" | "none" | "off" => Ok(Self(None)),
            v => match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Self(Some(n))),
                _ => Err(format!(
                    "expected a positive integer, or `all` / `none` (both: no limit), got {s:?}"
                )),
            },
        }
    }
}

/// Replay a production LLM serving trace through the mha-kit paged-attention
/// backend: continuous batching, chunked prefill, decode, speculative
/// verify; reports speed and accuracy.
#[derive(Debug, Clone, Parser)]
#[command(name = "mha-replay", version, about, long_about = None)]
pub struct Args {
    /// Trace: `conv` (embedded chat trace, 19,366 requests), `code`
    /// (embedded code trace, 8,819) or a CSV path with the columns
    /// TIMESTAMP, ContextTokens, GeneratedTokens.
    #[arg(long, default_value = "conv")]
    pub trace: String,
    /// Model preset (attention shapes of one TP rank). Default: `tiny` on
    /// the CPU executor, `llama3-8b` on CUDA.
    #[arg(long, value_enum)]
    pub model: Option<ModelPreset>,
    /// Number of attention layers (default: the preset's; its layer pattern repeats).
    #[arg(long)]
    pub layers: Option<usize>,
    /// KV-cache dtype.
    #[arg(long, value_enum, default_value = "bf16")]
    pub kv_dtype: KvDtypeArg,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Most requests running at once (request rows). Default: 32 CPU, 256 CUDA.
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Prompt tokens prefilled per step (chunked prefill). Default: 128 CPU, 8192 CUDA.
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Speculative decoding: draft steps per iteration (one-layer draft
    /// model, `steps + 1` tokens verified per request, ragged acceptance
    /// drawn from the seed); 0 = off. At most 15.
    #[arg(long, default_value_t = 0)]
    pub spec_steps: usize,
    /// Decode context parallelism: N ranks, each reading every N-th KV page
    /// of a request (page interleave); every decode / verify / draft pass
    /// computes each rank's partial output and log-sum-exp and merges them
    /// (sinks joined once); extend / mixed passes run unsplit. 1 = off. On
    /// the CUDA executor each rank's decode launch reads its pages of the
    /// global page table (`DecodeArgs::interleave`) and the merge-states
    /// kernel combines them: all ranks on the one GPU, or one GPU a rank
    /// over NCCL (`--dcp-gpus`).
    #[arg(long, default_value_t = 1)]
    pub dcp: usize,
    /// Where the `--dcp` ranks of the CUDA executor run: `spread` puts rank
    /// `r` on `cuda:(N + r)` (`N` the `--device` ordinal), one thread each
    /// running the whole replay (the same passes, in order) with its own
    /// context, stream, engine and backends; each decode pass launches the
    /// rank's pages only, all-gathers the partial states over NCCL and
    /// merges them on every rank (pools are whole on every rank: the K/V
    /// writes and prefill run everywhere). `spread` with `--dcp 1` forms a
    /// one-rank NCCL group (that path on one GPU). `one` simulates the ranks
    /// on the one GPU; `auto` spreads when there is a device for every rank
    /// and libnccl loads. `spread` is not available with `--tp` > 1 (`auto`
    /// then simulates).
    #[arg(long, value_enum, default_value = "auto")]
    pub dcp_gpus: RankGpus,
    /// Skip-softmax factor of decode / verify / draft passes (FlashInfer's
    /// `skip_softmax_threshold_scale_factor`; 0 = exact). The CUDA
    /// executor's tensor-core decode kernel applies it (each output within
    /// `2·f·max|V|` of exact attention); the CPU executor computes exact
    /// attention. `MHA_KIT_SKIP_SOFTMAX_DECODE` overrides it.
    #[arg(long, allow_negative_numbers = true)]
    pub skip_softmax_decode: Option<f32>,
    /// Tensor parallelism: the heads of every layer sharded over N ranks
    /// (rank r: query heads `[r·Hq/N, (r+1)·Hq/N)`, its KV heads, or one
    /// replicated KV head when N > Hkv), each rank its own backend and
    /// engine; the ranks' outputs are joined head-wise and checked as one.
    /// Where they run: `--tp-gpus` (the report lists each rank). 1 = off.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Where the `--tp` ranks of the CUDA executor run: `spread` puts rank
    /// `r` on `cuda:(N + r)` (`N` the `--device` ordinal), each with its own
    /// context, stream, engine and backends, the GPUs running concurrently
    /// (a pass's attention time is then its slowest rank's); `one` runs
    /// every rank on the one GPU, one after another (times add up); `auto`
    /// spreads when the driver reports enough devices. The CPU executor
    /// runs them one after another.
    #[arg(long, value_enum, default_value = "auto")]
    pub tp_gpus: TpGpus,
    /// CUDA graphs for decode-like passes (`off`: eager launches only; not
    /// applicable on the CPU executor).
    #[arg(long, value_enum, default_value = "on")]
    pub cuda_graphs: OnOff,
    /// Split the attention time into context-kernel, decode-kernel and
    /// K/V-write time with CUDA events around those launches of eager
    /// passes (graph replays count whole as decode) and report the context
    /// kernel's TFLOP/s. Not applicable on the CPU executor (no CUDA events).
    #[arg(long, value_enum, default_value = "on")]
    pub split_timing: OnOff,
    /// Executor: `auto`, `cpu` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Replay the first N requests (or `all`). Default: 200 CPU, all CUDA.
    #[arg(long)]
    pub requests: Option<Limit>,
    /// Seed of Q/K/V, sinks and speculative acceptance.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Share of (attention call, request) pairs recomputed independently
    /// and compared, in [0, 1]. Default: 0.02 CPU, 0.001 CUDA.
    #[arg(long)]
    pub check_fraction: Option<f64>,
    /// Cap on prompt tokens per request (or `none`). Default: 192 on the
    /// CPU executor, none on CUDA.
    #[arg(long)]
    pub max_context: Option<Limit>,
    /// Cap on generated tokens per request (or `none`). Default: 32 on the
    /// CPU executor, none on CUDA.
    #[arg(long)]
    pub max_output: Option<Limit>,
    /// Allocatable KV pages. Default: room for `--max-batch` requests of the
    /// replayed slice's mean length (at least the longest request).
    #[arg(long)]
    pub kv_pages: Option<usize>,
    /// Write the report as JSON to this path.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a PNG plot of step time and bandwidth against batch size.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// Which executor runs the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorChoice {
    /// mha-backend's CPU executor.
    Cpu,
    /// mha-backend's CUDA executor on device `N` (`--device cuda:N`),
    /// driven by the CUDA engine.
    Cuda(usize),
}

impl ExecutorChoice {
    /// The backend device.
    pub fn device(self) -> Device {
        match self {
            Self::Cpu => Device::Cpu,
            Self::Cuda(n) => Device::Cuda(n),
        }
    }

    /// Name for the report (`CPU`, `CUDA`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
            Self::Cuda(_) => "CUDA",
        }
    }
}

/// The resolved replay configuration.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Executor.
    pub executor: ExecutorChoice,
    /// Notes on how the device was chosen (printed).
    pub device_notes: Vec<String>,
    /// Trace name.
    pub trace_name: String,
    /// Requests in the whole trace.
    pub trace_requests: usize,
    /// The replayed slice (arrival order).
    pub slice: Vec<TraceRequest>,
    /// Jobs (slice after caps).
    pub jobs: Vec<Job>,
    /// Preset.
    pub preset: ModelPreset,
    /// Target model layers.
    pub model: ModelShape,
    /// KV dtype.
    pub kv_dtype: KvCacheDtype,
    /// Tokens per page.
    pub page_size: usize,
    /// Request rows.
    pub max_batch: usize,
    /// Prefill chunk, tokens.
    pub prefill_chunk: usize,
    /// Draft steps (0 = off).
    pub spec_steps: usize,
    /// Decode context-parallel ranks (`--dcp`, 1 = off).
    pub dcp: usize,
    /// Whether the `--dcp` ranks run one a GPU over NCCL, rank `r` on
    /// `cuda:(N + r)` (`--dcp-gpus` resolved; false on the CPU executor).
    pub dcp_spread: bool,
    /// Skip-softmax factor of decode passes (`--skip-softmax-decode`).
    pub skip_softmax_decode: Option<f32>,
    /// Tensor-parallel ranks (`--tp`, 1 = off).
    pub tp: usize,
    /// Whether rank `r` runs on its own GPU, `cuda:(N + r)` (`--tp-gpus`
    /// resolved; false on the CPU executor and with one rank).
    pub tp_spread: bool,
    /// `--cuda-graphs on`.
    pub cuda_graphs: bool,
    /// `--split-timing on`.
    pub split_timing: bool,
    /// Seed.
    pub seed: u64,
    /// Check fraction.
    pub check_fraction: f64,
    /// Prompt cap.
    pub max_context: Option<u32>,
    /// Output cap.
    pub max_output: Option<u32>,
    /// Allocatable KV pages.
    pub kv_pages: usize,
    /// `req_to_token` width.
    pub context_len: usize,
    /// JSON path.
    pub json: Option<PathBuf>,
    /// Plot path.
    pub plot: Option<PathBuf>,
}

/// The rank-local layer configs of `shards`.
fn shard_layers(shards: Vec<HeadShard>) -> Vec<LayerConfig> {
    shards.into_iter().map(|s| s.layer).collect()
}

fn positive(flag: &'static str, v: usize) -> Result<usize> {
    if v == 0 {
        Err(flag_err(flag, "must be ≥ 1"))
    } else {
        Ok(v)
    }
}

fn cap32(flag: &'static str, v: Option<usize>) -> Result<Option<u32>> {
    v.map(|n| u32::try_from(n).map_err(|_| flag_err(flag, format!("{n} is too large"))))
        .transpose()
}

impl Setup {
    /// Resolves `args` (device, defaults, trace, validation).
    ///
    /// # Errors
    /// [`ReplayError::Flag`] naming the flag of an impossible configuration;
    /// trace errors naming the file and line.
    pub fn from_args(args: &Args) -> Result<Self> {
        let device: Device = args
            .device
            .parse()
            .map_err(|e: BackendError| flag_err("--device", e.to_string()))?;
        let mut device_notes = Vec::new();
        let executor = match device {
            Device::Cpu => ExecutorChoice::Cpu,
            Device::Auto => match kernel_rt::gpu_status() {
                kernel_rt::GpuStatus::Available { .. } => match kernel_rt::Gpu::shared() {
                    Ok(gpu) => {
                        let n = gpu.context().ordinal();
                        device_notes.push(format!("auto: CUDA device {n} found"));
                        ExecutorChoice::Cuda(n)
                    }
                    Err(e) => {
                        device_notes.push(format!(
                            "a CUDA device is present but could not be opened ({e}); using the CPU engine"
                        ));
                        ExecutorChoice::Cpu
                    }
                },
                kernel_rt::GpuStatus::Missing(why) => {
                    device_notes.push(format!("no GPU: {why}"));
                    ExecutorChoice::Cpu
                }
            },
            Device::Cuda(ordinal) => {
                match kernel_rt::gpu_status() {
                    kernel_rt::GpuStatus::Missing(why) => {
                        return Err(flag_err(
                            "--device",
                            format!("cuda:{ordinal} requested but there is no GPU ({why}); use --device cpu or auto"),
                        ))
                    }
                    kernel_rt::GpuStatus::Available { devices } if ordinal >= *devices => {
                        return Err(flag_err(
                            "--device",
                            format!("cuda:{ordinal} requested, the driver reports {devices} device(s)"),
                        ))
                    }
                    kernel_rt::GpuStatus::Available { .. } => {}
                }
                ExecutorChoice::Cuda(ordinal)
            }
        };
        let cpu = executor == ExecutorChoice::Cpu;
        let d = |cpu_v: usize, cuda_v: usize| if cpu { cpu_v } else { cuda_v };

        let preset = args.model.unwrap_or(if cpu {
            ModelPreset::Tiny
        } else {
            ModelPreset::Llama3_8b
        });
        if let Some(n) = args.layers {
            positive("--layers", n)?;
        }
        let kv_dtype = match args.kv_dtype {
            KvDtypeArg::Bf16 => KvCacheDtype::Bf16,
            KvDtypeArg::Fp8 => KvCacheDtype::Fp8E4m3,
        };
        let model = preset.shape(args.layers, args.seed, kv_dtype == KvCacheDtype::Fp8E4m3);
        let page_size = positive("--page-size", args.page_size)?;
        let max_batch = positive("--max-batch", args.max_batch.unwrap_or(d(32, 256)))?;
        let prefill_chunk = positive(
            "--prefill-chunk",
            args.prefill_chunk.unwrap_or(d(128, 8192)),
        )?;
        if args.spec_steps + 1 > MAX_DECODE_Q_LEN {
            return Err(flag_err(
                "--spec-steps",
                format!(
                    "{} draft steps verify {} tokens per request; the decode kernel takes at most {MAX_DECODE_Q_LEN} rows (--spec-steps ≤ {})",
                    args.spec_steps,
                    args.spec_steps + 1,
                    MAX_DECODE_Q_LEN - 1
                ),
            ));
        }
        // Its range is the backend config's (checked in `validate`); on the
        // CUDA executor the ranks are simulated on the one GPU.
        let dcp = args.dcp;
        let check_fraction = args
            .check_fraction
            .unwrap_or(if cpu { 0.02 } else { 0.001 });
        if !(0.0..=1.0).contains(&check_fraction) {
            return Err(flag_err(
                "--check-fraction",
                format!("{check_fraction} is outside [0, 1]"),
            ));
        }
        let max_context = cap32(
            "--max-context",
            args.max_context
                .map_or(if cpu { Some(192) } else { None }, |l| l.0),
        )?;
        let max_output = cap32(
            "--max-output",
            args.max_output
                .map_or(if cpu { Some(32) } else { None }, |l| l.0),
        )?;

        let trace = Trace::load(&args.trace)?;
        let trace_requests = trace.requests.len();
        let want = args
            .requests
            .map_or(if cpu { Some(200) } else { None }, |l| l.0);
        let n = match want {
            Some(n) if n > trace_requests => {
                return Err(flag_err(
                    "--requests",
                    format!(
                        "{n} requested, the trace {} has {trace_requests}",
                        trace.name
                    ),
                ))
            }
            Some(n) => n,
            None => trace_requests,
        };
        let slice: Vec<TraceRequest> = trace.requests[..n].to_vec();
        let jobs: Vec<Job> = slice
            .iter()
            .map(|r| Job::from_trace(r, max_context, max_output))
            .collect();

        let spec_tokens = if args.spec_steps > 0 {
            args.spec_steps + 1
        } else {
            0
        };
        let sc = SchedConfig {
            page_size,
            num_pages: 1,
            max_batch,
            prefill_chunk,
            spec_tokens,
        };
        let max_need = jobs.iter().map(|j| sc.need_tokens(j)).max().unwrap_or(1);
        let max_pages = jobs.iter().map(|j| sc.need_pages(j)).max().unwrap_or(1);
        let mean_pages =
            jobs.iter().map(|j| sc.need_pages(j)).sum::<usize>() as f64 / jobs.len().max(1) as f64;
        let kv_pages = match args.kv_pages {
            Some(p) => positive("--kv-pages", p)?,
            None => max_pages.max((mean_pages * max_batch as f64).ceil() as usize),
        };
        let context_len = max_need.div_ceil(page_size) * page_size;

        let tp = positive("--tp", args.tp)?;
        let tp_spread = resolve_tp_gpus(args.tp_gpus, executor, tp, &mut device_notes)?;
        let dcp_spread = resolve_dcp_gpus(
            args.dcp_gpus,
            executor,
            positive("--dcp", dcp)?,
            tp,
            paged_attention::nccl::nccl_available(),
            &mut device_notes,
        )?;
        let setup = Self {
            executor,
            device_notes,
            trace_name: trace.name,
            trace_requests,
            slice,
            jobs,
            preset,
            model,
            kv_dtype,
            page_size,
            max_batch,
            prefill_chunk,
            spec_steps: args.spec_steps,
            dcp,
            dcp_spread,
            skip_softmax_decode: args.skip_softmax_decode,
            tp,
            tp_spread,
            cuda_graphs: args.cuda_graphs == OnOff::On,
            split_timing: args.split_timing == OnOff::On,
            seed: args.seed,
            check_fraction,
            max_context,
            max_output,
            kv_pages,
            context_len,
            json: args.json.clone(),
            plot: args.plot.clone(),
        };
        if let Some(p) = &setup.plot {
            let png = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e.eq_ignore_ascii_case("png"));
            if !png {
                return Err(flag_err(
                    "--plot",
                    format!(
                        "{}: the plot is a PNG image; give a path ending in .png",
                        p.display()
                    ),
                ));
            }
        }
        setup.validate()?;
        Ok(setup)
    }

    /// Scheduler parameters.
    pub fn sched_config(&self) -> SchedConfig {
        SchedConfig {
            page_size: self.page_size,
            num_pages: self.kv_pages,
            max_batch: self.max_batch,
            prefill_chunk: self.prefill_chunk,
            spec_tokens: self.spec_tokens(),
        }
    }

    /// `N`: tokens verified per request (0 without speculation).
    pub fn spec_tokens(&self) -> usize {
        if self.spec_steps > 0 {
            self.spec_steps + 1
        } else {
            0
        }
    }

    fn spec(&self) -> Option<SpecConfig> {
        (self.spec_steps > 0).then_some(SpecConfig {
            num_steps: self.spec_steps,
            num_draft_tokens: self.spec_steps + 1,
            topk: 1,
        })
    }

    /// Rank `rank`'s share of `layers` (`--tp`; the whole layers at 1).
    ///
    /// # Errors
    /// [`ReplayError::Flag`] naming `--tp` when a layer's heads do not shard
    /// over the ranks ([`LayerConfig::shard_heads`]).
    pub fn rank_layers(&self, layers: &[LayerConfig], rank: usize) -> Result<Vec<HeadShard>> {
        layers
            .iter()
            .map(|l| {
                l.shard_heads(rank, self.tp).map_err(|e| {
                    flag_err(
                        "--tp",
                        format!(
                            "{} ({}: {}/{}/{} heads)",
                            e, self.model.name, l.num_q_heads, l.num_kv_heads, l.head_dim
                        ),
                    )
                })
            })
            .collect()
    }

    /// Rank `rank`'s executor: `cuda:(N + rank)` with [`Self::tp_spread`],
    /// else [`Self::executor`].
    pub fn rank_executor(&self, rank: usize) -> ExecutorChoice {
        match self.executor {
            ExecutorChoice::Cuda(n) if self.tp_spread => ExecutorChoice::Cuda(n + rank),
            e => e,
        }
    }

    /// Rank `rank`'s backend configuration: [`Self::target_config`] on the
    /// rank's heads.
    ///
    /// # Errors
    /// As [`Self::rank_layers`].
    pub fn rank_target_config(&self, rank: usize) -> Result<BackendConfig> {
        Ok(BackendConfig {
            layers: shard_layers(self.rank_layers(&self.model.layers, rank)?),
            ..self.target_config()
        })
    }

    /// Rank `rank`'s draft backend configuration (with speculation).
    ///
    /// # Errors
    /// As [`Self::rank_layers`].
    pub fn rank_draft_config(&self, rank: usize) -> Result<Option<BackendConfig>> {
        let layers = shard_layers(self.rank_layers(&self.draft_layers(), rank)?);
        Ok(self.draft_config().map(|c| BackendConfig { layers, ..c }))
    }

    /// The target model's backend configuration.
    pub fn target_config(&self) -> BackendConfig {
        BackendConfig {
            layers: self.model.layers.clone(),
            page_size: self.page_size,
            context_len: self.context_len,
            kv_dtype: self.kv_dtype,
            model_dtype: HalfDtype::Bf16,
            max_graph_bs: self.max_batch.min(256),
            spec: self.spec(),
            workspace_bytes: None,
            max_requests: self.max_batch,
            num_pages: self.kv_pages,
            num_swa_pages: self.model.hybrid.then_some(self.kv_pages),
            decode_cp_ranks: self.dcp,
            skip_softmax_decode: self.skip_softmax_decode,
        }
    }

    /// The draft model's layers: one full-attention layer of the target's
    /// head shape (EAGLE-style), with the target's K/V scales.
    pub fn draft_layers(&self) -> Vec<LayerConfig> {
        if self.spec_steps == 0 {
            return Vec::new();
        }
        let t = &self.model.layers[0];
        vec![LayerConfig::new(t.num_q_heads, t.num_kv_heads, t.head_dim)
            .with_scales(t.k_scale, t.v_scale)]
    }

    /// The draft model's backend configuration (same pools as the target's,
    /// so allocations mirror slot for slot), with speculation.
    pub fn draft_config(&self) -> Option<BackendConfig> {
        (self.spec_steps > 0).then(|| BackendConfig {
            layers: self.draft_layers(),
            num_swa_pages: None,
            ..self.target_config()
        })
    }

    /// KV-cache bytes the executor holds (target + draft, every `--tp`
    /// rank: a KV head replicated onto several ranks counts once per rank).
    pub fn kv_cache_bytes(&self) -> u64 {
        let slots = (self.kv_pages as u64 + 1) * self.page_size as u64;
        let elem = if self.kv_dtype == KvCacheDtype::Fp8E4m3 {
            1
        } else {
            2
        };
        let replicas = |l: &LayerConfig| -> u64 {
            // Ranks per KV head when there are more ranks than KV heads.
            (self.tp / l.num_kv_heads.max(1)).max(1) as u64
        };
        self.model
            .layers
            .iter()
            .chain(&self.draft_layers())
            .map(|l| slots * (l.num_kv_heads * l.head_dim) as u64 * 2 * elem * replicas(l))
            .sum()
    }

    fn validate(&self) -> Result<()> {
        let map = |e: BackendError| -> ReplayError {
            match &e {
                BackendError::Config { field, .. } => {
                    let flag = match *field {
                        "page_size" => "--page-size",
                        "num_pages" | "num_swa_pages" => "--kv-pages",
                        "context_len" => "--max-context",
                        "max_requests" | "max_graph_bs" => "--max-batch",
                        "spec.num_steps" | "spec.num_draft_tokens" => "--spec-steps",
                        "kv_dtype" => "--kv-dtype",
                        "decode_cp_ranks" => "--dcp",
                        "skip_softmax_decode" => "--skip-softmax-decode",
                        _ => "--model",
                    };
                    flag_err(flag, e.to_string())
                }
                BackendError::TopkUnsupported(_) => flag_err("--spec-steps", e.to_string()),
                _ => ReplayError::Backend(e),
            }
        };
        self.target_config().validate().map_err(map)?;
        if let Some(c) = self.draft_config() {
            c.validate().map_err(map)?;
        }
        for rank in 0..self.tp {
            self.rank_target_config(rank)?.validate().map_err(map)?;
            if let Some(c) = self.rank_draft_config(rank)? {
                c.validate().map_err(map)?;
            }
        }
        if self.executor == ExecutorChoice::Cpu && self.kv_cache_bytes() > CPU_KV_LIMIT_BYTES {
            return Err(flag_err(
                "--kv-pages",
                format!(
                    "the CPU executor would hold {:.1} GiB of KV cache ({} pages × {} layers); the limit is {} GiB — lower --kv-pages, --max-batch or --layers",
                    self.kv_cache_bytes() as f64 / (1u64 << 30) as f64,
                    self.kv_pages,
                    self.model.layers.len(),
                    CPU_KV_LIMIT_BYTES >> 30
                ),
            ));
        }
        // The scheduler checks that the longest request fits the pool.
        crate::sched::Scheduler::new(self.sched_config(), self.jobs.clone()).map(|_| ())
    }
}

//! Backend configuration (SEMANTICS.md §backend.1, §backend.6; DESIGN.md D8, D12, D14).

use fp8_kv::{KvCacheDtype, KvScales};
use paged_attention::{HalfDtype, SplitMode};

use crate::error::{config_err, BackendError, Result};

/// Default workspace size: 512 MiB = 536,870,912 bytes (SEMANTICS.md §backend.6).
pub const DEFAULT_WORKSPACE_BYTES: usize = 512 << 20;
/// Environment variable overriding the workspace size, in bytes.
pub const WORKSPACE_ENV: &str = "MHA_KIT_WORKSPACE_BYTES";
/// Environment variable choosing the split-KV policy of decode / verify
/// launches whose batch already fills the GPU: `auto` (never split them) or
/// `CHUNK:MAX` ([`SplitMode::Chunked`] with `chunk_tokens = CHUNK`,
/// `max_splits = MAX`). Unset: [`DEFAULT_DECODE_SPLIT`].
pub const DECODE_SPLIT_ENV: &str = "MHA_KIT_DECODE_SPLIT";
/// Default split of full decode / verify batches: keys cut into 2048-token
/// chunks, at most 4 per request (a request with `L > 8192` keys gets
/// chunks of `2048 · ⌈n / 4⌉`, `n = ⌈L / 2048⌉`). Launches that leave SMs idle use
/// [`SplitMode::Auto`] whatever this is, and launches of at least 6 work
/// items an SM (5 with e4m3 K/V: `paged_attention::unsplit_items_per_sm`)
/// run unsplit (the kernel's length order balances them). Why: in a full batch of ragged
/// requests (a serving trace) one CTA per (request, KV head) makes the
/// longest request the tail of every layer; see mha-backend's crate docs
/// (2048 × 4 was the best of five settings on the H200, docs/PERF.md).
pub const DEFAULT_DECODE_SPLIT: SplitMode = SplitMode::Chunked {
    chunk_tokens: 2048,
    max_splits: 4,
};
/// Environment variable choosing how the CUDA executor runs the two
/// attention launches of a mixed pass (prefill chunks to the context
/// kernel, the one-token decode rows to the decode kernel):
/// `decode-first` / `context-first` (concurrently, on the executor's own
/// side stream, the named one enqueued first), `off` (one after the other
/// on one stream). Unset: [`DEFAULT_MIXED_OVERLAP`].
pub const MIXED_OVERLAP_ENV: &str = "MHA_KIT_MIXED_OVERLAP";
/// Environment variable overriding [`BackendConfig::skip_softmax_decode`]:
/// a factor `f ≥ 0` (`0` = exact attention) or `off`.
pub const SKIP_SOFTMAX_DECODE_ENV: &str = "MHA_KIT_SKIP_SOFTMAX_DECODE";
/// Default of [`MIXED_OVERLAP_ENV`].
pub const DEFAULT_MIXED_OVERLAP: MixedOverlap = MixedOverlap::DecodeFirst;

/// How a mixed pass runs its context and decode launches (CUDA executor).
///
/// The two launches share nothing a kernel writes: the context kernel writes
/// the output rows of the prefill chunks, the decode kernel those of the
/// decode rows; both only read Q and the (already written) K/V cache, and
/// their scratch is disjoint (the context launcher's own work counters and
/// split workspace, the backend workspace for decode). Run concurrently,
/// the SMs one kernel's tail leaves idle take the other's CTAs (the context
/// grid is persistent and takes its items from a counter, so CTAs that start
/// late take fewer) and the launch gap between them goes. Results are
/// bitwise the same in every mode (each kernel's arithmetic does not depend
/// on where or when its CTAs run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixedOverlap {
    /// One stream: the context launch, then the decode launch.
    Off,
    /// Decode launch enqueued first on the side stream, then the context
    /// launch on the pass's stream; the pass's stream waits for both.
    DecodeFirst,
    /// Context launch first on the pass's stream, then decode on the side
    /// stream; the pass's stream waits for both.
    ContextFirst,
}

/// Head dims with an attention kernel instantiation (paged-attention); the
/// CPU executor accepts the same set so a config valid on the CPU is valid
/// on the GPU.
pub const HEAD_DIMS: [usize; 3] = paged_attention::HEAD_DIMS;
/// Largest GQA group `Hq / Hkv` of the attention kernels.
pub const MAX_GROUP: usize = paged_attention::MAX_GROUP;
/// Largest query rows per request of the decode kernel (verify, draft extend);
/// the CPU executor enforces it too.
pub const MAX_DECODE_Q_LEN: usize = 16;

/// One attention layer's shape and parameters (SEMANTICS.md §backend.7).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    /// `Hq`: query heads of this rank.
    pub num_q_heads: usize,
    /// `Hkv`: KV heads; `Hq % Hkv == 0`, `Hq / Hkv ≤` [`MAX_GROUP`].
    pub num_kv_heads: usize,
    /// `D`, one of [`HEAD_DIMS`].
    pub head_dim: usize,
    /// `W`: a row at position `x` sees keys `max(0, x − W) ..= x`; `None` = no
    /// window; `Some(0)` = the own key only (D12). In a hybrid model the
    /// layers with a window are the SWA layers.
    pub window_left: Option<u32>,
    /// `[Hq]` f32 sink logits (SEMANTICS.md §attention.6), or none.
    pub sinks: Option<Vec<f32>>,
    /// Checkpoint K scale (used only with an e4m3 cache; missing, `≤ 0` or
    /// NaN → 1.0, D8).
    pub k_scale: Option<f32>,
    /// Checkpoint V scale (as `k_scale`).
    pub v_scale: Option<f32>,
    /// Softmax scale (`layer.scaling`); `None` = `1 / sqrt(D)`.
    pub sm_scale: Option<f32>,
}

impl LayerConfig {
    /// A full-attention layer `Hq / Hkv / D` without sinks or scales.
    pub fn new(num_q_heads: usize, num_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            num_q_heads,
            num_kv_heads,
            head_dim,
            window_left: None,
            sinks: None,
            k_scale: None,
            v_scale: None,
            sm_scale: None,
        }
    }

    /// With sliding window `window_left`.
    pub fn with_window(mut self, window_left: u32) -> Self {
        self.window_left = Some(window_left);
        self
    }

    /// With `[Hq]` sink logits.
    pub fn with_sinks(mut self, sinks: Vec<f32>) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// With checkpoint K/V scales.
    pub fn with_scales(mut self, k_scale: Option<f32>, v_scale: Option<f32>) -> Self {
        self.k_scale = k_scale;
        self.v_scale = v_scale;
        self
    }

    /// The softmax scale actually used: `sm_scale` or `1 / sqrt(D)`.
    pub fn resolved_sm_scale(&self) -> f32 {
        self.sm_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Elements of one token's K (or V) row, `Hkv · D`.
    pub fn kv_row_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Elements of one token's query / output row, `Hq · D`.
    pub fn q_row_elems(&self) -> usize {
        self.num_q_heads * self.head_dim
    }
}

/// Speculative decoding settings (EAGLE / MTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    /// `S`: draft steps; the multi-step draft backend builds `S − 1` step backends.
    pub num_steps: usize,
    /// `N`: draft tokens verified per request (uniform verify `q_len`, ≥ 1).
    pub num_draft_tokens: usize,
    /// EAGLE tree width; only `≤ 1` is supported ([`BackendError::TopkUnsupported`]).
    pub topk: usize,
}

/// Everything the backend needs at construction (SEMANTICS.md §backend.1).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// One entry per attention layer, in layer-id order.
    pub layers: Vec<LayerConfig>,
    /// `P ≥ 1`, tokens per page (any value, D16).
    pub page_size: usize,
    /// Model context length: `req_to_token` width and `M = ceil(context_len / P)`.
    pub context_len: usize,
    /// KV-cache dtype: bf16, f16 (must equal `model_dtype`) or e4m3.
    pub kv_dtype: KvCacheDtype,
    /// Model dtype: query, new K/V and output (bf16 or f16).
    pub model_dtype: HalfDtype,
    /// Largest CUDA-graph batch size (graph buckets; kept for the CUDA executor).
    pub max_graph_bs: usize,
    /// Speculative settings, if speculative decoding is used.
    pub spec: Option<SpecConfig>,
    /// Workspace bytes; `None` = [`WORKSPACE_ENV`] if set, else
    /// [`DEFAULT_WORKSPACE_BYTES`].
    pub workspace_bytes: Option<usize>,
    /// Request rows usable at once (`req_to_token` has one more: row 0, reserved).
    pub max_requests: usize,
    /// Allocatable pages of the full pool (plus the dummy page 0).
    pub num_pages: usize,
    /// Allocatable pages of the SWA pool of a hybrid model, or `None` for no
    /// SWA pool. With a pool, the layers with a window keep their KV there.
    pub num_swa_pages: Option<usize>,
    /// Decode context parallelism over `N` ranks by page interleave (page
    /// `e` of a request on rank `e mod N`), simulated on this backend: the
    /// passes of the decode kernel (decode, draft decode, target verify,
    /// draft extend) compute each rank's partial output and log-sum-exp
    /// over its pages, in global positions and without sinks, merge them
    /// and join the sinks once ([`paged_attention::cp`]); extend / mixed
    /// passes run unsplit. `1` = off, at most [`MAX_DECODE_CP_RANKS`]. The
    /// CUDA executor runs the ranks on its one GPU (interleaved decode
    /// launches merged by the merge-states kernel); engine memory refuses
    /// `N > 1`.
    pub decode_cp_ranks: usize,
    /// Skip-softmax factor of the decode-kernel passes (FlashInfer's
    /// `skip_softmax_threshold_scale_factor`, SEMANTICS.md §attention.9):
    /// `None` or 0 = exact attention; [`SKIP_SOFTMAX_DECODE_ENV`] overrides
    /// it. The CUDA executor's tensor-core decode kernel applies it; the
    /// CPU executor and the context kernel compute exact attention.
    pub skip_softmax_decode: Option<f32>,
}

/// Largest [`BackendConfig::decode_cp_ranks`].
pub const MAX_DECODE_CP_RANKS: usize = 64;

impl BackendConfig {
    /// A dense model: `num_layers` identical full-attention layers, bf16
    /// model and cache, no speculation, `max_graph_bs = 256`.
    pub fn dense(
        num_layers: usize,
        layer: LayerConfig,
        page_size: usize,
        context_len: usize,
        num_pages: usize,
        max_requests: usize,
    ) -> Self {
        Self {
            layers: vec![layer; num_layers],
            page_size,
            context_len,
            kv_dtype: KvCacheDtype::Bf16,
            model_dtype: HalfDtype::Bf16,
            max_graph_bs: 256,
            spec: None,
            workspace_bytes: None,
            max_requests,
            num_pages,
            num_swa_pages: None,
            decode_cp_ranks: 1,
            skip_softmax_decode: None,
        }
    }

    /// `M = ceil(context_len / P)`: page-table width.
    pub fn max_num_pages(&self) -> usize {
        self.context_len.div_ceil(self.page_size.max(1))
    }

    /// Whether layer `layer` keeps its KV in the SWA pool.
    pub fn is_swa_layer(&self, layer: usize) -> bool {
        self.num_swa_pages.is_some()
            && self
                .layers
                .get(layer)
                .is_some_and(|l| l.window_left.is_some())
    }

    /// The layer's resolved K/V scales (D8: resolved once, used by the write
    /// and by attention).
    pub fn layer_scales(&self, layer: &LayerConfig) -> KvScales {
        KvScales::from_values(self.kv_dtype, layer.k_scale, layer.v_scale)
    }

    /// Workspace bytes by the rule of SEMANTICS.md §backend.6 (with mha-kit's variable):
    /// the config value, else `MHA_KIT_WORKSPACE_BYTES`, else 512 MiB.
    ///
    /// # Errors
    /// [`BackendError::Config`] when the variable is set but not a positive integer.
    pub fn resolved_workspace_bytes(&self) -> Result<usize> {
        resolve_workspace_bytes(
            self.workspace_bytes,
            std::env::var(WORKSPACE_ENV).ok().as_deref(),
        )
    }

    /// Checks every field (D15). Called by the backend's constructor.
    ///
    /// # Errors
    /// [`BackendError::TopkUnsupported`] for `topk > 1`; [`BackendError::Config`]
    /// naming the first invalid field otherwise.
    pub fn validate(&self) -> Result<()> {
        if let Some(spec) = &self.spec {
            if spec.topk > 1 {
                return Err(BackendError::TopkUnsupported(spec.topk));
            }
            if spec.num_steps == 0 {
                return Err(config_err("spec.num_steps", "must be ≥ 1"));
            }
            if spec.num_draft_tokens == 0 || spec.num_draft_tokens > MAX_DECODE_Q_LEN {
                return Err(config_err(
                    "spec.num_draft_tokens",
                    format!(
                        "{} is outside 1..={MAX_DECODE_Q_LEN} (decode-kernel rows per request)",
                        spec.num_draft_tokens
                    ),
                ));
            }
        }
        if self.layers.is_empty() {
            return Err(config_err("layers", "at least one layer is needed"));
        }
        for (i, l) in self.layers.iter().enumerate() {
            validate_layer(i, l)?;
        }
        if self.page_size == 0 {
            return Err(config_err("page_size", "must be ≥ 1"));
        }
        if self.context_len == 0 {
            return Err(config_err("context_len", "must be ≥ 1"));
        }
        if i32::try_from(self.context_len).is_err() {
            return Err(config_err("context_len", "must fit in i32"));
        }
        if let (KvCacheDtype::Bf16, HalfDtype::F16) | (KvCacheDtype::F16, HalfDtype::Bf16) =
            (self.kv_dtype, self.model_dtype)
        {
            return Err(config_err(
                "kv_dtype",
                format!(
                    "a {:?} cache needs model dtype {:?} (16-bit caches are written by bit copy)",
                    self.kv_dtype, self.kv_dtype
                ),
            ));
        }
        if self.max_graph_bs == 0 {
            return Err(config_err("max_graph_bs", "must be ≥ 1"));
        }
        if self.max_requests == 0 {
            return Err(config_err("max_requests", "must be ≥ 1"));
        }
        if self.num_pages == 0 {
            return Err(config_err("num_pages", "must be ≥ 1"));
        }
        let slots_fit = |pages: usize| {
            pages
                .checked_add(1)
                .and_then(|p| p.checked_mul(self.page_size))
                .is_some_and(|s| i32::try_from(s).is_ok())
        };
        if !slots_fit(self.num_pages) {
            return Err(config_err(
                "num_pages",
                "(num_pages + 1) · page_size slots must fit in i32 (req_to_token)",
            ));
        }
        if let Some(swa) = self.num_swa_pages {
            if swa == 0 || !slots_fit(swa) {
                return Err(config_err(
                    "num_swa_pages",
                    "must be ≥ 1 and (pages + 1) · page_size must fit in i32",
                ));
            }
            if !self.layers.iter().any(|l| l.window_left.is_some()) {
                return Err(config_err(
                    "num_swa_pages",
                    "an SWA pool needs at least one layer with a window (SWA layer)",
                ));
            }
        }
        if !(1..=MAX_DECODE_CP_RANKS).contains(&self.decode_cp_ranks) {
            return Err(config_err(
                "decode_cp_ranks",
                format!(
                    "{} is outside 1..={MAX_DECODE_CP_RANKS}",
                    self.decode_cp_ranks
                ),
            ));
        }
        resolve_skip_softmax(self.skip_softmax_decode, None)?;
        self.resolved_workspace_bytes()?;
        Ok(())
    }
}

fn validate_layer(i: usize, l: &LayerConfig) -> Result<()> {
    let err = |detail: String| config_err("layers", format!("layer {i}: {detail}"));
    if l.num_q_heads == 0 || l.num_kv_heads == 0 {
        return Err(err("head counts must be ≥ 1".into()));
    }
    if l.num_q_heads % l.num_kv_heads != 0 {
        return Err(err(format!(
            "num_q_heads {} is not a multiple of num_kv_heads {}",
            l.num_q_heads, l.num_kv_heads
        )));
    }
    if l.num_q_heads / l.num_kv_heads > MAX_GROUP {
        return Err(err(format!(
            "GQA group {} exceeds {MAX_GROUP}",
            l.num_q_heads / l.num_kv_heads
        )));
    }
    if !HEAD_DIMS.contains(&l.head_dim) {
        return Err(err(format!(
            "head_dim {} is not one of {HEAD_DIMS:?}",
            l.head_dim
        )));
    }
    if let Some(s) = &l.sinks {
        if s.len() != l.num_q_heads {
            return Err(err(format!(
                "sinks has {} values, expected num_q_heads = {}",
                s.len(),
                l.num_q_heads
            )));
        }
        if s.iter().any(|x| x.is_nan()) {
            return Err(err("sinks contain NaN".into()));
        }
    }
    if let Some(s) = l.sm_scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(err(format!("sm_scale {s} must be finite and > 0")));
        }
    }
    Ok(())
}

/// The split policy of full decode batches from [`DECODE_SPLIT_ENV`]'s
/// value: `None` → [`DEFAULT_DECODE_SPLIT`], `auto` → [`SplitMode::Auto`],
/// `CHUNK:MAX` → [`SplitMode::Chunked`] (both ≥ 1).
///
/// # Errors
/// [`BackendError::Config`] naming the variable for any other value.
pub fn resolve_decode_split(env: Option<&str>) -> Result<SplitMode> {
    let Some(v) = env.map(str::trim) else {
        return Ok(DEFAULT_DECODE_SPLIT);
    };
    if v.eq_ignore_ascii_case("auto") {
        return Ok(SplitMode::Auto);
    }
    let parsed = v.split_once(':').and_then(|(c, m)| {
        let c = c
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&c| (1..1 << 30).contains(&c))?;
        let m = m
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&m| (1..=1024).contains(&m))?;
        Some(SplitMode::Chunked {
            chunk_tokens: c,
            max_splits: m,
        })
    });
    parsed.ok_or_else(|| {
        config_err(
            "decode_split",
            format!("{DECODE_SPLIT_ENV}={v:?} is neither \"auto\" nor CHUNK:MAX (1 ≤ CHUNK < 2^30, 1 ≤ MAX ≤ 1024)"),
        )
    })
}

/// The skip-softmax factor of decode passes: [`SKIP_SOFTMAX_DECODE_ENV`]'s
/// value when set (`off` / `none` → `None`, else a factor), else the
/// config's; a factor must be finite and ≥ 0.
///
/// # Errors
/// [`BackendError::Config`] naming the variable or the field.
pub fn resolve_skip_softmax(config: Option<f32>, env: Option<&str>) -> Result<Option<f32>> {
    let f = match env.map(str::trim) {
        None => config,
        Some(v) if v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("none") => None,
        Some(v) => Some(v.parse::<f32>().map_err(|_| {
            config_err(
                "skip_softmax_decode",
                format!("{SKIP_SOFTMAX_DECODE_ENV}={v:?} is neither a factor nor \"off\""),
            )
        })?),
    };
    match f {
        Some(x) if !(x.is_finite() && x >= 0.0) => Err(config_err(
            "skip_softmax_decode",
            format!("{x} (a finite factor ≥ 0; 0 or None: exact attention)"),
        )),
        f => Ok(f),
    }
}

/// The mixed-pass launch order from [`MIXED_OVERLAP_ENV`]'s value: `None`
/// or `on` → [`DEFAULT_MIXED_OVERLAP`], `off` / `0` → [`MixedOverlap::Off`],
/// `decode-first`, `context-first` (ASCII case ignored, surrounding spaces
/// trimmed).
///
/// # Errors
/// [`BackendError::Config`] naming the variable for any other value.
pub fn resolve_mixed_overlap(env: Option<&str>) -> Result<MixedOverlap> {
    let Some(v) = env.map(str::trim) else {
        return Ok(DEFAULT_MIXED_OVERLAP);
    };
    match v.to_ascii_lowercase().as_str() {
        "on" | "1" => Ok(DEFAULT_MIXED_OVERLAP),
        "off" | "0" => Ok(MixedOverlap::Off),
        "decode-first" => Ok(MixedOverlap::DecodeFirst),
        "context-first" => Ok(MixedOverlap::ContextFirst),
        _ => Err(config_err(
            "mixed_overlap",
            format!("{MIXED_OVERLAP_ENV}={v:?} is not one of off, on, decode-first, context-first"),
        )),
    }
}

/// The workspace rule as a pure function: `configured`, else `env` parsed
/// as bytes, else [`DEFAULT_WORKSPACE_BYTES`].
///
/// # Errors
/// [`BackendError::Config`] when `env` is not a positive integer or
/// `configured` is 0.
pub fn resolve_workspace_bytes(configured: Option<usize>, env: Option<&str>) -> Result<usize> {
    match (configured, env) {
        (Some(0), _) => Err(config_err("workspace_bytes", "must be > 0")),
        (Some(b), _) => Ok(b),
        (None, Some(s)) => match s.trim().parse::<usize>() {
            Ok(b) if b > 0 => Ok(b),
            _ => Err(config_err(
                "workspace_bytes",
                format!("{WORKSPACE_ENV}={s:?} is not a positive byte count"),
            )),
        },
        (None, None) => Ok(DEFAULT_WORKSPACE_BYTES),
    }
}

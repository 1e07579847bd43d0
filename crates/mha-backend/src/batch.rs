//! Forward modes and the forward batch (SEMANTICS.md §modes.1,
//! SEMANTICS.md §backend.3, §backend.5, §backend.10).

use crate::error::{batch_err, Result};
use crate::graph::{GraphKey, GraphKind};

/// The upstream forward mode (integer enum, values in declaration order from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ForwardMode {
    /// Prefill / chunked prefill (context kernel).
    Extend = 1,
    /// One new token per request (decode kernel).
    Decode = 2,
    /// Prefill chunks and decodes in one batch (context kernel).
    Mixed = 3,
    /// No work on this rank (usually `bs = 0`); treated as decode.
    Idle = 4,
    /// Target-model verification of draft tokens (decode kernel, multi-row).
    TargetVerify = 5,
    /// Draft-model extend after verification, same length per request (decode kernel).
    DraftExtendV2 = 6,
    /// Treated as an extend.
    Prebuilt = 7,
    /// Treated as an extend.
    SplitPrefill = 8,
    /// Treated as an extend.
    DllmExtend = 9,
}

impl ForwardMode {
    /// DECODE or IDLE.
    pub fn is_decode_or_idle(self) -> bool {
        matches!(self, Self::Decode | Self::Idle)
    }

    /// Upstream's `is_extend` (EXTEND, MIXED, TARGET_VERIFY, SPLIT_PREFILL, DLLM_EXTEND).
    pub fn is_extend(self) -> bool {
        matches!(
            self,
            Self::Extend | Self::Mixed | Self::TargetVerify | Self::SplitPrefill | Self::DllmExtend
        )
    }
}

/// Speculative-decoding information attached to a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecInfo {
    /// EAGLE draft input on a DECODE/IDLE batch: a draft decode step.
    /// `step` overrides the backend's own `speculative_step_id` (useful when
    /// one backend serves every step); `None` uses the backend's id.
    Draft {
        /// Draft step id `s` (offset `s + 1`), or `None` for the backend's own.
        step: Option<u32>,
    },
    /// Target verify input on a TARGET_VERIFY batch.
    Verify {
        /// Ragged layout: `[bs]` query rows per request (each `≥ 0`, sum =
        /// the batch's tokens); `None` = uniform (`num_tokens / bs` each).
        verify_lens: Option<Vec<i32>>,
    },
}

/// One forward pass as the scheduler hands it to the backend. All fields
/// live on the host (the CUDA executor uploads what it needs).
///
/// `seq_lens` are the scheduler's KV lengths: for EXTEND / MIXED / DECODE /
/// DRAFT_EXTEND_V2 they include this pass's new tokens; for TARGET_VERIFY
/// they exclude the tokens being verified; for draft decode step `s` the
/// attention length is `seq_lens + s + 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardBatch {
    /// The forward mode.
    pub forward_mode: ForwardMode,
    /// `bs`: requests in the pass.
    pub batch_size: usize,
    /// `[bs]` rows of `req_to_token`.
    pub req_pool_indices: Vec<i64>,
    /// `[bs]` scheduler KV lengths, tokens.
    pub seq_lens: Vec<i64>,
    /// `[num_tokens]` full-pool slots receiving this pass's new K/V, in query-row order.
    pub out_cache_loc: Vec<i64>,
    /// `[bs]` new tokens per request (extend-like modes and DRAFT_EXTEND_V2).
    pub extend_seq_lens: Option<Vec<i32>>,
    /// `[bs]` cached prefix per request (extend-like modes); `None` =
    /// `seq_lens − extend_seq_lens`.
    pub extend_prefix_lens: Option<Vec<i32>>,
    /// Speculative information.
    pub spec_info: Option<SpecInfo>,
}

impl ForwardBatch {
    /// An IDLE batch with no request.
    pub fn idle() -> Self {
        Self {
            forward_mode: ForwardMode::Idle,
            batch_size: 0,
            req_pool_indices: Vec::new(),
            seq_lens: Vec::new(),
            out_cache_loc: Vec::new(),
            extend_seq_lens: None,
            extend_prefix_lens: None,
            spec_info: None,
        }
    }

    /// A DECODE batch: one new token per request; `seq_lens` include it.
    pub fn decode(req_pool_indices: Vec<i64>, seq_lens: Vec<i64>, out_cache_loc: Vec<i64>) -> Self {
        Self {
            forward_mode: ForwardMode::Decode,
            batch_size: req_pool_indices.len(),
            req_pool_indices,
            seq_lens,
            out_cache_loc,
            ..Self::idle()
        }
    }

    /// A draft-decode batch (DECODE with draft `spec_info`); `seq_lens`
    /// exclude the draft tokens (attention length `seq_lens + s + 1`).
    pub fn draft_decode(
        req_pool_indices: Vec<i64>,
        seq_lens: Vec<i64>,
        out_cache_loc: Vec<i64>,
        step: Option<u32>,
    ) -> Self {
        Self {
            spec_info: Some(SpecInfo::Draft { step }),
            ..Self::decode(req_pool_indices, seq_lens, out_cache_loc)
        }
    }

    /// An EXTEND batch (MIXED when `mixed`): request `i` has
    /// `prefix_lens[i]` cached tokens and `extend_lens[i]` new ones;
    /// `seq_lens = prefix + extend`.
    pub fn extend(
        req_pool_indices: Vec<i64>,
        prefix_lens: Vec<i32>,
        extend_lens: Vec<i32>,
        out_cache_loc: Vec<i64>,
        mixed: bool,
    ) -> Self {
        let seq_lens = prefix_lens
            .iter()
            .zip(&extend_lens)
            .map(|(&p, &e)| i64::from(p) + i64::from(e))
            .collect();
        Self {
            forward_mode: if mixed {
                ForwardMode::Mixed
            } else {
                ForwardMode::Extend
            },
            batch_size: req_pool_indices.len(),
            req_pool_indices,
            seq_lens,
            out_cache_loc,
            extend_seq_lens: Some(extend_lens),
            extend_prefix_lens: Some(prefix_lens),
            spec_info: None,
        }
    }

    /// A TARGET_VERIFY batch; `seq_lens` exclude the verified tokens;
    /// `verify_lens = None` is the uniform layout.
    pub fn target_verify(
        req_pool_indices: Vec<i64>,
        seq_lens: Vec<i64>,
        out_cache_loc: Vec<i64>,
        verify_lens: Option<Vec<i32>>,
    ) -> Self {
        Self {
            forward_mode: ForwardMode::TargetVerify,
            batch_size: req_pool_indices.len(),
            req_pool_indices,
            seq_lens,
            out_cache_loc,
            spec_info: Some(SpecInfo::Verify { verify_lens }),
            ..Self::idle()
        }
    }

    /// A DRAFT_EXTEND_V2 batch: `q_len` new tokens per request, `seq_lens`
    /// include them.
    pub fn draft_extend_v2(
        req_pool_indices: Vec<i64>,
        seq_lens: Vec<i64>,
        out_cache_loc: Vec<i64>,
        q_len: i32,
    ) -> Self {
        let bs = req_pool_indices.len();
        Self {
            forward_mode: ForwardMode::DraftExtendV2,
            batch_size: bs,
            req_pool_indices,
            seq_lens,
            out_cache_loc,
            extend_seq_lens: Some(vec![q_len; bs]),
            ..Self::idle()
        }
    }

    /// The ragged verify lengths, if the batch carries a ragged layout.
    pub fn verify_lens(&self) -> Option<&[i32]> {
        match &self.spec_info {
            Some(SpecInfo::Verify {
                verify_lens: Some(v),
            }) => Some(v),
            _ => None,
        }
    }

    /// Pads the batch to a CUDA-graph bucket of `bs` rows and `num_tokens`
    /// tokens (SEMANTICS.md §graph-metadata.4, DESIGN.md D3): padding rows get
    /// request row 0 and `seq_len` 1, padding tokens slot 0; a ragged verify
    /// layout is padded to cover the bucket (SEMANTICS.md §backend.5 step 1) and
    /// checked against `max_q_len` (§backend.5 decision). Eager metadata of the
    /// padded batch equals what a graph replay of that bucket computes.
    ///
    /// # Errors
    /// [`crate::BackendError::Kernel`] (capacity / unsupported) from
    /// graph-metadata's padding rules, e.g. a padding row longer than `max_q_len`.
    pub fn pad_to_bucket(&self, bs: usize, num_tokens: usize, max_q_len: u32) -> Result<Self> {
        let r = graph_metadata::prepare_replay(
            bs,
            num_tokens,
            &self.req_pool_indices,
            &self.seq_lens,
            &self.out_cache_loc,
        )?;
        let mut out = Self {
            batch_size: bs,
            req_pool_indices: r.req_pool_indices,
            seq_lens: r.seq_lens,
            out_cache_loc: r.out_cache_loc,
            ..self.clone()
        };
        if let Some(v) = self.verify_lens() {
            let padded = graph_metadata::pad_ragged_verify_lens(v, num_tokens, bs)?;
            graph_metadata::check_ragged_q_lens(&padded, max_q_len)?;
            out.spec_info = Some(SpecInfo::Verify {
                verify_lens: Some(padded),
            });
        } else if let Some(e) = &self.extend_seq_lens {
            let q = e.first().copied().unwrap_or(1);
            let mut e = e.clone();
            e.resize(bs, q);
            out.extend_seq_lens = Some(e);
            out.extend_prefix_lens = None;
        }
        Ok(out)
    }

    pub(crate) fn check_lengths(&self) -> Result<()> {
        let bs = self.batch_size;
        if self.req_pool_indices.len() != bs {
            return Err(batch_err(
                "req_pool_indices",
                format!(
                    "has {} entries, batch_size = {bs}",
                    self.req_pool_indices.len()
                ),
            ));
        }
        if self.seq_lens.len() != bs {
            return Err(batch_err(
                "seq_lens",
                format!("has {} entries, batch_size = {bs}", self.seq_lens.len()),
            ));
        }
        for (f, v) in [
            ("extend_seq_lens", &self.extend_seq_lens),
            ("extend_prefix_lens", &self.extend_prefix_lens),
        ] {
            if let Some(v) = v {
                if v.len() != bs {
                    return Err(batch_err(
                        f,
                        format!("has {} entries, batch_size = {bs}", v.len()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `batch` padded to the bucket `key` (D3; ragged lengths per SEMANTICS.md §backend.5).
pub(crate) fn pad_for(batch: &ForwardBatch, key: GraphKey) -> Result<ForwardBatch> {
    let mut b = batch.clone();
    if key.kind == GraphKind::RaggedVerify && b.verify_lens().is_none() {
        b.spec_info = Some(crate::SpecInfo::Verify {
            verify_lens: Some(Vec::new()),
        });
    }
    b.pad_to_bucket(key.bs, key.num_tokens, key.q_len as u32)
}

/// The branch a batch takes (SEMANTICS.md §backend.3, SEMANTICS.md §modes.1:
/// decode-or-idle → target verify → draft extend v2 → everything else is an
/// extend), with the draft step made explicit (SEMANTICS.md §backend.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnMode {
    /// DECODE / IDLE without spec_info: one row per request, offset 0.
    Decode,
    /// DECODE / IDLE with draft spec_info: draft step `step`, offset `step + 1`.
    DraftDecode {
        /// Draft step id.
        step: u32,
    },
    /// TARGET_VERIFY, uniform: `q_len` rows per request, offset `q_len`.
    TargetVerify {
        /// Rows per request.
        q_len: usize,
    },
    /// TARGET_VERIFY with a ragged layout: `verify_lens[i]` rows, offset per row.
    RaggedVerify,
    /// DRAFT_EXTEND_V2: `q_len` rows per request, offset 0.
    DraftExtendV2 {
        /// Rows per request.
        q_len: usize,
    },
    /// EXTEND, MIXED and every other mode: context (prefill) kernel, ragged rows.
    Extend,
}

impl AttnMode {
    /// Whether the decode kernel runs (every mode but [`AttnMode::Extend`]).
    pub fn uses_decode_kernel(self) -> bool {
        !matches!(self, Self::Extend)
    }
}

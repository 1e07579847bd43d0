//! CUDA-graph buckets (SEMANTICS.md §backend.4, SEMANTICS.md §graph-metadata.3–4).

use graph_metadata::GraphMode;

use crate::batch::AttnMode;
use crate::error::{BackendError, Result};

/// The graph forward modes (SEMANTICS.md §backend.4.2); every other mode (EXTEND,
/// MIXED, …) has no graph metadata and is refused
/// ([`BackendError::GraphUnsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphKind {
    /// DECODE / IDLE without spec_info: one row per request, offset 0.
    Decode,
    /// Draft decode step `step` (offset `step + 1`).
    DraftDecode {
        /// Draft step id.
        step: u32,
    },
    /// Uniform TARGET_VERIFY: `num_tokens / bs` rows per request (D2).
    TargetVerify,
    /// Ragged TARGET_VERIFY: metadata written eagerly before every replay
    /// (SEMANTICS.md §backend.5), `max_q_len = N` (the configured draft-token count).
    RaggedVerify,
    /// DRAFT_EXTEND_V2: `num_tokens / bs` rows per request.
    DraftExtendV2,
}

impl GraphKind {
    /// The graph kind of a resolved branch, or `None` for extend-like modes.
    pub fn of(mode: AttnMode) -> Option<Self> {
        Some(match mode {
            AttnMode::Decode => Self::Decode,
            AttnMode::DraftDecode { step } => Self::DraftDecode { step },
            AttnMode::TargetVerify { .. } => Self::TargetVerify,
            AttnMode::RaggedVerify => Self::RaggedVerify,
            AttnMode::DraftExtendV2 { .. } => Self::DraftExtendV2,
            AttnMode::Extend => return None,
        })
    }
}

/// One captured bucket: kind, rows `bs`, tokens `num_tokens` and the query
/// rows per request `q_len` (1 for decode, `num_tokens / bs` for uniform
/// verify / draft extend, `max_q_len = N` for ragged verify).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Mode.
    pub kind: GraphKind,
    /// Bucket rows.
    pub bs: usize,
    /// Bucket tokens (query rows).
    pub num_tokens: usize,
    /// Rows per request (uniform) or the ragged bound `max_q_len`.
    pub q_len: usize,
}

impl GraphKey {
    /// Builds and checks a key (`max_q_len` = the configured draft-token
    /// count, needed for ragged verify).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] for an impossible bucket shape.
    pub fn new(
        kind: GraphKind,
        bs: usize,
        num_tokens: usize,
        max_q_len: Option<usize>,
    ) -> Result<Self> {
        let bad = |d: String| BackendError::GraphUnsupported(d);
        if bs == 0 {
            return Err(bad("a bucket needs bs ≥ 1".into()));
        }
        let q_len = match kind {
            GraphKind::Decode | GraphKind::DraftDecode { .. } => {
                if num_tokens != bs {
                    return Err(bad(format!(
                        "decode buckets have one token per row: num_tokens {num_tokens} ≠ bs {bs}"
                    )));
                }
                1
            }
            GraphKind::TargetVerify | GraphKind::DraftExtendV2 => {
                if num_tokens == 0 || num_tokens % bs != 0 {
                    return Err(bad(format!(
                        "{kind:?}: num_tokens {num_tokens} is not a positive multiple of bs {bs}"
                    )));
                }
                num_tokens / bs
            }
            GraphKind::RaggedVerify => {
                let n = max_q_len.filter(|&n| n > 0).ok_or_else(|| {
                    bad("ragged verify graphs need spec.num_draft_tokens (max_q_len)".into())
                })?;
                if num_tokens > bs * n {
                    return Err(bad(format!(
                        "ragged verify bucket of {num_tokens} tokens cannot be covered by {bs} rows of at most {n}"
                    )));
                }
                n
            }
        };
        if q_len > crate::config::MAX_DECODE_Q_LEN {
            return Err(bad(format!(
                "{q_len} rows per request exceed the decode kernel's {}",
                crate::config::MAX_DECODE_Q_LEN
            )));
        }
        Ok(Self {
            kind,
            bs,
            num_tokens,
            q_len,
        })
    }

    /// The fused kernel's mode for this bucket.
    pub fn graph_mode(&self) -> GraphMode {
        let q = self.q_len as u32;
        match self.kind {
            GraphKind::Decode => GraphMode::Decode,
            GraphKind::DraftDecode { step } => GraphMode::DraftDecode { step },
            GraphKind::TargetVerify => GraphMode::TargetVerify { q_len: q },
            GraphKind::DraftExtendV2 => GraphMode::DraftExtendV2 { q_len: q },
            GraphKind::RaggedVerify => GraphMode::RaggedVerify { max_q_len: q },
        }
    }

    /// The attention branch the bucket's layers run.
    pub fn attn_mode(&self) -> AttnMode {
        match self.kind {
            GraphKind::Decode => AttnMode::Decode,
            GraphKind::DraftDecode { step } => AttnMode::DraftDecode { step },
            GraphKind::TargetVerify => AttnMode::TargetVerify { q_len: self.q_len },
            GraphKind::DraftExtendV2 => AttnMode::DraftExtendV2 { q_len: self.q_len },
            GraphKind::RaggedVerify => AttnMode::RaggedVerify,
        }
    }
}

//! The graph forward modes and what each one asks of the fused kernel
//! (SEMANTICS.md §graph-metadata.3, SEMANTICS.md §backend.4.2, DESIGN.md D2).

use kernel_rt::{KernelError, Result};

/// A forward mode that runs under CUDA graphs with the fused metadata
/// update. Each mode fixes the `seqlen_offset` added to `seq_lens` and the
/// query rows per request (the stride of `cu_seqlens_q`).
///
/// Every other forward mode (EXTEND, MIXED, …) has no graph metadata: the
/// backend reports it as an unsupported mode before reaching this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphMode {
    /// DECODE / IDLE without `spec_info` (normal decode): offset 0, one query
    /// row per request.
    Decode,
    /// DECODE / IDLE with `spec_info`: EAGLE draft step `step` (0-based),
    /// offset `step + 1`, one query row per request.
    DraftDecode {
        /// Draft step id `s` of the step backend.
        step: u32,
    },
    /// TARGET_VERIFY with a uniform layout: `q_len` tokens per request, taken
    /// from the captured shape (`num_tokens / bs`), never from the configured
    /// draft-token count (D2). Offset `q_len`: the scheduler's `seq_lens`
    /// exclude the tokens being verified.
    TargetVerify {
        /// Query rows per request, `≥ 1`.
        q_len: u32,
    },
    /// DRAFT_EXTEND_V2: `q_len` tokens per request (`num_tokens / bs` at
    /// capture). Offset 0: `seq_lens` already include the extended tokens.
    DraftExtendV2 {
        /// Query rows per request, `≥ 1`.
        q_len: u32,
    },
    /// TARGET_VERIFY with a ragged layout, written eagerly before every
    /// capture and replay (the kernel is not recorded in the graph; SEMANTICS.md §graph-metadata.3,
    /// SEMANTICS.md §backend.5): per-row query lengths `qlens` (padded to the bucket by
    /// [`crate::pad_ragged_verify_lens`]), `cache_seqlens = seq_lens + qlens`,
    /// `cu_seqlens_q = [0, cumsum(qlens)]`. Offset 0. A length outside
    /// `[0, max_q_len]` is clamped on the device and counted (SEMANTICS.md §backend.5
    /// decision).
    RaggedVerify {
        /// The attention kernel's `max_q_len` (the draft-token count `N`), `≥ 1`.
        max_q_len: u32,
    },
}

impl GraphMode {
    /// Uniform target verify for a graph captured with `num_tokens` tokens
    /// over `bs` rows: `q_len = num_tokens / bs` (D2).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] when `bs == 0`, `num_tokens` is not a
    /// positive multiple of `bs`, or `q_len` exceeds `u32`.
    pub fn target_verify(num_tokens: usize, bs: usize) -> Result<Self> {
        Ok(Self::TargetVerify {
            q_len: captured_q_len(num_tokens, bs)?,
        })
    }

    /// Draft extend v2 for a graph captured with `num_tokens` tokens over
    /// `bs` rows: `q_len = num_tokens / bs`.
    ///
    /// # Errors
    /// As [`GraphMode::target_verify`].
    pub fn draft_extend_v2(num_tokens: usize, bs: usize) -> Result<Self> {
        Ok(Self::DraftExtendV2 {
            q_len: captured_q_len(num_tokens, bs)?,
        })
    }

    /// Added to every `seq_lens[i]` to give `cache_seqlens[i]` (tokens):
    /// 0, `step + 1`, `q_len`, 0.
    pub fn seqlen_offset(self) -> i64 {
        match self {
            Self::Decode | Self::DraftExtendV2 { .. } | Self::RaggedVerify { .. } => 0,
            Self::DraftDecode { step } => i64::from(step) + 1,
            Self::TargetVerify { q_len } => i64::from(q_len),
        }
    }

    /// Query rows per request: the stride of `cu_seqlens_q` (1 for the
    /// decode modes); for ragged verify the bound `max_q_len`.
    pub fn q_stride(self) -> u32 {
        match self {
            Self::Decode | Self::DraftDecode { .. } => 1,
            Self::TargetVerify { q_len } | Self::DraftExtendV2 { q_len } => q_len,
            Self::RaggedVerify { max_q_len } => max_q_len,
        }
    }

    /// Tokens of a bucket of `bs` rows in this mode (`bs · q_stride`): the
    /// length of `out_cache_loc` / `swa_out_cache_loc` bound at capture (for
    /// ragged verify an upper bound; its bucket is the graph's token count).
    pub fn num_tokens(self, bs: usize) -> usize {
        bs.saturating_mul(self.q_stride() as usize)
    }
}

fn captured_q_len(num_tokens: usize, bs: usize) -> Result<u32> {
    if bs == 0 || num_tokens == 0 || num_tokens % bs != 0 {
        return Err(KernelError::unsupported(
            "num_tokens",
            format!("{num_tokens} tokens are not a positive multiple of bs = {bs}"),
        ));
    }
    u32::try_from(num_tokens / bs).map_err(|_| {
        KernelError::unsupported(
            "num_tokens",
            format!("q_len {} exceeds u32", num_tokens / bs),
        )
    })
}

//! One forward pass as the replay describes it: the backend's
//! [`ForwardBatch`] plus, per request, where its query rows sit.

use mha_backend::part_timing::{attention_flops, causal_pairs};
use mha_backend::{ForwardBatch, LayerConfig};

use crate::gen::ModelId;

/// The kind of a pass (a row of the report's per-mode table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PassKind {
    /// Target EXTEND: prefill chunks only (context kernel).
    Extend,
    /// Target MIXED: prefill chunks + decodes (context kernel).
    Mixed,
    /// Target DECODE (decode kernel).
    Decode,
    /// Target TARGET_VERIFY, every request `N` rows (decode kernel).
    TargetVerify,
    /// Target TARGET_VERIFY with ragged `verify_lens` (decode kernel).
    TargetVerifyRagged,
    /// Draft model EXTEND over the same prefill chunks.
    DraftExtend,
    /// Draft model multi-step draft decode (one pass per step).
    DraftDecode,
    /// Draft model DRAFT_EXTEND_V2 over the verified tokens.
    DraftExtendV2,
}

impl PassKind {
    /// Whether the backend runs this pass on the decode kernel (decode,
    /// verify, draft decode, draft extend v2), the passes decode context
    /// parallelism splits; extend, mixed and the draft's extend run the
    /// context kernel.
    pub fn decode_kernel(self) -> bool {
        matches!(
            self,
            Self::Decode
                | Self::TargetVerify
                | Self::TargetVerifyRagged
                | Self::DraftDecode
                | Self::DraftExtendV2
        )
    }

    /// Report name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Extend => "extend",
            Self::Mixed => "mixed",
            Self::Decode => "decode",
            Self::TargetVerify => "target_verify",
            Self::TargetVerifyRagged => "target_verify_ragged",
            Self::DraftExtend => "draft_extend",
            Self::DraftDecode => "draft_decode",
            Self::DraftExtendV2 => "draft_extend_v2",
        }
    }

    /// Every kind, in report order.
    pub const ALL: [Self; 8] = [
        Self::Extend,
        Self::Mixed,
        Self::Decode,
        Self::TargetVerify,
        Self::TargetVerifyRagged,
        Self::DraftExtend,
        Self::DraftDecode,
        Self::DraftExtendV2,
    ];

    /// Prefill-like (context kernel): counted in prefill FLOP/s.
    pub fn is_prefill(self) -> bool {
        matches!(self, Self::Extend | Self::Mixed | Self::DraftExtend)
    }

    /// Decode-like passes of the target model: bandwidth-bound, plotted.
    pub fn is_target_decode(self) -> bool {
        matches!(
            self,
            Self::Decode | Self::TargetVerify | Self::TargetVerifyRagged
        )
    }
}

/// One request's rows in a pass: `n` query rows at positions
/// `kv_len − n .. kv_len`, attending over `kv_len` keys (causal, window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Trace request id (activation key).
    pub req: usize,
    /// First query row of the request in the pass.
    pub row_start: usize,
    /// Query rows.
    pub n: usize,
    /// Keys the last row sees (attention length).
    pub kv_len: usize,
}

/// A pass: the batch, its rows, which model runs it and the Q salt.
#[derive(Debug, Clone)]
pub struct Pass {
    /// Report kind.
    pub kind: PassKind,
    /// Target or draft model.
    pub model: ModelId,
    /// The backend's batch.
    pub batch: ForwardBatch,
    /// Per request, in batch order.
    pub parts: Vec<Part>,
    /// Q salt (the pass's sequence number).
    pub salt: u64,
}

impl Pass {
    /// Query rows.
    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.n).sum()
    }

    /// Requests.
    pub fn batch_size(&self) -> usize {
        self.parts.len()
    }
}

/// Keys row `x` sees under `window_left`: `x − max(0, x − W) + 1`.
pub fn visible_keys(x: usize, window_left: Option<u32>) -> usize {
    match window_left {
        Some(w) => x.min(w as usize) + 1,
        None => x + 1,
    }
}

/// Work of one layer on one part: `(kv tokens read, attention FLOPs)`.
/// Tokens read = keys any row needs, `kv_len − max(0, kv_len − n − W)`;
/// FLOPs = `4 · Hq · D` per (row, visible key) (Q·Kᵀ and P·V):
/// [`mha_backend::part_timing::causal_pairs`] of the part's `n` rows over
/// its `kv_len − n` earlier keys.
pub fn part_work(p: &Part, l: &LayerConfig) -> (usize, f64) {
    let lo = match l.window_left {
        Some(w) => p.kv_len.saturating_sub(p.n + w as usize),
        None => 0,
    };
    let tokens = p.kv_len - lo;
    let first = p.kv_len.saturating_sub(p.n);
    let pairs = causal_pairs(first as u64, p.n as u64, l.window_left);
    (tokens, attention_flops(l.num_q_heads, l.head_dim, pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_counts() {
        let l = LayerConfig::new(2, 1, 64);
        let p = Part {
            req: 0,
            row_start: 0,
            n: 3,
            kv_len: 10,
        };
        // Rows at 7, 8, 9 see 8 + 9 + 10 keys.
        assert_eq!(part_work(&p, &l), (10, 4.0 * 128.0 * 27.0));
        let w = LayerConfig::new(2, 1, 64).with_window(2);
        // Rows see 3 keys each; keys 5..10 are read.
        assert_eq!(part_work(&p, &w), (5, 4.0 * 128.0 * 9.0));
        // The closed form equals the per-row count of visible keys.
        for (n, kv_len) in [(1, 1), (5, 5), (3, 200), (130, 300)] {
            let p = Part {
                req: 0,
                row_start: 0,
                n,
                kv_len,
            };
            for w in [None, Some(0), Some(2), Some(127), Some(1000)] {
                let l = LayerConfig {
                    window_left: w,
                    ..LayerConfig::new(2, 1, 64)
                };
                let rows: usize = (kv_len - n..kv_len).map(|x| visible_keys(x, w)).sum();
                assert_eq!(
                    part_work(&p, &l).1,
                    4.0 * 128.0 * rows as f64,
                    "{n} {kv_len} {w:?}"
                );
            }
        }
    }
}

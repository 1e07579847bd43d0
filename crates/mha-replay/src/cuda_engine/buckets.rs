//! Graph buckets: which passes replay a CUDA graph, and the bucket shape
//! each is captured as.

use mha_backend::GraphKind;

use crate::pass::PassKind;

/// The graph bucket of `n` rows (or tokens) under `cap`: `n` rounded up to
/// 1, 2, 4, 8, then a multiple of 8, at most `cap`; `None` when `n` is 0
/// or above `cap` (the pass runs eagerly).
pub fn bucket(n: usize, cap: usize) -> Option<usize> {
    if n == 0 || n > cap {
        return None;
    }
    let b = if n <= 8 {
        n.next_power_of_two()
    } else {
        n.div_ceil(8) * 8
    };
    Some(b.min(cap))
}

/// The graph kind of a pass, `None` for the extend-like kinds (eager).
pub fn graph_kind(kind: PassKind, step_id: u32) -> Option<GraphKind> {
    match kind {
        PassKind::Decode => Some(GraphKind::Decode),
        PassKind::DraftDecode => Some(GraphKind::DraftDecode { step: step_id }),
        PassKind::TargetVerify => Some(GraphKind::TargetVerify),
        PassKind::TargetVerifyRagged => Some(GraphKind::RaggedVerify),
        PassKind::DraftExtendV2 => Some(GraphKind::DraftExtendV2),
        PassKind::Extend | PassKind::Mixed | PassKind::DraftExtend => None,
    }
}

/// The bucket `(bs, num_tokens)` a pass of `kind` with `bs` requests and
/// `tokens` rows is captured as, given the graph state's `max_bs` requests
/// and `n` (draft tokens per request, 1 without speculation); `None` =
/// eager.
pub fn bucket_shape(
    kind: GraphKind,
    bs: usize,
    tokens: usize,
    max_bs: usize,
    n: usize,
) -> Option<(usize, usize)> {
    match kind {
        GraphKind::Decode | GraphKind::DraftDecode { .. } => {
            let b = bucket(bs, max_bs)?;
            (tokens == bs).then_some((b, b))
        }
        GraphKind::TargetVerify | GraphKind::DraftExtendV2 => {
            if bs == 0 || tokens % bs != 0 {
                return None;
            }
            let b = bucket(bs, max_bs)?;
            Some((b, b * (tokens / bs)))
        }
        GraphKind::RaggedVerify => {
            // Upstream's ragged keying (SEMANTICS.md §backend.5): bs = num_tokens.
            let t = bucket(tokens.max(bs), max_bs * n.max(1))?;
            // Large ragged buckets are correct (whole conv trace, spec 3,
            // every bucket replayed: 0 mismatches on the H200) but slower
            // than eager: the bucket pads the batch to `t` request rows,
            // and ragged verify at 239 requests took 74.2 s of device time
            // replayed vs 66.9 s eager (docs/PERF.md). Small buckets, where
            // launch overhead matters, replay.
            (t <= RAGGED_GRAPH_MAX_TOKENS).then_some((t, t))
        }
    }
}

/// Largest ragged-verify graph bucket (tokens) replayed; larger ragged
/// verify passes run eagerly: faster than a bucket padded to `t` request
/// rows (see [`bucket_shape`]).
pub const RAGGED_GRAPH_MAX_TOKENS: usize = 128;

#[cfg(test)]
mod tests {
    use mha_backend::GraphKey;

    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(bucket(0, 256), None);
        assert_eq!(bucket(3, 256), Some(4));
        assert_eq!(bucket(8, 256), Some(8));
        assert_eq!(bucket(9, 256), Some(16));
        assert_eq!(bucket(17, 256), Some(24));
        assert_eq!(bucket(250, 256), Some(256));
        assert_eq!(bucket(257, 256), None);
        assert_eq!(bucket(5, 6), Some(6));
        for cap in 1..=64 {
            for n in 1..=cap {
                let b = bucket(n, cap).unwrap();
                assert!(b >= n && b <= cap);
            }
        }
        // Decode: one token per row.
        assert_eq!(bucket_shape(GraphKind::Decode, 5, 5, 32, 1), Some((8, 8)));
        assert_eq!(bucket_shape(GraphKind::Decode, 5, 6, 32, 1), None);
        // Uniform verify of 4 tokens per request.
        assert_eq!(
            bucket_shape(GraphKind::TargetVerify, 10, 40, 32, 4),
            Some((16, 64))
        );
        // Ragged: bs = num_tokens, up to max_bs · N.
        assert_eq!(
            bucket_shape(GraphKind::RaggedVerify, 10, 33, 32, 4),
            Some((40, 40))
        );
        assert_eq!(bucket_shape(GraphKind::RaggedVerify, 33, 130, 32, 4), None);
        // Above RAGGED_GRAPH_MAX_TOKENS: eager (faster, see bucket_shape).
        assert_eq!(
            bucket_shape(GraphKind::RaggedVerify, 30, 121, 32, 4),
            Some((128, 128))
        );
        assert_eq!(
            bucket_shape(GraphKind::RaggedVerify, 200, 800, 256, 4),
            None
        );
        for k in [
            GraphKind::Decode,
            GraphKind::DraftDecode { step: 1 },
            GraphKind::TargetVerify,
            GraphKind::RaggedVerify,
            GraphKind::DraftExtendV2,
        ] {
            for bs in 1..=32usize {
                let tokens = if matches!(k, GraphKind::Decode | GraphKind::DraftDecode { .. }) {
                    bs
                } else {
                    bs * 4
                };
                let (b, t) = bucket_shape(k, bs, tokens, 32, 4).unwrap();
                assert!(b >= bs && t >= tokens, "{k:?} {bs}");
                assert!(GraphKey::new(k, b, t, Some(4)).is_ok(), "{k:?} {b} {t}");
            }
        }
        assert_eq!(graph_kind(PassKind::Extend, 0), None);
        assert_eq!(graph_kind(PassKind::Mixed, 0), None);
        assert_eq!(
            graph_kind(PassKind::DraftDecode, 2),
            Some(GraphKind::DraftDecode { step: 2 })
        );
    }
}

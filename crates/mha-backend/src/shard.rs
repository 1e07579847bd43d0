//! Tensor parallelism by heads: one rank's share of a layer.
//!
//! Under tensor parallelism over `N` ranks each rank runs attention on a
//! contiguous block of the query heads and on the KV heads those queries
//! read; the kernels and the backend run unchanged on the smaller shape
//! (attention of one head never reads another head). The rule, the one
//! serving engines use for GQA models:
//!
//! - rank `r` holds query heads `[r · Hq/N, (r + 1) · Hq/N)` (`Hq % N == 0`);
//! - `Hkv % N == 0`: KV heads `[r · Hkv/N, (r + 1) · Hkv/N)`;
//! - otherwise, when `N % Hkv == 0` (more ranks than KV heads), each KV
//!   head is replicated on `N / Hkv` ranks and rank `r` holds the one KV
//!   head `r / (N / Hkv)`, the head its query heads read.
//!
//! Concatenating the ranks' outputs head-wise, in rank order, gives the
//! unsharded output exactly: each head's arithmetic is the same.

use crate::config::LayerConfig;
use crate::error::{config_err, Result};

/// Most tensor-parallel ranks a layer can be sharded over.
pub const MAX_TP_RANKS: usize = 64;

/// One tensor-parallel rank's share of a layer's heads.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadShard {
    /// The rank's layer: `Hq / N` query heads, `Hkv / N` (or 1, replicated)
    /// KV heads, the sinks of its query heads; scales, window and head dim
    /// unchanged.
    pub layer: LayerConfig,
    /// Global index of the rank's first query head.
    pub q_head_offset: usize,
    /// Global index of the rank's first KV head.
    pub kv_head_offset: usize,
}

impl HeadShard {
    /// The whole layer as one rank (offsets 0).
    pub fn whole(layer: LayerConfig) -> Self {
        Self {
            layer,
            q_head_offset: 0,
            kv_head_offset: 0,
        }
    }
}

impl LayerConfig {
    /// Rank `rank`'s share of this layer under tensor parallelism over
    /// `ranks` ranks (the rule in the module docs).
    ///
    /// # Errors
    /// [`crate::BackendError::Config`] naming `tp_ranks` when `ranks` is 0 or
    /// above [`MAX_TP_RANKS`], `rank ≥ ranks`, `Hq % ranks ≠ 0`, or neither
    /// `Hkv % ranks == 0` nor `ranks % Hkv == 0`; sinks whose length is not
    /// `Hq`.
    pub fn shard_heads(&self, rank: usize, ranks: usize) -> Result<HeadShard> {
        if ranks == 0 || ranks > MAX_TP_RANKS {
            return Err(config_err(
                "tp_ranks",
                format!("{ranks} ranks: must be 1..={MAX_TP_RANKS}"),
            ));
        }
        if rank >= ranks {
            return Err(config_err(
                "tp_ranks",
                format!("rank {rank} of {ranks} ranks"),
            ));
        }
        let (hq, hkv) = (self.num_q_heads, self.num_kv_heads);
        if hq == 0 || hkv == 0 || hq % ranks != 0 {
            return Err(config_err(
                "tp_ranks",
                format!("{hq} query heads do not split evenly over {ranks} ranks"),
            ));
        }
        let (kv_heads, kv_head_offset) = if hkv % ranks == 0 {
            (hkv / ranks, rank * (hkv / ranks))
        } else if ranks % hkv == 0 {
            (1, rank / (ranks / hkv))
        } else {
            return Err(config_err(
                "tp_ranks",
                format!(
                    "{hkv} KV heads neither split over {ranks} ranks nor replicate onto them \
                     (one of the two counts must divide the other)"
                ),
            ));
        };
        let q = hq / ranks;
        let q_head_offset = rank * q;
        let sinks = match &self.sinks {
            None => None,
            Some(s) if s.len() == hq => Some(s[q_head_offset..q_head_offset + q].to_vec()),
            Some(s) => {
                return Err(config_err(
                    "layers",
                    format!("{} sink logits for {hq} query heads", s.len()),
                ))
            }
        };
        Ok(HeadShard {
            layer: LayerConfig {
                num_q_heads: q,
                num_kv_heads: kv_heads,
                sinks,
                ..self.clone()
            },
            q_head_offset,
            kv_head_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_cover_every_query_head_once_and_read_their_kv_head() {
        for (hq, hkv) in [(32, 8), (64, 8), (8, 1), (16, 16), (28, 4), (12, 2)] {
            for ranks in 1..=MAX_TP_RANKS {
                let l =
                    LayerConfig::new(hq, hkv, 128).with_sinks((0..hq).map(|h| h as f32).collect());
                let shards: Vec<_> = (0..ranks).map(|r| l.shard_heads(r, ranks)).collect();
                let valid = hq % ranks == 0 && (hkv % ranks == 0 || ranks % hkv == 0);
                if !valid {
                    assert!(shards.iter().all(|s| s.is_err()), "{hq}/{hkv} over {ranks}");
                    continue;
                }
                let mut next_q = 0;
                for s in shards {
                    let s = s.unwrap();
                    assert_eq!(s.q_head_offset, next_q);
                    next_q += s.layer.num_q_heads;
                    let sinks = s.layer.sinks.as_ref().unwrap();
                    assert_eq!(sinks.len(), s.layer.num_q_heads);
                    for (i, &x) in sinks.iter().enumerate() {
                        assert_eq!(x, (s.q_head_offset + i) as f32);
                    }
                    // Every query head of the rank reads a KV head the rank holds.
                    let g = hq / hkv;
                    for h in s.q_head_offset..s.q_head_offset + s.layer.num_q_heads {
                        let kv = h / g;
                        assert!(
                            (s.kv_head_offset..s.kv_head_offset + s.layer.num_kv_heads)
                                .contains(&kv),
                            "{hq}/{hkv} over {ranks}: q head {h} reads kv head {kv}"
                        );
                    }
                    // ...and locally through the same group rule.
                    let gl = s.layer.num_q_heads / s.layer.num_kv_heads;
                    for i in 0..s.layer.num_q_heads {
                        let h = s.q_head_offset + i;
                        assert_eq!(s.kv_head_offset + i / gl, h / g);
                    }
                }
                assert_eq!(next_q, hq);
            }
        }
    }

    #[test]
    fn bad_ranks_are_config_errors() {
        let l = LayerConfig::new(32, 8, 128);
        for (r, n) in [(0, 0), (2, 2), (0, MAX_TP_RANKS + 1)] {
            let e = l.shard_heads(r, n).unwrap_err();
            assert!(e.to_string().contains("tp_ranks"), "{e}");
        }
        let bad = LayerConfig::new(32, 8, 128).with_sinks(vec![0.0; 7]);
        assert!(bad.shard_heads(0, 2).is_err());
        assert_eq!(l.shard_heads(0, 1).unwrap(), HeadShard::whole(l.clone()));
    }
}

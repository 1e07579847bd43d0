//! Deterministic activations: Q/K/V from the seed by a cheap counter hash
//! (splitmix64), never from wall time. K and V of a token depend only on
//! `(model, layer, request, position)`, so a position rewritten by a later
//! pass (speculative decoding) gets the same values, and a checker can
//! regenerate any request's cache on its own. Q also depends on the pass
//! (`salt`).
//!
//! Magnitudes: elements are ≈ N(0, 1) (Irwin–Hall of four uniforms); in K,
//! about one channel in 16 per (layer, KV head) is an outlier channel with a
//! fixed offset of ±8 plus N(0, 2) noise, as seen in real models' keys.
//! A device implementation (the CUDA executor's hash kernel) must produce
//! the same bits: the whole definition is [`Generator::element`].

/// splitmix64 finaliser.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hash of a seed and a list of words.
#[inline]
pub fn hash_words(seed: u64, words: &[u64]) -> u64 {
    words.iter().fold(mix64(seed), |h, &w| mix64(h ^ w))
}

/// A uniform value in `[0, 1)` from a seed and words.
pub fn unit_hash(seed: u64, words: &[u64]) -> f64 {
    (hash_words(seed, words) >> 11) as f64 / (1u64 << 53) as f64
}

/// Element `d` of a row with hash `base`: Irwin–Hall(4) of the four 16-bit
/// fields of `mix64(base ^ d)`, scaled to unit variance (mean 0); with a
/// non-zero K `offset` (±8), `offset + 2·n`.
#[inline]
fn draw(base: u64, d: usize, offset: f32) -> f32 {
    let h = mix64(base ^ d as u64);
    let sum: u64 = (0..4).map(|i| (h >> (16 * i)) & 0xFFFF).sum();
    // Irwin–Hall(4) on [0, 4): mean 2, variance 1/3.
    let n = (sum as f32 / 65_536.0 - 2.0) * 1.732_050_8;
    if offset != 0.0 {
        offset + 2.0 * n
    } else {
        n
    }
}

/// Which activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Act {
    /// Query rows `[Hq, D]`.
    Q = 1,
    /// Key rows `[Hkv, D]`.
    K = 2,
    /// Value rows `[Hkv, D]`.
    V = 3,
}

/// Which model of a speculative pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ModelId {
    /// The target model (every layer of `--model`).
    Target,
    /// The one-layer draft model of `--spec-steps`.
    Draft,
}

/// The activation generator of a run.
#[derive(Debug, Clone, Copy)]
pub struct Generator {
    seed: u64,
}

impl Generator {
    /// The generator of `--seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The value (before rounding to bf16) of element `d` of head `head` of
    /// activation `act` for token `pos` of request `req` in `layer` of
    /// `model`; `salt` only for Q (0 for K/V). The whole definition: an
    /// Irwin–Hall(4) draw from the row hash and `d`, plus, on K's outlier
    /// channels, a fixed ±8 and a doubled draw.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the activation key's seven fields
    pub fn element(
        &self,
        act: Act,
        model: ModelId,
        layer: usize,
        req: usize,
        pos: usize,
        salt: u64,
        head: usize,
        d: usize,
    ) -> f32 {
        let base = self.row_hash(act, model, layer, req, pos, salt, head);
        let offset = if act == Act::K {
            self.k_offset(model, layer, head, d)
        } else {
            0.0
        };
        draw(base, d, offset)
    }

    /// Hash of one head of one token's row (shared by its `D` elements).
    #[allow(clippy::too_many_arguments)]
    fn row_hash(
        &self,
        act: Act,
        model: ModelId,
        layer: usize,
        req: usize,
        pos: usize,
        salt: u64,
        head: usize,
    ) -> u64 {
        hash_words(
            self.seed,
            &[
                act as u64,
                model as u64,
                layer as u64,
                req as u64,
                pos as u64,
                salt,
                head as u64,
            ],
        )
    }

    /// K's offset on channel `d` of `(model, layer, KV head)`: ±8 on an
    /// outlier channel (one in 16), 0 elsewhere.
    fn k_offset(&self, model: ModelId, layer: usize, head: usize, d: usize) -> f32 {
        let ch = hash_words(
            self.seed,
            &[0x0C, model as u64, layer as u64, head as u64, d as u64],
        );
        if ch % 16 == 0 {
            let sign: f32 = if ch & 0x100 != 0 { 1.0 } else { -1.0 };
            sign * 8.0
        } else {
            0.0
        }
    }

    /// K's outlier-channel offsets of one `(model, layer, KV head)`:
    /// `[dim]` f32, `±8` on an outlier channel, `0` elsewhere (the channel
    /// test of [`Self::element`], done once instead of once per element).
    pub fn k_offsets(&self, model: ModelId, layer: usize, head: usize, dim: usize) -> Vec<f32> {
        (0..dim)
            .map(|d| self.k_offset(model, layer, head, d))
            .collect()
    }

    /// Fills `out` (`[dim]` bf16 bits) with head `head` of one token's row:
    /// bit-identical to [`Self::element`] for `d in 0..dim`, with the row
    /// hash computed once. `k_offsets` ([`Self::k_offsets`] of the same
    /// model, layer and head) must be given for `Act::K` and is ignored for
    /// Q and V.
    #[allow(clippy::too_many_arguments)] // the activation key's seven fields
    pub fn fill_head(
        &self,
        act: Act,
        model: ModelId,
        layer: usize,
        req: usize,
        pos: usize,
        salt: u64,
        head: usize,
        k_offsets: &[f32],
        out: &mut [u16],
    ) {
        let base = self.row_hash(act, model, layer, req, pos, salt, head);
        let outliers = act == Act::K;
        for (d, o) in out.iter_mut().enumerate() {
            let offset = if outliers { k_offsets[d] } else { 0.0 };
            *o = half::bf16::from_f32(draw(base, d, offset)).to_bits();
        }
    }

    /// Fills `out` (`heads · dim` bf16 bits) with heads `first_head ..
    /// first_head + heads` of one token's row ([`Self::element`] of each of
    /// those heads and every channel); `first_head` is a tensor-parallel
    /// rank's first head, 0 for the whole row.
    #[allow(clippy::too_many_arguments)]
    pub fn fill_row(
        &self,
        act: Act,
        model: ModelId,
        layer: usize,
        req: usize,
        pos: usize,
        salt: u64,
        dim: usize,
        first_head: usize,
        out: &mut [u16],
    ) {
        for (i, row) in out.chunks_mut(dim).enumerate() {
            let head = first_head + i;
            let offsets = if act == Act::K {
                self.k_offsets(model, layer, head, dim)
            } else {
                Vec::new()
            };
            self.fill_head(act, model, layer, req, pos, salt, head, &offsets, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_head_matches_element_bit_for_bit() {
        let g = Generator::new(0x5EED);
        for act in [Act::Q, Act::K, Act::V] {
            for (layer, head, dim) in [(0, 0, 64), (3, 5, 128), (7, 1, 256)] {
                let offs = g.k_offsets(ModelId::Target, layer, head, dim);
                let mut row = vec![0u16; dim];
                g.fill_head(act, ModelId::Target, layer, 9, 77, 4, head, &offs, &mut row);
                for (d, &got) in row.iter().enumerate() {
                    let want = g.element(act, ModelId::Target, layer, 9, 77, 4, head, d);
                    assert_eq!(got, half::bf16::from_f32(want).to_bits(), "{act:?} {d}");
                }
            }
        }
    }

    #[test]
    fn deterministic_and_realistic() {
        let g = Generator::new(7);
        let mut a = vec![0u16; 8 * 128];
        let mut b = vec![0u16; 8 * 128];
        g.fill_row(Act::K, ModelId::Target, 3, 11, 100, 0, 128, 0, &mut a);
        g.fill_row(Act::K, ModelId::Target, 3, 11, 100, 0, 128, 0, &mut b);
        assert_eq!(a, b);
        g.fill_row(Act::K, ModelId::Target, 3, 11, 101, 0, 128, 0, &mut b);
        assert_ne!(a, b);
        let vals: Vec<f32> = a
            .iter()
            .map(|&x| half::bf16::from_bits(x).to_f32())
            .collect();
        let big = vals.iter().filter(|x| x.abs() > 5.0).count();
        assert!((16..=160).contains(&big), "{big} outlier elements");
        let mut q = vec![0u16; 4096];
        g.fill_row(Act::Q, ModelId::Target, 0, 0, 0, 5, 128, 0, &mut q);
        let v: Vec<f64> = q
            .iter()
            .map(|&x| half::bf16::from_bits(x).to_f64())
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "{mean} {var}");
    }
}

//! Model presets: the attention shape of each layer of one tensor-parallel rank.

use clap::ValueEnum;
use mha_backend::LayerConfig;

use crate::gen::unit_hash;

/// `--model`: attention shapes of well-known models (one TP rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum ModelPreset {
    /// Llama 3 8B: 32 layers, `Hq/Hkv/D` = 32/8/128.
    #[value(name = "llama3-8b")]
    Llama3_8b,
    /// Llama 3 70B on 8-way tensor parallelism (one rank): 80 layers, 8/1/128.
    #[value(name = "llama3-70b-tp8")]
    Llama3_70bTp8,
    /// gpt-oss-20b: 24 layers, 64/8/64, even layers sliding-window
    /// (HF window 128 = `window_left` 127), learned sinks on every layer;
    /// hybrid full + SWA KV pool.
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
    /// Qwen3 8B: 36 layers, 32/8/128.
    #[value(name = "qwen3-8b")]
    Qwen3_8b,
    /// A toy model for CPU runs: 2 layers, 4/1/64.
    #[value(name = "tiny")]
    Tiny,
}

/// A model's attention layers.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// Preset name (`--model` value).
    pub name: &'static str,
    /// One entry per layer.
    pub layers: Vec<LayerConfig>,
    /// Whether some layers have a window and keep their KV in an SWA pool.
    pub hybrid: bool,
}

impl ModelPreset {
    /// The `--model` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama3_8b => "llama3-8b",
            Self::Llama3_70bTp8 => "llama3-70b-tp8",
            Self::GptOss20b => "gpt-oss-20b",
            Self::Qwen3_8b => "qwen3-8b",
            Self::Tiny => "tiny",
        }
    }

    /// Layers of the full model.
    pub fn default_layers(self) -> usize {
        match self {
            Self::Llama3_8b => 32,
            Self::Llama3_70bTp8 => 80,
            Self::GptOss20b => 24,
            Self::Qwen3_8b => 36,
            Self::Tiny => 2,
        }
    }

    /// `(Hq, Hkv, D)`.
    pub fn heads(self) -> (usize, usize, usize) {
        match self {
            Self::Llama3_8b | Self::Qwen3_8b => (32, 8, 128),
            Self::Llama3_70bTp8 => (8, 1, 128),
            Self::GptOss20b => (64, 8, 64),
            Self::Tiny => (4, 1, 64),
        }
    }

    /// The layers (`num_layers` of them, default the model's count; the
    /// preset's layer pattern repeats). Sink logits come from `seed`
    /// (uniform in `[-1, 2)`); `fp8` sets the checkpoint K/V scales used with
    /// an e4m3 cache (powers of two, 2⁻⁴ and 2⁻⁵: K's outlier channels still
    /// fit e4m3's range of 448).
    pub fn shape(self, num_layers: Option<usize>, seed: u64, fp8: bool) -> ModelShape {
        let n = num_layers.unwrap_or(self.default_layers());
        let (hq, hkv, d) = self.heads();
        let layers = (0..n)
            .map(|i| {
                let mut l = LayerConfig::new(hq, hkv, d);
                if self == Self::GptOss20b {
                    if i % 2 == 0 {
                        l = l.with_window(127);
                    }
                    let sinks = (0..hq)
                        .map(|h| (unit_hash(seed, &[0x51, i as u64, h as u64]) * 3.0 - 1.0) as f32)
                        .collect();
                    l = l.with_sinks(sinks);
                }
                if fp8 {
                    l = l.with_scales(Some(0.0625), Some(0.03125));
                }
                l
            })
            .collect::<Vec<_>>();
        let hybrid = layers.iter().any(|l| l.window_left.is_some());
        ModelShape {
            name: self.name(),
            layers,
            hybrid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets() {
        let m = ModelPreset::GptOss20b.shape(None, 1, false);
        assert_eq!(m.layers.len(), 24);
        assert!(m.hybrid);
        assert_eq!(m.layers[0].window_left, Some(127));
        assert_eq!(m.layers[1].window_left, None);
        assert!(m
            .layers
            .iter()
            .all(|l| l.sinks.as_ref().is_some_and(|s| s.len() == 64)));
        let t = ModelPreset::Tiny.shape(None, 1, false);
        assert_eq!((t.layers.len(), t.layers[0].num_q_heads), (2, 4));
        assert!(!t.hybrid);
        assert_eq!(
            ModelPreset::Llama3_70bTp8
                .shape(Some(3), 1, true)
                .layers
                .len(),
            3
        );
    }
}

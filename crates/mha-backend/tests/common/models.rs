//! The small model configs of the CPU-executor tests (`backend.rs`,
//! `upstream_reports.rs`, `engine.rs`): P = 4, context 96, 64 pages,
//! 8 request rows.
#![allow(dead_code)]

use mha_backend::{BackendConfig, KvCacheDtype, LayerConfig, SpecConfig};

/// Speculative settings: 3 steps, `n` draft tokens, top-k 1.
pub fn spec(n: usize) -> Option<SpecConfig> {
    Some(SpecConfig {
        num_steps: 3,
        num_draft_tokens: n,
        topk: 1,
    })
}

/// 2 dense layers 4/2/64, `spec(3)`.
pub fn dense_config() -> BackendConfig {
    let mut c = BackendConfig::dense(2, LayerConfig::new(4, 2, 64), 4, 96, 64, 8);
    c.spec = spec(3);
    c
}

/// A gpt-oss-like hybrid: full, SWA (window 5, sinks), full 4/1/64; an
/// SWA pool of 40 pages.
pub fn hybrid_config() -> BackendConfig {
    let mut c = dense_config();
    c.layers = vec![
        LayerConfig::new(4, 2, 64),
        LayerConfig::new(4, 2, 64)
            .with_window(5)
            .with_sinks(vec![0.5, -1.0, 0.0, 1.5]),
        LayerConfig::new(4, 1, 64),
    ];
    c.num_swa_pages = Some(40);
    c
}

/// An e4m3 cache: layers 4/2/64 with K/V scales (0.5, 2.0) and 4/4/64
/// with (0.25, none).
pub fn fp8_config() -> BackendConfig {
    let mut c = dense_config();
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers = vec![
        LayerConfig::new(4, 2, 64).with_scales(Some(0.5), Some(2.0)),
        LayerConfig::new(4, 4, 64).with_scales(Some(0.25), None),
    ];
    c
}

//! # mha-kit-examples
//!
//! Numbered examples of mha-kit, to run in order. Each one uses the GPU when
//! one is present (`kernel_rt::gpu_status()`) and its CPU path otherwise,
//! finishes in a few seconds on the CPU, and says at its top what it shows
//! and what it prints.
//!
//! | example | what it shows | command |
//! |---|---|---|
//! | `examples/01_page_table.rs` | the page table built from `req_to_token`, `req_pool_indices` and `cache_seqlens` (with its SWA twin) | `cargo run --release -p mha-kit-examples --example 01_page_table` |
//! | `examples/02_decode.rs` | decode (one query row per request) over a small paged bf16 KV cache with GQA, the GPU kernel against the f64 CPU reference | `cargo run --release -p mha-kit-examples --example 02_decode` |
//! | `examples/03_backend_step.rs` | one `mha_backend` step: two requests, an extend (prefill) pass, then decode passes captured and replayed as a CUDA graph | `cargo run --release -p mha-kit-examples --example 03_backend_step` |
//! | `examples/04_replay.rs` | a few requests of the bundled serving trace replayed through `mha_replay`'s library API, with its report | `cargo run --release -p mha-kit-examples --example 04_replay` |
//!
//! The library itself is empty: every example is one self-contained file
//! with a `main` that prints what its `pub fn run(allow_gpu: bool)`
//! returns. `tests/run_examples.rs` includes the four files and runs each
//! one's CPU path (`run(false)`) in `cargo test`.

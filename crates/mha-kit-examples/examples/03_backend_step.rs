//! # 03 — one backend step, with CUDA graphs
//!
//! Drives `mha_backend::MhaBackend` the way a serving engine does: build
//! the backend, allocate two requests, run one extend (prefill) pass over
//! their prompts, then decode passes that each add one token per request.
//! On a GPU (the CUDA executor) the decode pass is captured once as a CUDA
//! graph and replayed every step, and a CPU-executor twin driven in lock
//! step checks every output. On the CPU executor the graph API answers
//! `GraphUnsupported` (graphs need CUDA; never a silent fallback), which the
//! example prints before running the decode passes eagerly.
//!
//! ```text
//! cargo run --release -p mha-kit-examples --example 03_backend_step
//! ```
//!
//! Prints the executor, the graph capture (or why there is none), the
//! extend pass's metadata (`cache_seqlens`, `cu_seqlens_q`, page tables),
//! each pass's output shape and checksum (with `max |cuda − cpu|` on the
//! GPU), the step count and the device error count (0).
//!
//! ## The terms
//!
//! - **pools**: the backend owns `req_to_token` (one row per request, row 0
//!   reserved), the page allocator and the per-layer paged K/V caches
//!   (slot-major NHD, `page_size` tokens a page, page 0 the dummy page). A
//!   request takes a row (`alloc_request`), then slots (`alloc_tokens`).
//! - **`ForwardBatch`**: what the scheduler hands over each pass:
//!   `req_pool_indices` (each request's `req_to_token` row), `seq_lens` (KV
//!   lengths including this pass's tokens) and `out_cache_loc` (the slots
//!   that receive this pass's new K/V).
//! - **extend** (prefill): many new tokens per request, the context kernel;
//!   **decode**: one new token per request, the decode kernel.
//! - **metadata** (`init_forward_metadata`, once per pass): `cache_seqlens`,
//!   `cu_seqlens_q` / `cu_seqlens_k` (prefix sums of query rows / KV
//!   lengths) and the page table, shared by every layer.
//! - **`forward`** (per layer): writes the layer's new K/V at
//!   `out_cache_loc`, then attention of `q [tokens, num_q_heads, head_dim]`
//!   over the cache, with `bmm1_scale = 1/√head_dim` (no FP8 K scale here).
//! - **CUDA graph**: one recorded step (the metadata launch, then every
//!   layer's K/V write and attention) over static input / output buffers, for
//!   a bucket of `bs` requests; a replay uploads the batch's inputs and
//!   launches the whole step at once.

use std::error::Error;
use std::fmt::Write as _;

use mha_backend::{
    BackendConfig, BackendError, Device, ExecutorKind, ForwardBatch, GraphKind, HalfDtype,
    LayerConfig, MhaBackend, TensorRef,
};

/// Attention layers of the toy model.
const LAYERS: usize = 2;
/// `num_q_heads`.
const HQ: usize = 8;
/// `num_kv_heads`.
const HKV: usize = 2;
/// `head_dim`.
const D: usize = 64;
/// `page_size`.
const P: usize = 16;
/// Prompt lengths of the two requests.
const PROMPTS: [usize; 2] = [40, 23];
/// Decode passes after the prefill.
const DECODE_STEPS: usize = 3;

/// A deterministic value in `[-1, 1)` for element `i` of stream `salt`
/// (splitmix64).
fn value(salt: u64, i: usize) -> f64 {
    let mut z = (i as u64)
        .wrapping_add(salt << 32)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// The `q`, `k`, `v` of one layer of one pass over `rows` tokens (bf16
/// bits): `q [rows, Hq, D]`, `k` and `v` `[rows, Hkv, D]`.
fn layer_inputs(pass: usize, layer: usize, rows: usize) -> [Vec<u16>; 3] {
    let salt = |w: u64| ((pass * LAYERS + layer) as u64) * 3 + w;
    let bits = |w: u64, n: usize| -> Vec<u16> {
        (0..n)
            .map(|i| HalfDtype::Bf16.from_f64(value(salt(w), i)))
            .collect()
    };
    [
        bits(0, rows * HQ * D),
        bits(1, rows * HKV * D),
        bits(2, rows * HKV * D),
    ]
}

/// Sum of bf16 values.
fn checksum(bits: &[u16]) -> f64 {
    bits.iter().map(|&b| HalfDtype::Bf16.to_f64(b)).sum()
}

/// Largest element-wise difference of two bf16 tensors.
fn max_diff(a: &[u16], b: &[u16]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (HalfDtype::Bf16.to_f64(x) - HalfDtype::Bf16.to_f64(y)).abs())
        .fold(0.0, f64::max)
}

/// The same pool operation on the backend and its twin (if any), which must
/// agree (both allocators are deterministic).
fn alloc_tokens(
    b: &MhaBackend,
    twin: Option<&MhaBackend>,
    grow: &[(usize, usize)],
) -> Result<Vec<i64>, Box<dyn Error>> {
    let slots = b.alloc_tokens(grow)?;
    if let Some(t) = twin {
        if t.alloc_tokens(grow)? != slots {
            return Err("the CPU twin allocated different slots".into());
        }
    }
    Ok(slots)
}

/// Runs every layer of `batch` eagerly (metadata, then K/V write +
/// attention per layer); returns each layer's output `[rows, Hq·D]`.
fn eager_pass(
    b: &mut MhaBackend,
    batch: &ForwardBatch,
    pass: usize,
) -> Result<Vec<Vec<u16>>, Box<dyn Error>> {
    b.init_forward_metadata(batch)?;
    let rows = batch.out_cache_loc.len();
    let mut outs = Vec::new();
    for layer in 0..LAYERS {
        let [q, k, v] = layer_inputs(pass, layer, rows);
        let o = b.forward(
            layer,
            TensorRef::Host(&q),
            Some(TensorRef::Host(&k)),
            Some(TensorRef::Host(&v)),
            batch,
            true,
        )?;
        outs.push(o.to_host()?);
    }
    Ok(outs)
}

/// Runs the example (the CUDA executor when `allow_gpu` and a GPU is
/// present, else the CPU executor) and returns the printed report.
///
/// # Errors
/// Backend errors (config, pools, batch, kernels, driver).
pub fn run(allow_gpu: bool) -> Result<String, Box<dyn Error>> {
    let mut out = String::new();
    // A dense toy model: 2 layers of Hq 8 / Hkv 2 / D 64, pages of 16
    // tokens, a context of 256 tokens (req_to_token width; M = 16 pages),
    // 32 allocatable pages, 4 request rows, bf16 model and cache.
    let mut config = BackendConfig::dense(LAYERS, LayerConfig::new(HQ, HKV, D), P, 256, 32, 4);
    config.max_graph_bs = 4;
    // Split-KV scratch of the CUDA executor (the default is 512 MiB).
    config.workspace_bytes = Some(16 << 20);
    // Device::Auto: the CUDA executor when a GPU is present, else the CPU one.
    let device = if allow_gpu { Device::Auto } else { Device::Cpu };
    let mut backend = MhaBackend::new(config.clone(), device)?;
    let on_gpu = matches!(backend.executor_kind(), ExecutorKind::Cuda(_));
    let mut twin = if on_gpu {
        Some(MhaBackend::new(config, Device::Cpu)?)
    } else {
        None
    };
    writeln!(
        out,
        "executor: {}{}",
        backend.executor_kind(),
        if on_gpu {
            " (a CPU-executor twin checks every output)"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "model: {LAYERS} layers, Hq {HQ} / Hkv {HKV} / D {D}, page_size {P}, M = {} pages per request, bf16",
        backend.max_num_pages()
    )?;

    // CUDA graphs: state for buckets of up to 2 requests / 2 tokens, then one
    // decode graph for the bucket bs = 2 (engines capture at start-up).
    let graphs = match backend.init_cuda_graph_state(2, 2) {
        Ok(()) => {
            let key = backend.capture_cuda_graph(GraphKind::Decode, 2, 2)?;
            writeln!(
                out,
                "CUDA graph captured: {:?} bucket, bs {}, {} tokens",
                key.kind, key.bs, key.num_tokens
            )?;
            true
        }
        Err(BackendError::GraphUnsupported(why)) => {
            writeln!(
                out,
                "CUDA graphs: not available ({why}); decode passes run eagerly"
            )?;
            false
        }
        Err(e) => return Err(e.into()),
    };

    // Two requests: a req_to_token row each, then slots for their prompts.
    let mut rows = Vec::new();
    for _ in PROMPTS {
        let r = backend.alloc_request()?;
        if let Some(t) = &twin {
            if t.alloc_request()? != r {
                return Err("the CPU twin gave a different request row".into());
            }
        }
        rows.push(r);
    }
    let rpi: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let grow: Vec<(usize, usize)> = rows.iter().copied().zip(PROMPTS).collect();
    let slots = alloc_tokens(&backend, twin.as_ref(), &grow)?;

    // Pass 0: extend (prefill) both prompts, no cached prefix.
    let batch = ForwardBatch::extend(
        rpi.clone(),
        vec![0; PROMPTS.len()],
        PROMPTS.iter().map(|&n| n as i32).collect(),
        slots,
        false,
    );
    let outs = eager_pass(&mut backend, &batch, 0)?;
    // The host build of the batch's metadata with its page tables (the
    // CUDA executor builds its own tables on the device).
    if let Ok(meta) = backend.reference_metadata(&batch) {
        writeln!(
            out,
            "extend: req_pool_indices {rpi:?}, cache_seqlens {:?}, cu_seqlens_q {:?}",
            meta.cache_seqlens, meta.cu_seqlens_q
        )?;
        for i in 0..meta.batch_size {
            writeln!(
                out,
                "  request {i}: page_table live prefix {:?}",
                meta.page_row(i, P)
            )?;
        }
    }
    let mut report = |name: &str, outs: &[Vec<u16>], want: Option<&[Vec<u16>]>| {
        let tokens = outs.first().map_or(0, |o| o.len() / (HQ * D));
        let sum: f64 = outs.iter().map(|o| checksum(o)).sum();
        let check = want.map_or(String::new(), |w| {
            let e = outs
                .iter()
                .zip(w)
                .map(|(a, b)| max_diff(a, b))
                .fold(0.0, f64::max);
            format!(", max |cuda - cpu| = {e:.3e}")
        });
        writeln!(
            out,
            "{name}: out [{tokens}, {}] x {} layers, checksum {sum:.4}{check}",
            HQ * D,
            outs.len()
        )
    };
    let want = match twin.as_mut() {
        Some(t) => Some(eager_pass(t, &batch, 0)?),
        None => None,
    };
    report("extend pass", &outs, want.as_deref())?;

    // Passes 1..=3: decode, one new token per request.
    let mut lens: Vec<i64> = PROMPTS.iter().map(|&n| n as i64).collect();
    for step in 1..=DECODE_STEPS {
        let grow: Vec<(usize, usize)> = rows.iter().map(|&r| (r, 1)).collect();
        let slots = alloc_tokens(&backend, twin.as_ref(), &grow)?;
        for l in &mut lens {
            *l += 1;
        }
        let batch = ForwardBatch::decode(rpi.clone(), lens.clone(), slots);
        let (how, outs) = if graphs {
            // Inputs go to the graph's static buffers, then one replay runs
            // the metadata and every layer; outputs land in static buffers.
            for layer in 0..LAYERS {
                let [q, k, v] = layer_inputs(step, layer, rows.len());
                backend.write_graph_inputs(
                    layer,
                    TensorRef::Host(&q),
                    TensorRef::Host(&k),
                    TensorRef::Host(&v),
                )?;
            }
            let key = backend.replay_cuda_graph(&batch)?;
            let mut outs = Vec::new();
            for layer in 0..LAYERS {
                outs.push(backend.read_graph_output(layer, rows.len())?);
            }
            (format!("graph replay (bucket bs {})", key.bs), outs)
        } else {
            ("eager".to_string(), eager_pass(&mut backend, &batch, step)?)
        };
        let want = match twin.as_mut() {
            Some(t) => Some(eager_pass(t, &batch, step)?),
            None => None,
        };
        report(
            &format!("decode step {step}/{DECODE_STEPS}: seq_lens {lens:?}, {how}"),
            &outs,
            want.as_deref(),
        )?;
    }
    let errors = backend.device_errors();
    writeln!(
        out,
        "steps: 1 extend + {DECODE_STEPS} decode; device errors: {} event(s)",
        errors.count()
    )?;
    Ok(out)
}

fn main() -> Result<(), Box<dyn Error>> {
    print!("{}", run(true)?);
    Ok(())
}

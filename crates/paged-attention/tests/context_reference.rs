//! CPU tests of the context (prefill / chunked prefill) call: the issue's
//! "Must pass" examples and edge cases 14, 15, 20–27 (SEMANTICS.md §edge-cases) on the f64 reference
//! (ragged layout), context launch geometry, params layout, PTX entry names,
//! freshness and the register/smem budgets, and the random-case generator's
//! invariants.

#![allow(clippy::needless_range_loop)]

mod common;
mod context_common;

use common::*;
use context_common::*;
use paged_attention::{
    context_block_rows, context_entry_name, context_launch_config, context_sm90_block_rows,
    context_sm90_consumers, context_sm90_duo_entry_name, context_sm90_duo_launch_config,
    context_sm90_duo_max_keys, context_sm90_duo_smem_bytes, context_sm90_duo_stages,
    context_sm90_duo_supported, context_sm90_duo_wanted, context_sm90_entry_name,
    context_sm90_grid, context_sm90_kv_splits, context_sm90_launch_config,
    context_sm90_merge_entry_name, context_sm90_persistent, context_sm90_q_buffers,
    context_sm90_smem_bytes, context_sm90_stages, context_sm90_staging_steps,
    context_sm90_supported, context_sm90_threads, context_sm90_tile_keys, context_sm90_tma_rows,
    context_smem_bytes, context_variants, kv_tma_layout, out_tma_layout, q_tma_layout,
    ContextParams, HalfDtype, KvDtype, CONTEXT_PTX, CONTEXT_SM90_DUO_ROWS,
    CONTEXT_SM90_DUO_THREADS, CONTEXT_SM90_DUO_TILE_KEYS, CONTEXT_SM90_LSE_SUFFIX,
    CONTEXT_SM90_PTX,
};
use proptest::prelude::*;

fn close(got: f64, want: f64, tol: f64) {
    assert!((got - want).abs() <= tol, "got {got}, want {want}");
}

/// Plain prefill L = 5, all new: row j = mean(0..=j).
#[test]
fn must_pass_plain_prefill() {
    let c = ctx_uniform(KvDtype::Bf16, 1, 4, 5, 5, |t| t as f64);
    let r = c.reference();
    for j in 0..5 {
        close(r.out[j], j as f64 / 2.0, 1e-12);
    }
    assert!(r.errors.is_clean());
}

/// L = 5, 2 new, W = 2 → {1,2,3} → 2.0, {2,3,4} → 3.0; W = 0 → 3.0, 4.0;
/// W = 100 → as no window (1.5, 2.0).
#[test]
fn must_pass_windows() {
    for (w, want) in [
        (Some(2), [2.0, 3.0]),
        (Some(0), [3.0, 4.0]),
        (Some(100), [1.5, 2.0]),
        (None, [1.5, 2.0]),
    ] {
        let mut c = ctx_uniform(KvDtype::Bf16, 1, 4, 5, 2, |t| t as f64);
        c.window = w;
        let r = c.reference();
        close(r.out[0], want[0], 1e-12);
        close(r.out[1], want[1], 1e-12);
    }
}

/// Chunked prefill: prefix 4 + 2 new, P 4, sink 0 → 10/6 and 15/7.
#[test]
fn must_pass_chunked_prefill_sink() {
    let mut c = ctx_uniform(KvDtype::Bf16, 1, 4, 6, 2, |t| t as f64);
    c.sinks = Some(vec![0.0]);
    let r = c.reference();
    close(r.out[0], 10.0 / 6.0, 1e-12);
    close(r.out[1], 15.0 / 7.0, 1e-12);
}

/// cache_seqlens < q_len: rows that see no key output zeros.
#[test]
fn must_pass_fewer_keys_than_rows() {
    let c = ctx_uniform(KvDtype::Bf16, 1, 4, 1, 3, |t| t as f64 + 1.0);
    let r = c.reference();
    assert_eq!(&r.out[..3], &[0.0, 0.0, 1.0]);
    assert!(r.written.iter().all(|&w| w));
}

/// Edge case 14: plain prefill, seq_lens [3, 2] (cu_q = cu_k = [0, 3, 5]).
#[test]
fn edge_14_plain_prefill_batch() {
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 2, &[3, 2], None, 5, |b, t| {
        10.0 * b as f64 + t as f64
    });
    c.cu = vec![0, 3, 5];
    c.max_q_len = 3;
    let r = c.reference();
    for (row, want) in [0.0, 0.5, 1.0, 10.0, 10.5].into_iter().enumerate() {
        close(r.out[row], want, 1e-12);
    }
}

/// Edge case 15: MIXED batch, A prefix 3 + 2 (rows at 3, 4), B prefix 7 + 1 (row at 7).
#[test]
fn edge_15_mixed_batch() {
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[5, 8], None, 3, |b, t| {
        10.0 * b as f64 + t as f64
    });
    c.cu = vec![0, 2, 3];
    c.max_q_len = 2;
    let r = c.reference();
    for (row, want) in [1.5, 2.0, 13.5].into_iter().enumerate() {
        close(r.out[row], want, 1e-12);
    }
}

/// Edge cases 20, 21, 25, 26 (SEMANTICS.md §attention.11) in the ragged layout.
#[test]
fn edge_20_to_26_worked_examples() {
    let c = to_ragged(worked_example(2, 2, Some(2), None, 1.0));
    let r = c.reference();
    close(c.at(&r.out, 0, 0, 0), 1.239970, 1e-6);
    close(c.at(&r.out, 0, 0, 1), 0.454335, 1e-6);
    close(c.at(&r.out, 1, 0, 0), 1.606178, 1e-6);
    close(c.at(&r.out, 1, 1, 0), 1.618212, 1e-6);
    let c = to_ragged(worked_example(2, 1, Some(100), None, 1.0));
    close(c.reference().out[0], 1.249626, 1e-6);
    let c = to_ragged(worked_example(2, 1, None, Some(vec![0.5, -1.0]), 1.0));
    let r = c.reference();
    close(c.at(&r.out, 0, 0, 0), 1.092908, 1e-6);
    close(c.at(&r.out, 0, 1, 1), 0.415891, 1e-6);
    let c = to_ragged(worked_example(2, 1, None, None, 2.0));
    close(c.reference().out[0], 2.499252, 1e-6);
}

/// Edge case 23: prefix 4 + 2, W = 1 → rows see {3,4} and {4,5}.
#[test]
fn edge_23_chunked_prefill_window() {
    let mut c = ctx_uniform(KvDtype::Bf16, 1, 4, 6, 2, |t| t as f64);
    c.window = Some(1);
    let r = c.reference();
    close(r.out[0], 3.5, 1e-12);
    close(r.out[1], 4.5, 1e-12);
}

#[test]
fn context_params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<ContextParams>(), 280);
    assert_eq!(offset_of!(ContextParams, errors), 64);
    assert_eq!(offset_of!(ContextParams, q_stride_tok), 72);
    assert_eq!(offset_of!(ContextParams, page_table_stride), 152);
    assert_eq!(offset_of!(ContextParams, bs), 160);
    assert_eq!(offset_of!(ContextParams, max_q_len), 192);
    assert_eq!(offset_of!(ContextParams, window_left), 200);
    assert_eq!(offset_of!(ContextParams, scale_log2), 204);
    assert_eq!(offset_of!(ContextParams, variant), 212);
    assert_eq!(offset_of!(ContextParams, tma_rows), 216);
    assert_eq!(offset_of!(ContextParams, tma_dims), 220);
    assert_eq!(offset_of!(ContextParams, work), 224);
    assert_eq!(offset_of!(ContextParams, partial), 232);
    assert_eq!(offset_of!(ContextParams, kv_splits), 240);
    assert_eq!(offset_of!(ContextParams, split_tiles), 244);
    assert_eq!(offset_of!(ContextParams, o_tma), 248);
    assert_eq!(offset_of!(ContextParams, q_tma), 252);
    assert_eq!(offset_of!(ContextParams, lse), 256);
    assert_eq!(offset_of!(ContextParams, lse_stride_tok), 264);
    assert_eq!(offset_of!(ContextParams, narrow), 272);
    assert!(CONTEXT_PTX
        .ptx
        .contains("paged_attention_context_bf16_kv_bf16_d128_param_0[280]"));
    assert!(CONTEXT_SM90_PTX
        .ptx
        .contains("paged_attention_context_sm90_merge_bf16_kv_bf16_d128_param_0[280]"));
}

#[test]
fn context_ptx_has_every_entry() {
    let v = context_variants();
    assert_eq!(v.len(), 12);
    for (q, kv, d) in v {
        let name = context_entry_name(q, kv, d);
        assert!(CONTEXT_PTX.has_entry(&name), "{name} missing from the PTX");
    }
    assert!(!context_variants().contains(&(HalfDtype::Bf16, KvDtype::F16, 128)));
}

#[test]
fn committed_context_ptx_is_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/paged_attention_context.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, CONTEXT_PTX.ptx).unwrap();
}

#[test]
fn committed_context_sm90_ptx_is_fresh_and_complete() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("kernels/paged_attention_context_sm90.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, CONTEXT_SM90_PTX.ptx).unwrap();
    assert!(CONTEXT_SM90_PTX.ptx.contains(".target sm_90a"));
    let mut n = 0;
    for (q, kv, d) in context_variants() {
        if context_sm90_supported(q, kv, d) {
            let name = context_sm90_entry_name(q, kv, d);
            assert!(CONTEXT_SM90_PTX.has_entry(&name), "{name} missing");
            assert!(CONTEXT_SM90_PTX.ptx.contains(&format!(
                "{name}_param_0[{}]",
                std::mem::size_of::<ContextParams>()
            )));
            // The K, V and out tensor maps: 128 bytes each, 64-byte aligned.
            for i in [1, 2, 3] {
                assert!(CONTEXT_SM90_PTX
                    .ptx
                    .contains(&format!(".param .align 64 .b8 {name}_param_{i}[128]")));
            }
            n += 1;
        }
    }
    // Every Q dtype with its own KV dtype and with e4m3, D 64 / 128 / 256.
    assert_eq!(n, 12);
    assert!(context_sm90_supported(HalfDtype::Bf16, KvDtype::E4m3, 128));
    assert_eq!(
        context_sm90_entry_name(HalfDtype::F16, KvDtype::E4m3, 64),
        "paged_attention_context_sm90_f16_kv_e4m3_d64"
    );
    assert!(!context_sm90_supported(HalfDtype::F16, KvDtype::Bf16, 128));
    assert!(!context_sm90_supported(HalfDtype::Bf16, KvDtype::Bf16, 96));
}

/// The embedded cubins (sm_90 for the mma.sync kernel, sm_90a for the wgmma
/// kernel) were assembled from the embedded PTX by the pinned ptxas.
#[test]
fn committed_context_cubins_are_fresh() {
    kernel_rt::ptxhash::check_cubin(&CONTEXT_PTX).unwrap();
    kernel_rt::ptxhash::check_cubin(&CONTEXT_SM90_PTX).unwrap();
    assert_eq!(
        CONTEXT_SM90_PTX.cubin.map(|c| c.arch),
        Some(kernel_rt::CubinArch::Sm90a)
    );
}

/// Split KV (sm_90a): only when the work items do not fill the SMs and are
/// long; the fewest chunks that fill about 90% of the SMs, each of at least
/// 4 tiles, at most 16, within the workspace; the chunks cover every tile
/// and none is empty. The merge entries exist for D 64 and 128.
#[test]
fn context_sm90_kv_split_rule() {
    assert_eq!(context_sm90_kv_splits(132, 1000, 132, 264), (1, 1000));
    assert_eq!(context_sm90_kv_splits(64, 4, 132, 264), (1, 4));
    assert_eq!(context_sm90_kv_splits(0, 100, 132, 264), (1, 100));
    // The TP-8 shape: 64 items (q tiles) of ~1000 KV tiles on 132 SMs.
    assert_eq!(context_sm90_kv_splits(64, 1010, 132, 264), (2, 505));
    assert_eq!(context_sm90_kv_splits(8, 1010, 132, 264).0, 15);
    for items in 1..140 {
        for tiles in [8, 9, 33, 100, 5000] {
            for cap in [0, 1, 16, 264] {
                let (s, st) = context_sm90_kv_splits(items, tiles, 132, cap);
                let what = format!("items {items} tiles {tiles} cap {cap}: ({s}, {st})");
                assert!((1..=16).contains(&s), "{what}");
                assert!(s * st >= tiles && (s - 1) * st < tiles, "{what}");
                if s > 1 {
                    assert!(items < 132 && items * s <= cap && st >= 4, "{what}");
                }
            }
        }
    }
    for q in [HalfDtype::Bf16, HalfDtype::F16] {
        for kv in [
            if q == HalfDtype::Bf16 {
                KvDtype::Bf16
            } else {
                KvDtype::F16
            },
            KvDtype::E4m3,
        ] {
            for d in [64, 128] {
                let name = context_sm90_merge_entry_name(q, kv, d);
                assert!(CONTEXT_SM90_PTX.has_entry(&name), "{name} missing");
            }
        }
    }
}

/// The sm_90a kernel runs one CTA per SM: its shared memory fits the 227 KB
/// a CTA may take, and its geometry covers every row.
#[test]
fn context_sm90_plan_fits() {
    for (d, kv) in [64, 128, 256]
        .into_iter()
        .flat_map(|d| [(d, KvDtype::Bf16), (d, KvDtype::E4m3)])
    {
        let b = context_sm90_smem_bytes(d, kv);
        assert!(b <= 227 * 1024, "D {d} {kv:?}: {b} B");
        // Three consumer warpgroups (192 rows) at D 64 with 16-bit KV, else two.
        let ncw = if d == 64 && kv == KvDtype::Bf16 { 3 } else { 2 };
        assert_eq!(context_sm90_consumers(d, kv), ncw);
        let bm = context_sm90_block_rows(d, kv);
        assert_eq!(bm, 64 * ncw);
        let bn = context_sm90_tile_keys(d);
        let (kst, vst) = context_sm90_stages(d, kv);
        assert!(kst >= 2 && vst >= 2);
        // Q buffers where the grid is persistent: three at D 128 16-bit,
        // two elsewhere, one for e4m3 at D 128 (its staging ring takes the
        // room).
        let qbuf = context_sm90_q_buffers(d, kv);
        let persistent = context_sm90_persistent(d, kv);
        let want = match (persistent, d, kv) {
            (false, _, _) => 1,
            (true, 128, KvDtype::E4m3) | (true, 256, _) => 1,
            (true, 128, _) => 3,
            _ => 2,
        };
        assert_eq!(qbuf, want);
        // The e4m3 staging ring: two steps of one 8-bit K and V tile each
        // (one at D 256), none for 16-bit KV.
        let sst = context_sm90_staging_steps(d, kv);
        assert_eq!(
            sst,
            match (kv, d) {
                (KvDtype::Bf16, _) => 0,
                (_, 256) => 1,
                _ => 2,
            }
        );
        // Q, K, V full + empty; work-item slots full + empty + geometry published.
        // e4m3: one more per Q buffer (its TMA boxes landed, before the conversion).
        // `k8`: the layout of the bf16-Q e4m3 entries at D 128 (K ring slots of
        // 8-bit tiles, V-only staging).
        let layout = |qbuf: usize, kst: usize, vst: usize, k8: bool| {
            let qr = if kv == KvDtype::E4m3 { qbuf } else { 0 };
            let bars = 8 * (2 * qbuf + 2 * kst + 2 * vst + 6 + qr);
            qbuf * bm * d * 2
                + kst * bn * d * if k8 { 1 } else { 2 }
                + vst * bn * d * 2
                + sst * if k8 { 1 } else { 2 } * bn * d
                + kst * 16
                + bars
                + 128 * ncw * 4
                + 16
                + 2 * 64
                + 16 // the output and query tensor maps' addresses
                + if kv == KvDtype::E4m3 { qbuf * bm } else { 0 }
                + 1024
        };
        // e4m3 at D 128: one launch size for the f16-Q layout and the bf16-Q
        // K8 layout (two Q buffers, four K slots of 8-bit tiles, two V slots).
        let k8 = if (d, kv) == (128, KvDtype::E4m3) {
            layout(2, 4, 2, true)
        } else {
            0
        };
        assert_eq!(b, layout(qbuf, kst, vst, false).max(k8));
        for (max_q, g) in [(1, 1), (128, 1), (129, 1), (33, 4), (5000, 16)] {
            let (tiles, cfg) = context_sm90_launch_config(3, 2, g, max_q, d, kv).unwrap();
            assert!(tiles * bm >= max_q * g);
            assert!((tiles - 1) * bm < max_q * g);
            // One CTA per (q tile, KV head, request), or at most `ctas`.
            assert_eq!(cfg.grid_dim, (tiles as u32 * 2 * 3, 1, 1));
            // The launcher's grid: persistent (at most one CTA per SM) only
            // for variants without bit 1 at the persistent head dims.
            let items = tiles as u32 * 6;
            let want = if context_sm90_persistent(d, kv) {
                items.min(132)
            } else {
                items
            };
            for variant in [0, 1] {
                assert_eq!(context_sm90_grid(items, d, kv, variant, 132), want);
            }
            assert_eq!(
                context_sm90_grid(items, d, kv, 0, 0),
                if context_sm90_persistent(d, kv) {
                    1
                } else {
                    items
                }
            );
            for variant in [2, 3] {
                assert_eq!(context_sm90_grid(items, d, kv, variant, 132), items);
            }
            assert_eq!(cfg.block_dim.0, 128 * (ncw as u32 + 1));
            assert_eq!(cfg.block_dim.0, context_sm90_threads(d, kv));
            assert_eq!(cfg.shared_mem_bytes as usize, b);
        }
    }
}

/// The PTX text of sm_90a entry `name` (up to the next entry).
fn sm90_entry_body(name: &str) -> &'static str {
    let ptx = CONTEXT_SM90_PTX.ptx;
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name}: no entry"));
    let body = &ptx[start..];
    &body[..body[1..].find(".entry ").map_or(body.len(), |e| e + 1)]
}

/// The (producer, consumer) operands of the `setmaxnreg` pair in the body
/// of entry `name`.
fn setmaxnreg_split(name: &str, body: &str) -> (usize, usize) {
    let regs = |op: &str| -> usize {
        let at = body.find(op).unwrap_or_else(|| panic!("{name}: no {op}")) + op.len();
        body[at..]
            .trim_start()
            .split(';')
            .next()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name}: {op} operand"))
    };
    (
        regs("setmaxnreg.dec.sync.aligned.u32"),
        regs("setmaxnreg.inc.sync.aligned.u32"),
    )
}

/// The launcher's plan matches the kernel's: only the persistent entries
/// take work items from the counter (`atom.global.add`), the block size is
/// each entry's `.maxntid`, and its setmaxnreg split fits the launch.
#[test]
fn context_sm90_launch_matches_the_ptx() {
    for (q, kv, d) in context_variants() {
        if !context_sm90_supported(q, kv, d) {
            continue;
        }
        let name = context_sm90_entry_name(q, kv, d);
        let body = sm90_entry_body(&name);
        let counts_work = body.contains("atom.global.add.u32");
        assert_eq!(counts_work, context_sm90_persistent(d, kv), "{name}");
        // The launcher's block size is the entry's `.maxntid`, and the
        // producer / consumer register split fits the registers the
        // launch gives the CTA.
        let threads = context_sm90_threads(d, kv) as usize;
        assert!(
            body.contains(&format!(".maxntid {threads}, 1, 1")),
            "{name}: .maxntid {threads}"
        );
        let (producer, consumer) = setmaxnreg_split(&name, body);
        let consumers = context_sm90_consumers(d, kv);
        assert_eq!(threads, 128 * (consumers + 1), "{name}");
        let per_thread = (65536 / threads) & !7;
        assert!(
            128 * producer + 128 * consumers * consumer <= threads * per_thread,
            "{name}: {producer} / {consumer} registers"
        );
    }
}

/// The two-CTA ("duo") entries: D 64 / 128 with 16-bit KV; two CTAs' shared
/// memory fits one SM (228 KB, 1 KB reserved per CTA); 64-row items; the
/// entries exist in the PTX with 256 threads, a minimum of two CTAs per SM,
/// and a producer / consumer register split that fits 128 registers a
/// thread; the launcher's rule picks them only for short KV ranges.
#[test]
fn context_sm90_duo_plan_fits() {
    for d in [64usize, 128, 256] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            let on = context_sm90_duo_supported(d, kv);
            assert_eq!(on, d != 256 && kv != KvDtype::E4m3, "D {d} {kv:?}");
            if !on {
                assert!(!context_sm90_duo_wanted(d, kv, 1));
                continue;
            }
            let b = context_sm90_duo_smem_bytes(d);
            assert!(2 * (b + 1024) <= 228 * 1024, "D {d}: {b} B");
            let (kst, vst) = context_sm90_duo_stages(d);
            let bn = CONTEXT_SM90_DUO_TILE_KEYS;
            let rows = CONTEXT_SM90_DUO_ROWS;
            assert_eq!(
                b,
                2 * rows * d * 2
                    + (kst + vst) * bn * d * 2
                    + kst * 16
                    + 8 * (4 + 2 * kst + 2 * vst + 6)
                    + 128 * 4
                    + 16
                    + 2 * 64
                    + 16
                    + 1024
            );
            let max = context_sm90_duo_max_keys(d);
            assert!(context_sm90_duo_wanted(d, kv, max));
            assert!(!context_sm90_duo_wanted(d, kv, max + 1));
            for (max_q, g) in [(1, 1), (64, 1), (65, 1), (33, 4), (5000, 16)] {
                let (tiles, cfg) = context_sm90_duo_launch_config(3, 2, g, max_q, d).unwrap();
                assert!(tiles * rows >= max_q * g);
                assert!((tiles - 1) * rows < max_q * g);
                assert_eq!(cfg.grid_dim, (tiles as u32 * 6, 1, 1));
                assert_eq!(cfg.block_dim.0, CONTEXT_SM90_DUO_THREADS);
                assert_eq!(cfg.shared_mem_bytes as usize, b);
            }
            for q in [HalfDtype::Bf16, HalfDtype::F16] {
                if kv != KvDtype::E4m3 && kv.name() != q.name() {
                    continue;
                }
                let name = context_sm90_duo_entry_name(q, kv, d);
                assert!(name.ends_with("_duo"));
                let body = sm90_entry_body(&name);
                assert!(body.contains(".maxntid 256, 1, 1"), "{name}");
                assert!(body.contains(".minnctapersm 2"), "{name}");
                assert!(body.contains("atom.global.add.u32"), "{name}: persistent");
                let (producer, consumer) = setmaxnreg_split(&name, body);
                assert!(128 * producer + 128 * consumer <= 256 * 128, "{name}");
            }
        }
    }
}

/// The row-LSE variants: every sm_90a entry but the three-consumer ones
/// (D 64, 16-bit KV) has an `…_lse` entry with the same block size, and so
/// does every duo entry; the entries without the suffix carry no LSE code
/// (no `lg2.approx`: the kernel's only logarithm is `row_lse`'s), the `_lse`
/// ones do.
#[test]
fn context_sm90_lse_entries() {
    let reads_lse = |name: &str| sm90_entry_body(name).contains("lg2.approx");
    for (q, kv, d) in context_variants() {
        if !context_sm90_supported(q, kv, d) {
            continue;
        }
        let mut names = vec![(
            context_sm90_entry_name(q, kv, d),
            context_sm90_consumers(d, kv) != 3,
        )];
        if context_sm90_duo_supported(d, kv) {
            names.push((context_sm90_duo_entry_name(q, kv, d), true));
        }
        for (name, has_lse) in names {
            let lse = format!("{name}{CONTEXT_SM90_LSE_SUFFIX}");
            assert_eq!(CONTEXT_SM90_PTX.has_entry(&lse), has_lse, "{lse}");
            assert!(!reads_lse(&name), "{name} reads p.lse");
            if has_lse {
                assert!(reads_lse(&lse), "{lse} does not read p.lse");
                let ntid = |n: &str| {
                    sm90_entry_body(n)
                        .split(".maxntid")
                        .nth(1)
                        .map(|x| x[..12].to_string())
                };
                assert_eq!(ntid(&name), ntid(&lse), "{lse}");
            }
        }
    }
}

/// TMA boxes: a page size that is a multiple of the tile or a multiple of
/// 8 dividing it; every other page size gathers rows.
#[test]
fn context_sm90_tma_rows_by_page_size() {
    for (p, d, want) in [
        (16, 128, Some(16)),
        (8, 128, Some(8)),
        (64, 256, Some(64)),
        (128, 128, Some(128)),
        (256, 128, Some(128)),
        (16384, 128, Some(128)),
        (128, 256, Some(64)),
        (1600, 256, Some(64)),
        (1600, 128, None),
        (48, 128, None),
        (1, 64, None),
        (4, 128, None),
        (24, 64, None),
    ] {
        assert_eq!(context_sm90_tma_rows(p, d), want, "P {p} D {d}");
    }
}

/// Tensor-map layouts of the two pool layouts: HND `[pages, Hkv, P, D]`
/// (token, head, page) and NHD `[pages, P, Hkv, D]` (head, token, page); one
/// KV head goes last; odd strides fall back to the gather.
#[test]
fn kv_tma_layouts() {
    let (hnd, code) = kv_tma_layout([8 * 16 * 128, 16 * 128, 128], 1000, 8, 16, 128, 16).unwrap();
    assert_eq!(hnd.dims, [128, 16, 8, 1000]);
    assert_eq!(hnd.strides_bytes[..3], [256, 4096, 32768]);
    assert_eq!(hnd.box_dims, [64, 16, 1, 1]);
    assert_eq!(code, 1 | (2 << 4) | (3 << 8));
    let (nhd, code) = kv_tma_layout([16 * 8 * 128, 128, 8 * 128], 1000, 8, 16, 128, 16).unwrap();
    assert_eq!(nhd.dims, [128, 8, 16, 1000]);
    assert_eq!(nhd.strides_bytes[..3], [256, 2048, 32768]);
    assert_eq!(nhd.box_dims, [64, 1, 16, 1]);
    assert_eq!(code, 2 | (1 << 4) | (3 << 8));
    let (one, code) = kv_tma_layout([16 * 64, 0, 64], 10, 1, 16, 64, 16).unwrap();
    assert_eq!(one.dims, [64, 16, 10, 1]);
    assert_eq!(one.box_dims, [64, 16, 1, 1]);
    assert_eq!(code, 1 | (3 << 4) | (2 << 8));
    // A contiguous request (one page of 4096 tokens): boxes of 128 tokens.
    let (big, _) = kv_tma_layout([4096 * 8 * 128, 128, 8 * 128], 8, 8, 4096, 128, 128).unwrap();
    assert_eq!(big.box_dims, [64, 1, 128, 1]);
    // A token stride that is not a multiple of 8 elements (16 bytes).
    assert!(kv_tma_layout([16 * 132 * 8, 132, 132 * 8], 10, 8, 16, 128, 16).is_none());
}

/// Tensor-map layouts of the output view `[tokens, Hq, D]` for the sm_90a
/// kernel's TMA stores: one box holds a consumer warpgroup's 64 packed rows
/// (64 / G tokens × G heads × 64 columns); a group that does not divide 64,
/// a head_dim that is not a multiple of 64 or an odd stride stores by threads.
#[test]
fn out_tma_layouts() {
    let l = out_tma_layout([32 * 128, 128], 4096, 32, 4, 128).unwrap();
    assert_eq!(l.dims, [128, 32, 4096]);
    assert_eq!(l.strides_bytes[..2], [256, 8192]);
    assert_eq!(l.box_dims, [64, 4, 16]);
    for g in [1, 2, 4, 8, 16] {
        let l = out_tma_layout([16 * 256, 256], 100, 16, g, 256).unwrap();
        assert_eq!(l.box_dims, [64, g as u32, 64 / g as u32]);
    }
    // One head: the head stride is not used.
    let one = out_tma_layout([64, 0], 10, 1, 1, 64).unwrap();
    assert_eq!(one.box_dims, [64, 1, 64]);
    assert!(out_tma_layout([24 * 128, 128], 10, 24, 3, 128).is_none());
    assert!(out_tma_layout([32 * 128, 128], 10, 32, 4, 96).is_none());
    assert!(out_tma_layout([32 * 132, 132], 10, 32, 4, 128).is_none());
    assert!(out_tma_layout([32 * 128, 128], 0, 32, 4, 128).is_none());
}

/// Tensor-map layouts of the query view for the sm_90a producer's TMA loads
/// of Q: one box holds a work item's BM packed rows (BM / G tokens × G heads
/// × 64 columns); a group that does not divide BM copies by cp.async.
#[test]
fn q_tma_layouts() {
    let l = q_tma_layout([32 * 128, 128], 4096, 32, 4, 128, 128).unwrap();
    assert_eq!(l.dims, [128, 32, 4096]);
    assert_eq!(l.strides_bytes[..2], [256, 8192]);
    assert_eq!(l.box_dims, [64, 4, 32]);
    // D 64 with three consumers: BM 192, so G 3 loads by TMA and G 16 too.
    for g in [1, 2, 3, 4, 6, 8, 12, 16] {
        let l = q_tma_layout([48 * 64, 64], 100, 48, g, 64, 192).unwrap();
        assert_eq!(l.box_dims, [64, g as u32, 192 / g as u32]);
    }
    assert!(q_tma_layout([24 * 128, 128], 10, 24, 3, 128, 128).is_none());
    assert!(q_tma_layout([40 * 64, 64], 10, 40, 5, 64, 192).is_none());
    assert!(q_tma_layout([32 * 128, 128], 10, 32, 4, 96, 128).is_none());
    assert!(q_tma_layout([32 * 128, 128], 0, 32, 4, 128, 128).is_none());
    // One head, G 1: a box of 128 tokens.
    let one = q_tma_layout([128, 0], 10, 1, 1, 128, 128).unwrap();
    assert_eq!(one.box_dims, [64, 1, 128]);
}

/// Occupancy plan: D 64 → 3 CTAs/SM, D 128 → 2, D 256 → 1 (228 KB per SM,
/// 1 KB reserved per CTA).
#[test]
fn context_smem_fits_the_sm90_budget() {
    for (d, ctas) in [(64, 3), (128, 2), (256, 1)] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            let b = context_smem_bytes(d, kv);
            assert!(ctas * (b + 1024) <= 228 * 1024, "D {d} {kv:?}: {b} B");
        }
    }
    assert_eq!(
        context_smem_bytes(128, KvDtype::Bf16),
        3 * 64 * 256 * 2 + 3 * 4 * 4
    );
    assert_eq!(context_block_rows(128), 64);
    assert_eq!(context_block_rows(256), 128);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Geometry: grid (Hkv, bs, q_tiles) covers max_q_len·G rows in tiles of BM.
    #[test]
    fn context_launch_config_properties(bs in 1usize..600, hkv in 1usize..9, g in 1usize..17,
                                        max_q in 1usize..40_000, di in 0usize..3) {
        let d = [64, 128, 256][di];
        let (tiles, cfg) = context_launch_config(bs, hkv, g, max_q, d, KvDtype::Bf16).unwrap();
        let bm = context_block_rows(d);
        prop_assert_eq!(cfg.grid_dim, (hkv as u32, bs as u32, tiles as u32));
        prop_assert!(tiles * bm >= max_q * g && (tiles - 1) * bm < max_q * g);
        prop_assert_eq!(cfg.block_dim.0 as usize, 2 * bm);
        prop_assert_eq!(cfg.shared_mem_bytes as usize, context_smem_bytes(d, KvDtype::Bf16));
    }

    /// Reference, ragged prefill with a prefix: with K = 0 the output is the
    /// mean of V over each row's visible set.
    #[test]
    fn context_uniform_weights_give_window_means(prefix in 0i32..60, n in 1usize..40,
                                                 w in prop::option::of(0u32..50), p in 1usize..9) {
        let len = prefix + n as i32;
        let mut c = ctx_uniform(KvDtype::Bf16, 1, p, len, n, |t| t as f64);
        c.window = w;
        let r = c.reference();
        for j in 0..n {
            let x = prefix as i64 + j as i64;
            let lo = w.map_or(0, |w| (x - w as i64).max(0));
            let want = (lo + x) as f64 / 2.0;
            prop_assert!((r.out[j] - want).abs() < 1e-9, "row {} got {} want {}", j, r.out[j], want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The generator only poisons keys no processed row may see.
    #[test]
    fn context_random_cases_poison_only_invisible_keys(seed in any::<u64>()) {
        let c = context_random_case(seed, 2.0e6);
        prop_assert!(visible_keys_are_finite(&c).is_ok(), "seed {seed}: {:?}", visible_keys_are_finite(&c));
        prop_assert!(c.uniform.is_none());
    }
}

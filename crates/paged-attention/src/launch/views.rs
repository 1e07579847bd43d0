//! The view checks every attention launcher shares (decode here, context in
//! `context.rs`): shapes, strides and alignment of `q`, `out`, the K/V
//! caches, the page table and `cache_seqlens`.

use kernel_rt::cudarc::driver::CudaStream;
use kernel_rt::{to_i64, KernelError, Result, Strided, StridedMut};

use crate::DECODE_HEAD_DIMS;

use super::{KvCache, MAX_GROUP};

pub(crate) fn stride_err(arg: &'static str, detail: String) -> KernelError {
    KernelError::Stride { arg, detail }
}

/// Effective stride: 0 for a size-1 dim (its stride is ignored).
pub(crate) fn eff(shape: &[usize], strides: &[usize], i: usize) -> usize {
    if shape[i] == 1 {
        0
    } else {
        strides[i]
    }
}

pub(crate) fn check_vector<T>(arg: &'static str, v: &Strided<'_, T, 1>, n: usize) -> Result<()> {
    if v.shape()[0] != n {
        return Err(KernelError::shape(
            arg,
            format!("[{n}]"),
            format!("{:?}", v.shape()),
        ));
    }
    if n > 1 && v.strides()[0] != 1 {
        return Err(stride_err(
            arg,
            format!("must be contiguous, got stride {}", v.strides()[0]),
        ));
    }
    Ok(())
}

/// Element strides of the views every attention kernel reads (a size-1
/// dim's stride is 0, see [`eff`]), each checked to fit `i64`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ViewStrides {
    /// `q [num_tokens, Hq, D]`: token, head.
    pub q: [i64; 2],
    /// `out`: token, head.
    pub out: [i64; 2],
    /// K cache `[num_pages, Hkv, P, D]`: page, head, token.
    pub k: [i64; 3],
    /// V cache: page, head, token.
    pub v: [i64; 3],
    /// Between `page_table` rows (`[bs, m]`).
    pub page_table: i64,
}

/// The [`ViewStrides`] of validated views (`bs` requests, `m` page-table
/// columns).
///
/// # Errors
/// [`KernelError::Unsupported`] when a stride exceeds `i64`.
pub(crate) fn view_strides(
    q: &Strided<'_, u16, 3>,
    out: &StridedMut<'_, u16, 3>,
    kv: &KvCache<'_>,
    page_table: &Strided<'_, i32, 2>,
    bs: usize,
    m: usize,
) -> Result<ViewStrides> {
    let (ks, kst, vs, vst) = kv.shapes();
    let (qs, qst, os, ost) = (q.shape(), q.strides(), out.shape(), out.strides());
    let e = |arg, shape: &[usize], strides: &[usize], i| to_i64(arg, eff(shape, strides, i));
    Ok(ViewStrides {
        q: [e("q", &qs, &qst, 0)?, e("q", &qs, &qst, 1)?],
        out: [e("out", &os, &ost, 0)?, e("out", &os, &ost, 1)?],
        k: [
            e("k_cache", &ks, &kst, 0)?,
            e("k_cache", &ks, &kst, 1)?,
            e("k_cache", &ks, &kst, 2)?,
        ],
        v: [
            e("v_cache", &vs, &vst, 0)?,
            e("v_cache", &vs, &vst, 1)?,
            e("v_cache", &vs, &vst, 2)?,
        ],
        page_table: e("page_table", &[bs, m], &page_table.strides(), 0)?,
    })
}

/// The checks on `sinks` (`[Hq]` f32, contiguous) and the two bmm scales
/// (finite) that every attention launch shares.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::Stride`] (`sinks`),
/// [`KernelError::Unsupported`] (a non-finite scale).
pub(crate) fn check_sinks_and_scales(
    sinks: Option<&Strided<'_, f32, 1>>,
    hq: usize,
    bmm1_scale: f32,
    bmm2_scale: f32,
) -> Result<()> {
    if let Some(s) = sinks {
        check_vector("sinks", s, hq)?;
    }
    if !bmm1_scale.is_finite() {
        return Err(KernelError::unsupported("bmm1_scale", "must be finite"));
    }
    if !bmm2_scale.is_finite() {
        return Err(KernelError::unsupported("bmm2_scale", "must be finite"));
    }
    Ok(())
}

/// Device base addresses `[q, out, k_cache, v_cache]`, each checked to be
/// 16-byte aligned (the kernels load and store 16 bytes at a time).
///
/// # Errors
/// [`KernelError::Stride`] naming the misaligned argument.
pub(crate) fn base_ptrs(
    stream: &CudaStream,
    q: &Strided<'_, u16, 3>,
    out: &mut StridedMut<'_, u16, 3>,
    kv: &KvCache<'_>,
) -> Result<[u64; 4]> {
    let (k, v) = match kv {
        KvCache::Half { k, v, .. } => (k.device_ptr(stream), v.device_ptr(stream)),
        KvCache::E4m3 { k, v } => (k.device_ptr(stream), v.device_ptr(stream)),
    };
    let ptrs = [q.device_ptr(stream), out.device_ptr_mut(stream), k, v];
    for (arg, ptr) in ["q", "out", "k_cache", "v_cache"].into_iter().zip(ptrs) {
        if ptr % 16 != 0 {
            return Err(stride_err(
                arg,
                format!("base address {ptr:#x} is not 16-byte aligned"),
            ));
        }
    }
    Ok(ptrs)
}

/// Shapes every attention launch shares, after [`validate_views`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ViewShapes {
    pub num_tokens: usize,
    pub hq: usize,
    pub dim: usize,
    pub num_pages: usize,
    pub hkv: usize,
    pub page_size: usize,
    pub group: usize,
    pub bs: usize,
    pub m: usize,
}

/// The checks the decode and the context launchers share: head dim, `out`
/// as `q`, K and V caches alike and `[num_pages ≥ 1, Hkv ≥ 1, P ≥ 1, D]`
/// with 16-byte-aligned strides (size-1 dims ignored), GQA divisibility and
/// group limit, `q`/`out` strides, a contiguous `[bs, M ≥ 1]` page table and
/// `cache_seqlens [bs]`.
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub(crate) fn validate_views(
    q: &Strided<'_, u16, 3>,
    out: &StridedMut<'_, u16, 3>,
    kv: &KvCache<'_>,
    page_table: &Strided<'_, i32, 2>,
    cache_seqlens: &Strided<'_, i32, 1>,
) -> Result<ViewShapes> {
    let [num_tokens, hq, dim] = q.shape();
    let (ks, kst, vs, vst) = kv.shapes();
    let [num_pages, hkv, page_size, kdim] = ks;
    if !DECODE_HEAD_DIMS.contains(&dim) {
        return Err(KernelError::unsupported(
            "q",
            format!("head_dim {dim} (supported: 64, 128, 256, 512)"),
        ));
    }
    if out.shape() != q.shape() {
        return Err(KernelError::shape(
            "out",
            format!("{:?} (as q)", q.shape()),
            format!("{:?}", out.shape()),
        ));
    }
    if vs != ks {
        return Err(KernelError::shape(
            "v_cache",
            format!("{ks:?} (as k_cache)"),
            format!("{vs:?}"),
        ));
    }
    if kdim != dim {
        return Err(KernelError::shape(
            "k_cache",
            format!("[num_pages, Hkv, P, D={dim}]"),
            format!("{ks:?}"),
        ));
    }
    if num_pages == 0 || hkv == 0 || page_size == 0 {
        return Err(KernelError::shape(
            "k_cache",
            "[num_pages ≥ 1, Hkv ≥ 1, P ≥ 1, D]",
            format!("{ks:?}"),
        ));
    }
    if hq == 0 || hq % hkv != 0 {
        return Err(KernelError::unsupported(
            "q",
            format!("num_q_heads {hq} is not a multiple of num_kv_heads {hkv}"),
        ));
    }
    let group = hq / hkv;
    if group > MAX_GROUP {
        return Err(KernelError::unsupported(
            "q",
            format!("group size {group} > {MAX_GROUP}"),
        ));
    }
    let es = kv.dtype().size();
    for (arg, shape, st) in [("k_cache", ks, kst), ("v_cache", vs, vst)] {
        if st[3] != 1 {
            return Err(stride_err(
                arg,
                format!("last dim must be contiguous, got strides {st:?}"),
            ));
        }
        for i in 0..3 {
            if (eff(&shape, &st, i) * es) % 16 != 0 {
                return Err(stride_err(
                    arg,
                    format!("strides {st:?} must be multiples of 16 bytes (16-byte loads)"),
                ));
            }
        }
    }
    for (arg, shape, st) in [
        ("q", q.shape(), q.strides()),
        ("out", out.shape(), out.strides()),
    ] {
        if st[2] != 1 {
            return Err(stride_err(
                arg,
                format!("last dim must be contiguous, got strides {st:?}"),
            ));
        }
        if eff(&shape, &st, 0) % 8 != 0 || eff(&shape, &st, 1) % 8 != 0 {
            return Err(stride_err(
                arg,
                format!("token/head strides {st:?} must be multiples of 8 elements"),
            ));
        }
    }
    let [bs, m] = page_table.shape();
    if m == 0 {
        return Err(KernelError::shape(
            "page_table",
            "[bs, max_num_pages ≥ 1]",
            format!("{:?}", [bs, m]),
        ));
    }
    if m > 1 && page_table.strides()[1] != 1 {
        return Err(stride_err(
            "page_table",
            "last dim must be contiguous".into(),
        ));
    }
    check_vector("cache_seqlens", cache_seqlens, bs)?;
    Ok(ViewShapes {
        num_tokens,
        hq,
        dim,
        num_pages,
        hkv,
        page_size,
        group,
        bs,
        m,
    })
}

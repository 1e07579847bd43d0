//! CPU reference: the plain definition of SEMANTICS.md §fp8-kv.2 (same
//! dtype copy) and §fp8-kv.3 (fused FP8 write), with mha-kit's rules (D7, D8) and its
//! handling of slots outside the pool (skipped, counted). The GPU kernels
//! must match it bit for bit, error word included.

use kernel_rt::ErrorReport;

use crate::codec::{bf16_bits_to_f32, f16_bits_to_f32, quantize};
use crate::{ErrorFlags, KvDtype, KvScales};

/// New K or V rows `[n, Hkv, D]` on the host (bf16/f16 bits), with strides.
#[derive(Debug, Clone, Copy)]
pub struct HostRows<'a> {
    /// Backing elements; element `(t, h, d)` is at `t·token_stride + h·head_stride + d`.
    pub data: &'a [u16],
    /// Elements between tokens.
    pub token_stride: usize,
    /// Elements between heads.
    pub head_stride: usize,
}

/// One layer's K or V cache `[S, Hkv, D]` on the host.
#[derive(Debug)]
pub struct HostCache<'a, C> {
    /// Backing elements; element `(s, h, d)` is at `s·slot_stride + h·head_stride + d`.
    pub data: &'a mut [C],
    /// `S`: valid slots are `[0, S)`.
    pub slots: usize,
    /// Elements between slots.
    pub slot_stride: usize,
    /// Elements between heads.
    pub head_stride: usize,
}

/// One layer's K or V cache as a paged view `[num_pages, Hkv, P, D]` on
/// the host (any page / head / token strides: NHD, HND, padded pages).
#[derive(Debug)]
pub struct HostPagedCache<'a, C> {
    /// Backing elements; slot `s` = page `s / P`, token `s % P`, and element
    /// `(s, h, d)` is at `(s / P)·page_stride + h·head_stride + (s % P)·token_stride + d`.
    pub data: &'a mut [C],
    /// Pages: valid slots are `[0, num_pages · P)`.
    pub num_pages: usize,
    /// `P ≥ 1`.
    pub page_size: usize,
    /// Elements between pages.
    pub page_stride: usize,
    /// Elements between heads.
    pub head_stride: usize,
    /// Elements between the tokens of a page.
    pub token_stride: usize,
}

impl<C> HostPagedCache<'_, C> {
    fn offset(&self, slot: usize, h: usize) -> usize {
        let p = self.page_size;
        (slot / p) * self.page_stride + h * self.head_stride + (slot % p) * self.token_stride
    }
}

/// Shapes and slots of one write.
#[derive(Debug, Clone, Copy)]
pub struct HostWrite<'a> {
    /// `[n]` slots.
    pub cache_loc: &'a [i64],
    /// `Hkv`.
    pub num_kv_heads: usize,
    /// `D`.
    pub head_dim: usize,
    /// New K rows.
    pub k: HostRows<'a>,
    /// New V rows.
    pub v: HostRows<'a>,
}

/// Calls `f(t, slot)` for every token with a slot inside `[0, slots)`;
/// returns the error report of the others (once per token).
fn for_each_valid(cache_loc: &[i64], slots: usize, mut f: impl FnMut(usize, usize)) -> ErrorReport {
    let mut err = ErrorReport::default();
    for (t, &loc) in cache_loc.iter().enumerate() {
        let flag = if loc < 0 {
            ErrorFlags::NEGATIVE_SLOT
        } else if loc as u64 >= slots as u64 {
            ErrorFlags::SLOT_OUTSIDE_POOL
        } else {
            f(t, loc as usize);
            continue;
        };
        err.count += 1;
        err.flags |= flag.bits();
    }
    err
}

fn write_rows<C>(
    w: &HostWrite<'_>,
    t: usize,
    rows: &HostRows<'_>,
    data: &mut [C],
    dst_of: impl Fn(usize) -> usize,
    f: impl Fn(u16) -> C,
) {
    for h in 0..w.num_kv_heads {
        let src = t * rows.token_stride + h * rows.head_stride;
        let dst = dst_of(h);
        for d in 0..w.head_dim {
            data[dst + d] = f(rows.data[src + d]);
        }
    }
}

fn linear<C>(cache: &HostCache<'_, C>, slot: usize) -> impl Fn(usize) -> usize {
    let (s, hs) = (slot * cache.slot_stride, cache.head_stride);
    move |h| s + h * hs
}

fn paged<C>(cache: &HostPagedCache<'_, C>, slot: usize) -> impl Fn(usize) -> usize {
    let base = cache.offset(slot, 0);
    let hs = cache.head_stride;
    move |h| base + h * hs
}

fn widen_of(dtype: KvDtype) -> fn(u16) -> f32 {
    match dtype {
        KvDtype::Bf16 => bf16_bits_to_f32,
        KvDtype::F16 => f16_bits_to_f32,
    }
}

/// `set_kv_buffer` into a same-dtype (bf16/f16) cache: `K[loc[t]] = k[t]`,
/// `V[loc[t]] = v[t]` bit for bit; slots outside the pool skipped. Returns
/// the error word the GPU holds afterwards (from zero).
///
/// # Panics
/// When a buffer is too small for its shape and strides (a test-setup bug).
pub fn set_kv_buffer(
    w: &HostWrite<'_>,
    k_cache: &mut HostCache<'_, u16>,
    v_cache: &mut HostCache<'_, u16>,
) -> ErrorReport {
    for_each_valid(w.cache_loc, k_cache.slots, |t, slot| {
        let (dk, dv) = (linear(k_cache, slot), linear(v_cache, slot));
        write_rows(w, t, &w.k, k_cache.data, dk, |x| x);
        write_rows(w, t, &w.v, v_cache.data, dv, |x| x);
    })
}

/// Fused FP8 write into an e4m3 cache: `K[loc[t], h, d] =
/// e4m3_satfinite(f32(k[t,h,d]) · scales.inv_k_scale())`, V likewise; slots
/// outside the pool skipped. Returns the error word the GPU holds afterwards.
///
/// # Panics
/// When a buffer is too small for its shape and strides (a test-setup bug).
pub fn fused_fp8_set_kv_buffer(
    w: &HostWrite<'_>,
    dtype: KvDtype,
    scales: &KvScales,
    k_cache: &mut HostCache<'_, u8>,
    v_cache: &mut HostCache<'_, u8>,
) -> ErrorReport {
    let widen = widen_of(dtype);
    let (inv_k, inv_v) = (scales.inv_k_scale(), scales.inv_v_scale());
    for_each_valid(w.cache_loc, k_cache.slots, |t, slot| {
        let (dk, dv) = (linear(k_cache, slot), linear(v_cache, slot));
        write_rows(w, t, &w.k, k_cache.data, dk, |x| quantize(widen(x), inv_k));
        write_rows(w, t, &w.v, v_cache.data, dv, |x| quantize(widen(x), inv_v));
    })
}

/// [`set_kv_buffer`] into paged cache views ([`HostPagedCache`]): slot `s`
/// lands at page `s / P`, token `s % P`; slots outside `[0, num_pages · P)`
/// skipped and counted. Returns the error word the GPU holds afterwards.
///
/// # Panics
/// When a buffer is too small for its shape and strides (a test-setup bug).
pub fn set_kv_buffer_paged(
    w: &HostWrite<'_>,
    k_cache: &mut HostPagedCache<'_, u16>,
    v_cache: &mut HostPagedCache<'_, u16>,
) -> ErrorReport {
    let slots = k_cache.num_pages * k_cache.page_size;
    for_each_valid(w.cache_loc, slots, |t, slot| {
        let (dk, dv) = (paged(k_cache, slot), paged(v_cache, slot));
        write_rows(w, t, &w.k, k_cache.data, dk, |x| x);
        write_rows(w, t, &w.v, v_cache.data, dv, |x| x);
    })
}

/// [`fused_fp8_set_kv_buffer`] into paged e4m3 cache views
/// ([`HostPagedCache`]). Returns the error word the GPU holds afterwards.
///
/// # Panics
/// When a buffer is too small for its shape and strides (a test-setup bug).
pub fn fused_fp8_set_kv_buffer_paged(
    w: &HostWrite<'_>,
    dtype: KvDtype,
    scales: &KvScales,
    k_cache: &mut HostPagedCache<'_, u8>,
    v_cache: &mut HostPagedCache<'_, u8>,
) -> ErrorReport {
    let widen = widen_of(dtype);
    let (inv_k, inv_v) = (scales.inv_k_scale(), scales.inv_v_scale());
    let slots = k_cache.num_pages * k_cache.page_size;
    for_each_valid(w.cache_loc, slots, |t, slot| {
        let (dk, dv) = (paged(k_cache, slot), paged(v_cache, slot));
        write_rows(w, t, &w.k, k_cache.data, dk, |x| quantize(widen(x), inv_k));
        write_rows(w, t, &w.v, v_cache.data, dv, |x| quantize(widen(x), inv_v));
    })
}

//! `set_kv_buffer`: K/V rows copied bit for bit into a 16-bit paged cache
//! (HND or NHD: the Python layer hands the cache in HND index order,
//! `[num_pages, Hkv, P, D]`, with the memory's strides), fp8-kv's paged
//! write kernel on CUDA tensors or its CPU reference on host tensors. A slot
//! outside `[0, num_pages · P)` (a negative one included) is skipped and
//! counted in the `kv_write` error word, never written through.

use fp8_kv::reference::{HostPagedCache, HostRows, HostWrite};

use crate::desc::{Dtype, Tensor};
use crate::error::ArgError;
use crate::host;
use crate::meta::{rows_3d, vector};

/// A validated 16-bit paged K/V write.
#[derive(Debug)]
pub struct SetKvCall {
    /// `[T, Hkv, D]` bf16 / f16, the cache's dtype.
    pub k: Tensor,
    /// `[T, Hkv, D]`, as `k`.
    pub v: Tensor,
    /// `[num_pages, Hkv, P, D]` (HND index order, any strides, contiguous
    /// last dim).
    pub k_cache: Tensor,
    /// As `k_cache`.
    pub v_cache: Tensor,
    /// `[T]` i64 slots (`page · P + token`).
    pub cache_loc: Tensor,
}

/// Validates `set_kv_buffer(k, v, k_cache, v_cache, cache_loc)`.
///
/// # Errors
/// [`ArgError`] naming the argument, its shape, strides and dtype.
pub fn validate_set_kv(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_loc: Tensor,
) -> Result<SetKvCall, ArgError> {
    k_cache.require_rank(
        4,
        "[num_pages, num_kv_heads, page_size, head_dim] (HND index order)",
    )?;
    k_cache.require_dtype(&[Dtype::Bf16, Dtype::F16])?;
    k_cache.require_last_contiguous()?;
    let [pages, hkv, p, d] = k_cache.dims::<4>();
    if pages == 0 || hkv == 0 || p == 0 || d == 0 {
        return Err(k_cache.err("every dim must be ≥ 1"));
    }
    if v_cache.dtype != k_cache.dtype || v_cache.shape != k_cache.shape {
        return Err(v_cache.err(format!(
            "dtype and shape must be k_cache's ({}, {:?})",
            k_cache.dtype.name(),
            k_cache.shape
        )));
    }
    v_cache.require_last_contiguous()?;
    let k = rows_3d(k, hkv, d)?;
    let v = rows_3d(v, hkv, d)?;
    for r in [&k, &v] {
        if r.dtype != k_cache.dtype {
            return Err(r.err(format!(
                "dtype must be the cache's ({}): the copy is bit for bit",
                k_cache.dtype.name()
            )));
        }
        r.require_last_contiguous()?;
    }
    let n = k.shape[0];
    k.require_shape(&[n, hkv, d], "[T, Hkv, D] (the cache's Hkv, D)")?;
    v.require_shape(&[n, hkv, d], "as k")?;
    vector(&cache_loc, Dtype::I64, n, "[T] (k's tokens)")?;
    Ok(SetKvCall {
        k,
        v,
        k_cache,
        v_cache,
        cache_loc,
    })
}

/// The CPU path (fp8-kv's reference), in place; returns the error word.
///
/// # Safety
/// Every tensor of `c` describes live host memory the Python layer holds for
/// the call; the caches are written and nothing else reads or writes them
/// meanwhile.
///
/// # Errors
/// [`ArgError`] for memory that is not host memory, null or misaligned.
pub unsafe fn set_kv_cpu(c: &SetKvCall) -> Result<(u32, u32), ArgError> {
    let [pages, hkv, p, d] = c.k_cache.dims::<4>();
    // SAFETY: the caller's contract (host tensors alive for the call).
    let (k, v, loc) = unsafe {
        (
            host::gather::<u16>(&c.k)?,
            host::gather::<u16>(&c.v)?,
            host::gather::<i64>(&c.cache_loc)?,
        )
    };
    // SAFETY: as above (the caches, gathered in [pages, Hkv, P, D] order).
    let (mut kc, mut vc) = unsafe {
        (
            host::gather::<u16>(&c.k_cache)?,
            host::gather::<u16>(&c.v_cache)?,
        )
    };
    let rows = |data| HostRows {
        data,
        token_stride: hkv * d,
        head_stride: d,
    };
    let w = HostWrite {
        cache_loc: &loc,
        num_kv_heads: hkv,
        head_dim: d,
        k: rows(&k),
        v: rows(&v),
    };
    let paged = |data| HostPagedCache {
        data,
        num_pages: pages,
        page_size: p,
        page_stride: hkv * p * d,
        head_stride: p * d,
        token_stride: d,
    };
    let err = fp8_kv::reference::set_kv_buffer_paged(&w, &mut paged(&mut kc), &mut paged(&mut vc));
    // SAFETY: the caller's contract (the caches written only here).
    unsafe {
        host::scatter(&c.k_cache, &kc)?;
        host::scatter(&c.v_cache, &vc)?;
    }
    Ok((err.count, err.flags))
}

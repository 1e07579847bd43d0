//! `merge_states`: the LSE-weighted merge of `K` partial attention states
//! (split KV, decode context parallelism after an all-gather, cascade
//! prefixes), FlashInfer's `merge_states` layout, over paged-attention's
//! merge-states kernel (CUDA) or its f64 definition (host memory,
//! [`paged_attention::merge`]).
//!
//! The Python layer converts FlashInfer's base-2 log-sum-exp to the
//! natural log the kernels use before the call and the merged one back
//! after it; here every LSE is natural-log.

use paged_attention::merge::{apply_sinks, merge_states};
use paged_attention::HalfDtype;

use crate::desc::{Dtype, Tensor};
use crate::error::ArgError;
use crate::host;

/// The merge launcher's argument names → the public ones.
pub const NAMES: &[(&str, &str)] = &[
    ("o_parts", "v"),
    ("lse_parts", "s"),
    ("out", "out"),
    ("lse_out", "lse_out"),
    ("sinks", "sinks"),
];

/// A validated merge, the part axis first (as the kernel takes it).
#[derive(Debug)]
pub struct MergeCall {
    /// `[K, T, H, D]` bf16 / f16: the caller's `v` `[T, K, H, D]` with its
    /// first two axes swapped (strides included).
    pub v: Tensor,
    /// `[K, T, H]` f32 natural-log LSE: the caller's `s` `[T, K, H]`, axes
    /// swapped.
    pub s: Tensor,
    /// `[T, H, D]`, `v`'s dtype.
    pub out: Tensor,
    /// `[T, H]` f32, or not written.
    pub lse_out: Option<Tensor>,
    /// `[H]` f32 sink logits (natural log), joined once after the merge.
    pub sinks: Option<Tensor>,
    /// Dtype of `v` and `out`.
    pub dtype: HalfDtype,
}

/// `t` with axes 0 and 1 swapped.
fn swap01(mut t: Tensor) -> Tensor {
    t.shape.swap(0, 1);
    t.strides.swap(0, 1);
    t
}

/// Validates `merge_states(v, s, out, lse_out, sinks)`: `v` `[T, K, H, D]`
/// bf16 / f16 (any strides, contiguous last dim, `K ≥ 1`, `D` even), `s`
/// `[T, K, H]` f32 (contiguous last dim), `out` `[T, H, D]` of `v`'s dtype,
/// `lse_out` `[T, H]` f32, `sinks` `[H]` f32 contiguous.
///
/// # Errors
/// [`ArgError`] naming the argument, its shape, strides and dtype.
pub fn validate_merge(
    v: Tensor,
    s: Tensor,
    out: Tensor,
    lse_out: Option<Tensor>,
    sinks: Option<Tensor>,
) -> Result<MergeCall, ArgError> {
    v.require_rank(4, "[seq_len, num_states, num_heads, head_dim]")?;
    let dtype = match v.dtype {
        Dtype::Bf16 => HalfDtype::Bf16,
        Dtype::F16 => HalfDtype::F16,
        _ => return Err(v.err("dtype must be bfloat16 or float16")),
    };
    let [t, k, h, d] = v.dims::<4>();
    if k == 0 {
        return Err(v.err("num_states (dim 1) must be ≥ 1"));
    }
    if d % 2 != 0 {
        return Err(v.err("head_dim must be even"));
    }
    v.require_last_contiguous()?;
    s.require_dtype(&[Dtype::F32])?;
    s.require_shape(&[t, k, h], "[seq_len, num_states, num_heads] (v's)")?;
    s.require_last_contiguous()?;
    if out.dtype != v.dtype {
        return Err(out.err(format!("dtype must be v's ({})", v.dtype.name())));
    }
    out.require_shape(&[t, h, d], "[seq_len, num_heads, head_dim] (v's)")?;
    out.require_last_contiguous()?;
    if let Some(l) = &lse_out {
        l.require_dtype(&[Dtype::F32])?;
        l.require_shape(&[t, h], "[seq_len, num_heads] (v's)")?;
        l.require_last_contiguous()?;
    }
    if let Some(x) = &sinks {
        x.require_dtype(&[Dtype::F32])?;
        x.require_shape(&[h], "[num_heads] (v's)")?;
        x.require_contiguous()?;
    }
    Ok(MergeCall {
        v: swap01(v),
        s: swap01(s),
        out,
        lse_out,
        sinks,
        dtype,
    })
}

/// The CPU path: the f64 merge ([`merge_states`]) and sinks
/// ([`apply_sinks`]), the output rounded to its dtype, in place.
///
/// # Safety
/// Every tensor of `c` describes live host memory the Python layer holds for
/// the call; `out` and `lse_out` are written and nothing else reads or
/// writes them meanwhile.
///
/// # Errors
/// [`ArgError`] for memory that is not host memory, null or misaligned.
pub unsafe fn merge_cpu(c: &MergeCall) -> Result<(), ArgError> {
    let [k, t, h, d] = c.v.dims::<4>();
    // SAFETY: the caller's contract (host tensors alive for the call).
    let v = unsafe { host::gather::<u16>(&c.v)? };
    // SAFETY: as above.
    let s = unsafe { host::gather::<f32>(&c.s)? };
    let (n_o, n_l) = (t * h * d, t * h);
    let parts_o: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            v[i * n_o..(i + 1) * n_o]
                .iter()
                .map(|&b| c.dtype.to_f64(b))
                .collect()
        })
        .collect();
    let parts_l: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            s[i * n_l..(i + 1) * n_l]
                .iter()
                .map(|&x| f64::from(x))
                .collect()
        })
        .collect();
    let parts: Vec<(&[f64], &[f64])> = parts_o
        .iter()
        .zip(&parts_l)
        .map(|(o, l)| (o.as_slice(), l.as_slice()))
        .collect();
    let (mut o, mut lse) = merge_states(&parts, d);
    if let Some(x) = &c.sinks {
        // SAFETY: as above.
        let sinks = unsafe { host::gather::<f32>(x)? };
        if h > 0 {
            apply_sinks(&mut o, &mut lse, &sinks, d);
        }
    }
    let bits: Vec<u16> = o.iter().map(|&x| c.dtype.from_f64(x)).collect();
    // SAFETY: the caller's contract (outputs written only here).
    unsafe { host::scatter(&c.out, &bits)? };
    if let Some(l) = &c.lse_out {
        let l32: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
        // SAFETY: as above.
        unsafe { host::scatter(l, &l32)? };
    }
    Ok(())
}

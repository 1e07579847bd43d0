//! The K/V scale rules, in one place (SEMANTICS.md §fp8-kv.5, DESIGN.md D8).
//!
//! One [`KvScales`] per layer, resolved once at setup and then used both by
//! the fused FP8 write (its f32 reciprocals) and by attention
//! ([`KvScales::bmm_scales`]). A float scale and a one-element device tensor
//! mean the same thing; the tensor is read once, at resolution.

use kernel_rt::cudarc::driver::CudaView;
use kernel_rt::{Gpu, KernelError, Result};

/// dtype of a layer's KV cache (SEMANTICS.md §fp8-kv.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// bf16 cache (stored as `u16` bits); checkpoint scales are ignored.
    Bf16,
    /// f16 cache (stored as `u16` bits); checkpoint scales are ignored.
    F16,
    /// `float8_e4m3fn` cache (stored as bytes); scales apply.
    Fp8E4m3,
}

/// A checkpoint K or V scale as a layer provides it.
#[derive(Debug)]
pub enum ScaleInput<'a> {
    /// No scale.
    Missing,
    /// A host scalar (Python float); converted to f32 (round to nearest).
    Float(f64),
    /// A device tensor of ≥ 1 f32 element; its first element is the scale,
    /// read once (a synchronising copy) by [`KvScales::resolve`].
    Tensor(CudaView<'a, f32>),
}

/// The rule for one scale (SEMANTICS.md §fp8-kv.5 `scalar_scale` step 4, D8): a missing,
/// non-positive or NaN scale is 1.0. mha-kit also maps `+∞` to 1.0 (the spec
/// is silent): its reciprocal 0 would silently write an all-zero cache.
pub fn resolve_scale(value: Option<f32>) -> f32 {
    match value {
        Some(s) if s > 0.0 && s.is_finite() => s,
        _ => 1.0,
    }
}

/// One layer's resolved `(k_scale, v_scale)` f32 pair and its cache dtype.
///
/// Built only through [`KvScales::from_values`] / [`KvScales::resolve`] /
/// [`KvScales::unit`], so both scales always obey [`resolve_scale`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    cache_dtype: KvCacheDtype,
    k_scale: f32,
    v_scale: f32,
}

impl KvScales {
    /// Scales 1.0 for a cache of `cache_dtype`.
    pub fn unit(cache_dtype: KvCacheDtype) -> Self {
        Self {
            cache_dtype,
            k_scale: 1.0,
            v_scale: 1.0,
        }
    }

    /// Resolves host values (D8): for an e4m3 cache each of `k`, `v` goes
    /// through [`resolve_scale`] on its own (one missing does not disable the
    /// other, edge case 31); other caches get 1.0 whatever the inputs (edge
    /// case 32).
    pub fn from_values(cache_dtype: KvCacheDtype, k: Option<f32>, v: Option<f32>) -> Self {
        match cache_dtype {
            KvCacheDtype::Fp8E4m3 => Self {
                cache_dtype,
                k_scale: resolve_scale(k),
                v_scale: resolve_scale(v),
            },
            _ => Self::unit(cache_dtype),
        }
    }

    /// Resolves a layer's scales once, at setup. A [`ScaleInput::Tensor`] is
    /// read here (one synchronising device→host copy of its first element)
    /// and only for an e4m3 cache; a [`ScaleInput::Float`] is rounded to f32
    /// before the `> 0` test.
    ///
    /// # Errors
    /// [`KernelError::Shape`] for an empty tensor; [`KernelError::Driver`]
    /// when the copy fails.
    pub fn resolve(
        gpu: &Gpu,
        cache_dtype: KvCacheDtype,
        k: &ScaleInput<'_>,
        v: &ScaleInput<'_>,
    ) -> Result<Self> {
        if cache_dtype != KvCacheDtype::Fp8E4m3 {
            return Ok(Self::unit(cache_dtype));
        }
        let read = |arg: &'static str, s: &ScaleInput<'_>| -> Result<Option<f32>> {
            Ok(match s {
                ScaleInput::Missing => None,
                ScaleInput::Float(x) => Some(*x as f32),
                ScaleInput::Tensor(t) => {
                    if t.is_empty() {
                        return Err(KernelError::shape(arg, "[≥ 1] f32", "[0]"));
                    }
                    let first = gpu.stream().clone_dtoh(&t.slice(0..1))?;
                    Some(first[0])
                }
            })
        };
        Ok(Self::from_values(
            cache_dtype,
            read("k_scale", k)?,
            read("v_scale", v)?,
        ))
    }

    /// The cache dtype these scales were resolved for.
    pub fn cache_dtype(&self) -> KvCacheDtype {
        self.cache_dtype
    }

    /// Resolved K scale (1.0 unless the cache is e4m3).
    pub fn k_scale(&self) -> f32 {
        self.k_scale
    }

    /// Resolved V scale (1.0 unless the cache is e4m3).
    pub fn v_scale(&self) -> f32 {
        self.v_scale
    }

    /// `f32(1 / k_scale)`, the multiplier of the fused write (D7).
    pub fn inv_k_scale(&self) -> f32 {
        1.0 / self.k_scale
    }

    /// `f32(1 / v_scale)`, the multiplier of the fused write (D7).
    pub fn inv_v_scale(&self) -> f32 {
        1.0 / self.v_scale
    }

    /// `(bmm1_scale, bmm2_scale)` for attention (SEMANTICS.md §fp8-kv.5 `bmm_scales`):
    /// e4m3 cache → `((q_scale · k_scale) · sm_scale, v_scale)` in f32;
    /// other caches → `(sm_scale, 1.0)`. `sm_scale` is the layer's softmax
    /// scale (normally `1/sqrt(D)`); mha-kit passes `q_scale = 1.0` (D4).
    pub fn bmm_scales(&self, q_scale: f32, sm_scale: f32) -> (f32, f32) {
        match self.cache_dtype {
            KvCacheDtype::Fp8E4m3 => (q_scale * self.k_scale * sm_scale, self.v_scale),
            _ => (sm_scale, 1.0),
        }
    }
}

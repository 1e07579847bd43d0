//! K/V writes into the executor's own caches (fp8-kv's write kernels).

use fp8_kv::{KvWriteArgs, KvWriteKernel};
use kernel_rt::cudarc::driver::CudaView;
use kernel_rt::{DeviceErrors, Strided, StridedMut};
use paged_attention::HalfDtype;

use crate::error::Result;
use crate::executor::LayerPlan;

use super::mirrors::DevCache;

/// K/V write of `n` tokens at `loc` into the layer's cache.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_write(
    kernel: &KvWriteKernel,
    plan: &LayerPlan,
    cache: &mut DevCache,
    model_dtype: HalfDtype,
    page_size: usize,
    loc: CudaView<'_, i64>,
    k: CudaView<'_, u16>,
    v: CudaView<'_, u16>,
    n: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (hkv, d, slots) = (plan.num_kv_heads, plan.head_dim, plan.slots);
    let k = Strided::contiguous("k", k.slice(0..n * hkv * d), [n, hkv, d])?;
    let v = Strided::contiguous("v", v.slice(0..n * hkv * d), [n, hkv, d])?;
    let cache_loc = Strided::contiguous("cache_loc", loc.slice(0..n), [n])?;
    let len = slots * hkv * d;
    match cache {
        DevCache::Half(kc, vc) => {
            let mut args = KvWriteArgs {
                k,
                v,
                cache_loc,
                k_cache: StridedMut::contiguous("k_cache", kc.slice_mut(0..len), [slots, hkv, d])?,
                v_cache: StridedMut::contiguous("v_cache", vc.slice_mut(0..len), [slots, hkv, d])?,
                page_size,
            };
            kernel.set_kv_buffer(&mut args, errors)?;
        }
        DevCache::Fp8(kc, vc) => {
            let mut args = KvWriteArgs {
                k,
                v,
                cache_loc,
                k_cache: StridedMut::contiguous("k_cache", kc.slice_mut(0..len), [slots, hkv, d])?,
                v_cache: StridedMut::contiguous("v_cache", vc.slice_mut(0..len), [slots, hkv, d])?,
                page_size,
            };
            let dtype = match model_dtype {
                HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                HalfDtype::F16 => fp8_kv::KvDtype::F16,
            };
            kernel.fused_fp8_set_kv_buffer(&mut args, dtype, &plan.scales, errors)?;
        }
    }
    Ok(())
}

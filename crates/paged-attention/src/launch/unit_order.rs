//! The batch's length order written once
//! ([`PagedAttentionKernel::write_unit_order`], the `paged_attention_unit_order`
//! entry) for `DecodeArgs::unit_order`.

use kernel_rt::cudarc::driver::{CudaStream, LaunchConfig};
use kernel_rt::{to_i32, KernelError, Result, Strided, StridedMut};

use super::views::stride_err;
use super::PagedAttentionKernel;

/// The entry writing a batch's length order.
pub(super) const ENTRY: &str = "paged_attention_unit_order";
/// Its threads (one CTA; `pa::UO_NT` in the .cu, one a length bucket).
const THREADS: u32 = 256;

/// The checks of a `[bs]` i32 view that holds or receives a length order
/// (`arg`, its length and stride) or the lengths it is written from:
/// `bs` elements, contiguous.
///
/// # Errors
/// [`KernelError::Shape`] for another length, [`KernelError::Stride`] for a
/// stride other than 1 (where `bs > 1`).
pub(super) fn check_order_view(
    arg: &'static str,
    len: usize,
    stride: usize,
    bs: usize,
) -> Result<()> {
    if len != bs {
        return Err(KernelError::shape(
            arg,
            format!("[{bs}] (cache_seqlens' length)"),
            format!("[{len}]"),
        ));
    }
    if bs > 1 && stride != 1 {
        return Err(stride_err(
            arg,
            format!("stride {stride}, must be contiguous"),
        ));
    }
    Ok(())
}

impl PagedAttentionKernel {
    /// Writes the batch's length order into `order`: its `bs` requests in
    /// descending order of `⌈cache_seqlens / 128⌉` (capped at 255; a length
    /// ≤ 0 counts as 0), ties by index, the order in which an ordered decode
    /// launch of one split serves them ([`PagedAttentionKernel::set_length_order`]).
    /// Pass it as [`DecodeArgs::unit_order`](super::DecodeArgs::unit_order) to every launch over the same
    /// lengths (e.g. each layer of a decode step): their CTAs then read
    /// their request instead of each ranking the batch. One launch of one
    /// CTA on `stream` (a few µs; asynchronous, graph-capturable); `bs = 0`
    /// launches nothing.
    ///
    /// `cache_seqlens`: `[bs]` i32, contiguous. `order`: `[bs]` i32,
    /// contiguous, written in full.
    ///
    /// # Errors
    /// [`KernelError::Shape`] when the two lengths differ, [`KernelError::Stride`]
    /// when either is not contiguous, [`KernelError::Unsupported`] for `bs`
    /// past `i32` or a stream of another context; [`KernelError::Driver`].
    pub fn write_unit_order(
        &self,
        stream: &CudaStream,
        cache_seqlens: &Strided<'_, i32, 1>,
        order: &mut StridedMut<'_, i32, 1>,
    ) -> Result<()> {
        let bs = cache_seqlens.shape()[0];
        check_order_view("cache_seqlens", bs, cache_seqlens.strides()[0], bs)?;
        check_order_view("unit_order", order.shape()[0], order.strides()[0], bs)?;
        if bs == 0 {
            return Ok(());
        }
        let n = to_i32("bs", bs)?;
        let lens = cache_seqlens.device_ptr(stream);
        let out = order.device_ptr_mut(stream);
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the entry takes (const i32* cache_seqlens, int bs, i32*
        // order); both buffers hold `bs` contiguous i32 (checked above) and
        // the kernel writes only positions below `bs`. Launched without PDL.
        unsafe {
            self.kernel
                .launch_with(stream, self.unit_order, config, &[&lens, &n, &out], false)
        }
    }
}

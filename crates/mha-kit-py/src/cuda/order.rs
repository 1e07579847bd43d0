//! The batch's length order for the decode call's `unit_order`
//! (`write_decode_unit_order`, the backend's once-a-pass rule) on the GPU.

use paged_attention::PagedAttentionKernel;

use super::{check_device, device, Buf};
use crate::desc::Tensor;
use crate::error::{from_kernel, CallResult};

/// `write_decode_unit_order` on the GPU: the decode launcher's
/// [`PagedAttentionKernel::write_unit_order`] from `seq_lens` into `order`
/// (both validated `[bs]` i32, contiguous) on stream `handle`.
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn write_unit_order(
    seq_lens: &Tensor,
    order: &Tensor,
    ordinal: usize,
    handle: u64,
) -> CallResult<()> {
    let ts = [seq_lens, order];
    check_device(&ts, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.decode, PagedAttentionKernel::new)?;
    let sl = Buf::<i32>::new(seq_lens, &stream)?;
    let mut o = Buf::<i32>::new(order, &stream)?;
    kernel
        .write_unit_order(&stream, &sl.view(seq_lens)?, &mut o.view_mut(order)?)
        .map_err(|e| from_kernel(e, crate::attn::NAMES, &ts))
}

/// Whether a decode launch on device `ordinal` over `bs` requests and
/// `work_items` work items can read a given unit order
/// ([`PagedAttentionKernel::may_read_unit_order`], the decode launcher's
/// settings; loads it on first use, on stream `handle`).
///
/// # Errors
/// [`CallError::Device`] when the module does not load or the first use
/// falls in a graph capture.
pub fn may_read_unit_order(
    ordinal: usize,
    handle: u64,
    bs: usize,
    work_items: usize,
) -> CallResult<bool> {
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.decode, PagedAttentionKernel::new)?;
    Ok(kernel.may_read_unit_order(bs, work_items))
}

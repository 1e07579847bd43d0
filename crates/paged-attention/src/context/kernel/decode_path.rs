//! The context call at head dim 512: the decode kernel's ragged path
//! ([`context_decode_path`], [`ContextKernel::launch`]).

use kernel_rt::cudarc::driver::CudaStream;
use kernel_rt::{DeviceErrors, KernelError, Result, StridedMut};

use super::{ContextArgs, ContextKernel};
use crate::context::CONTEXT_MAX_Q_LEN;
use crate::launch::check_vector;
use crate::{DecodeArgs, HalfDtype, KvDtype, QueryLayout, SplitMode};

/// Whether a context call runs the decode kernel's ragged path instead of a
/// context kernel ([`ContextKernel::launch`]): head dim 512 (a decode head
/// dim, [`crate::DECODE_HEAD_DIMS`], that no context entry serves), K/V e4m3
/// or of the Q dtype.
pub fn context_decode_path(q: HalfDtype, kv: KvDtype, head_dim: usize) -> bool {
    kv.goes_with(q) && head_dim == 512
}

/// The split chunk of the head-dim-512 context path: every row tile's keys
/// in one CTA (`SplitMode::Chunked` with one split; below the `2^30` cap).
const CONTEXT_DECODE_PATH_CHUNK: usize = (1 << 30) - 1;

/// The context-only row arguments of a call of `bs` requests: the shape of
/// `cu_seqlens_k` (not read) and `max_q_len` in `1..=CONTEXT_MAX_Q_LEN`.
pub(crate) fn check_context_rows(args: &ContextArgs<'_>, bs: usize) -> Result<()> {
    if let Some(k) = &args.cu_seqlens_k {
        check_vector("cu_seqlens_k", k, bs + 1)?;
    }
    if !(1..=CONTEXT_MAX_Q_LEN).contains(&args.max_q_len) {
        return Err(KernelError::unsupported(
            "max_q_len",
            format!("{} (supported 1..=2^24)", args.max_q_len),
        ));
    }
    Ok(())
}

impl ContextKernel {
    /// At most `n` row tiles a launch on the head-dim-512 path
    /// ([`crate::PagedAttentionKernel::set_launch_row_tiles`]; tests of its
    /// multi-launch form on small cases). `None` (default): as many as one
    /// grid holds.
    pub fn set_decode_path_row_tiles(&mut self, n: Option<usize>) {
        self.wide.set_launch_row_tiles(n);
    }

    /// The context call at a head dim no context entry serves (512,
    /// [`context_decode_path`]): the decode kernel's ragged path over the
    /// same arguments (one split a row tile; the CUDA-core kernel, or the
    /// tensor-core entries where the launcher's
    /// [`crate::PagedAttentionKernel::set_wide_mma`] is on, from
    /// [`crate::DECODE_WIDE_MMA_ENV`]), each CTA 16 packed rows of one
    /// request and KV head against every key they see.
    /// Same semantics as the context kernels (causal over prefix and new
    /// tokens, window, sinks, LSE, the ragged rule, bad device data skipped
    /// and counted with the same [`crate::ErrorFlags`]); correct, not fast
    /// (each row tile reads its keys again).
    pub(super) fn launch_decode_path(
        &self,
        stream: &CudaStream,
        args: &mut ContextArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        check_context_rows(args, args.cache_seqlens.shape()[0])?;
        let mut dargs = DecodeArgs {
            q: args.q.clone(),
            q_dtype: args.q_dtype,
            out: args.out.reborrow(),
            kv: args.kv.clone(),
            page_table: args.page_table.clone(),
            cache_seqlens: args.cache_seqlens.clone(),
            layout: QueryLayout::Ragged {
                cu_seqlens_q: args.cu_seqlens_q.clone(),
                max_q_len: args.max_q_len,
            },
            // Sizes splits only: there is one (below).
            max_seq_len: 1,
            bmm1_scale: args.bmm1_scale,
            bmm2_scale: args.bmm2_scale,
            window_left: args.window_left,
            sinks: args.sinks.clone(),
            interleave: None,
            skip_softmax: None,
            skipped_slices: None,
            split: SplitMode::Chunked {
                chunk_tokens: CONTEXT_DECODE_PATH_CHUNK,
                max_splits: 1,
            },
            lse: args.lse.as_mut().map(StridedMut::reborrow),
            workspace: None,
            unit_order: None,
        };
        self.wide.launch_rows_on(stream, &mut dargs, errors, true)
    }
}

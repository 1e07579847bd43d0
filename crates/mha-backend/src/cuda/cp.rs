//! Decode context parallelism (issue 17; `BackendConfig::decode_cp_ranks`),
//! simulated on one GPU or, with a communicator attached
//! (`MhaBackend::attach_decode_comm`), over NCCL: every decode-kernel launch of a pass
//! (decode, verify, draft decode / extend, the decode rows of a mixed pass)
//! runs once per rank `r < N` over the rank's pages by page interleave
//! (`paged_attention::DecodeArgs::interleave`: global page table and
//! lengths, keys indexed locally, causal limits and windows in global
//! positions, no sinks) into a per-rank partial output and row LSE; the
//! merge-states kernel then combines the `N` states into the layer's output
//! and joins the sinks once. Simulated, the ranks share one buffer; over
//! NCCL each GPU launches only its own rank's share into a send buffer and
//! an all-gather fills the same rank-major buffer on every rank before the
//! merge (every rank then holds the merged output). The CPU executor's
//! definition is `paged_attention::cp::simulate`.
//!
//! Buffers: `[N, rows, Hq, D]` 16-bit partial outputs and `[N, rows, Hq]`
//! f32 LSE. Eager passes grow theirs on demand; each graph state holds its
//! own, sized for its largest bucket when it is created (a captured graph
//! keeps the addresses it recorded, so they are never reallocated).
//!
//! Rows of requests the kernel skips (bad `cu_seqlens_q`, counted in the
//! error word) hold whatever the buffers held: their merged output is
//! unspecified, where the unsplit launch leaves them untouched.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{CudaSlice, CudaStream, CudaViewMut};
use kernel_rt::{Gpu, Strided, StridedMut};
use paged_attention::nccl::DcpComm;
use paged_attention::reference::Interleave;
use paged_attention::{MergeStatesArgs, MergeStatesKernel};

use crate::error::Result;
use crate::executor::LayerPlan;

use super::attention::{
    decode_args, launch_decode, AttnCx, DecodeViews, KvSrc, Part, Rows, Tables,
};
use super::mirrors::{ensure, zeros};

/// The merge launcher and one set of rank buffers (eager or a graph
/// state's), owned by the executor; with a communicator
/// ([`CudaExecutor::attach_decode_comm`](super::CudaExecutor)) also the
/// send buffers of this rank's own partial state.
#[derive(Debug)]
pub(super) struct DecodeCp {
    ranks: usize,
    merge: Arc<MergeStatesKernel>,
    /// `[N, rows, Hq, D]` every rank's partial output (rank-major).
    parts: CudaSlice<u16>,
    /// `[N, rows, Hq]` every rank's row LSE.
    lse: CudaSlice<f32>,
    /// Multi-GPU ranks: this rank's membership and its `[rows, Hq, D]` /
    /// `[rows, Hq]` send buffers (`None`: the ranks are simulated here).
    comm: Option<CommBufs>,
}

/// A rank's communicator and send buffers.
#[derive(Debug)]
struct CommBufs {
    comm: Arc<DcpComm>,
    send_o: CudaSlice<u16>,
    send_lse: CudaSlice<f32>,
}

impl DecodeCp {
    /// `ranks ≥ 2` simulated ranks on `gpu` (the merge kernel loaded), with
    /// buffers for `rows` rows of `hq` heads of `d` dims.
    ///
    /// # Errors
    /// Module load or allocation failures.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        ranks: usize,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<Self> {
        let merge = Arc::new(MergeStatesKernel::new(gpu)?);
        Self::with_merge(gpu.stream(), merge, ranks, rows, hq, d)
    }

    /// As [`DecodeCp::new`], sharing `merge`.
    ///
    /// # Errors
    /// Allocation failures.
    pub(super) fn with_merge(
        stream: &Arc<CudaStream>,
        merge: Arc<MergeStatesKernel>,
        ranks: usize,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<Self> {
        Ok(Self {
            ranks,
            merge,
            parts: zeros(stream, ranks * rows * hq * d)?,
            lse: zeros(stream, ranks * rows * hq)?,
            comm: None,
        })
    }

    /// This rank of `comm`'s group on `gpu` (the merge kernel loaded), with
    /// buffers for `rows` rows of `hq` heads of `d` dims: decode passes
    /// launch only this rank's share and all-gather the states over NCCL.
    ///
    /// # Errors
    /// Module load or allocation failures.
    pub(super) fn with_comm(
        gpu: &Arc<Gpu>,
        comm: Arc<DcpComm>,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<Self> {
        let merge = Arc::new(MergeStatesKernel::new(gpu)?);
        let mut cp = Self::with_merge(gpu.stream(), merge, comm.ranks(), rows, hq, d)?;
        cp.comm = Some(CommBufs {
            comm,
            send_o: zeros(gpu.stream(), rows * hq * d)?,
            send_lse: zeros(gpu.stream(), rows * hq)?,
        });
        Ok(cp)
    }

    /// A second set of buffers (a graph state's) for `rows` rows of `hq`
    /// heads of `d` dims, sharing this one's merge launcher and
    /// communicator.
    ///
    /// # Errors
    /// Allocation failures.
    pub(super) fn sibling(
        &self,
        stream: &Arc<CudaStream>,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<Self> {
        let mut cp = Self::with_merge(stream, self.merge.clone(), self.ranks, rows, hq, d)?;
        if let Some(c) = &self.comm {
            cp.comm = Some(CommBufs {
                comm: c.comm.clone(),
                send_o: zeros(stream, rows * hq * d)?,
                send_lse: zeros(stream, rows * hq)?,
            });
        }
        Ok(cp)
    }

    /// Ranks (simulated, or of the communicator's group).
    pub(super) fn ranks(&self) -> usize {
        self.ranks
    }

    /// Whether the ranks are other GPUs reached over NCCL.
    pub(super) fn multi_gpu(&self) -> bool {
        self.comm.is_some()
    }

    /// `Err` once the communicator was aborted ([`DcpComm::abort`]: a peer
    /// rank failed): a graph that captured its collectives must then not
    /// be replayed.
    ///
    /// # Errors
    /// [`crate::BackendError::Kernel`] naming the abort's reason.
    pub(super) fn live(&self) -> Result<()> {
        match &self.comm {
            Some(c) => Ok(c.comm.ensure_live()?),
            None => Ok(()),
        }
    }

    /// Grows the buffers to hold `rows` rows of `hq` heads of `d` dims
    /// (eager passes only: never while a graph holds them).
    ///
    /// # Errors
    /// Allocation failures.
    pub(super) fn reserve(
        &mut self,
        stream: &Arc<CudaStream>,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<()> {
        ensure(stream, &mut self.parts, self.ranks * rows * hq * d)?;
        ensure(stream, &mut self.lse, self.ranks * rows * hq)?;
        if let Some(c) = &mut self.comm {
            ensure(stream, &mut c.send_o, rows * hq * d)?;
            ensure(stream, &mut c.send_lse, rows * hq)?;
        }
        Ok(())
    }

    /// The launch-time view: ranks, merge launcher, buffers.
    pub(super) fn cx(&mut self) -> CpCx<'_> {
        CpCx {
            ranks: self.ranks,
            merge: &self.merge,
            parts: self.parts.as_view_mut(),
            lse: self.lse.as_view_mut(),
            comm: self.comm.as_mut().map(|c| CommCx {
                comm: &c.comm,
                send_o: c.send_o.as_view_mut(),
                send_lse: c.send_lse.as_view_mut(),
            }),
        }
    }
}

/// What an attention call needs of [`DecodeCp`].
pub(super) struct CpCx<'a> {
    ranks: usize,
    merge: &'a MergeStatesKernel,
    parts: CudaViewMut<'a, u16>,
    lse: CudaViewMut<'a, f32>,
    comm: Option<CommCx<'a>>,
}

/// What an attention call needs of [`CommBufs`].
struct CommCx<'a> {
    comm: &'a DcpComm,
    send_o: CudaViewMut<'a, u16>,
    send_lse: CudaViewMut<'a, f32>,
}

/// The inputs of one decode part that every rank reads.
pub(super) struct RankInputs<'a, 'q> {
    pub(super) plan: &'a LayerPlan,
    pub(super) cache: KvSrc<'a>,
    pub(super) sinks: Option<Strided<'a, f32, 1>>,
    pub(super) b: &'a Tables<'a>,
    pub(super) part: Part,
    pub(super) max_q: usize,
    pub(super) q: &'q Rows<kernel_rt::cudarc::driver::CudaView<'q, u16>>,
}

/// Runs `r.part` as `cp.ranks` interleaved rank launches into the rank
/// buffers (over NCCL: this rank's launch, then the all-gather), then
/// merges them into `out` with the sinks (module docs).
///
/// # Errors
/// [`crate::BackendError::Kernel`] when the buffers are short (a graph
/// bucket past its state's size), a launch is refused or fails, the
/// launch stream is not the communicator's or an all-gather fails.
pub(super) fn attend_ranks(
    cx: &mut AttnCx<'_>,
    cp: &mut CpCx<'_>,
    stream: &Arc<CudaStream>,
    r: RankInputs<'_, '_>,
    out: StridedMut<'_, u16, 3>,
) -> Result<()> {
    let Part {
        req0,
        bs,
        row0,
        rows,
        ..
    } = r.part;
    let (hq, d) = (r.plan.num_q_heads, r.plan.head_dim);
    let (n_out, n_lse) = (rows * hq * d, rows * hq);
    let ranks = cp.ranks;
    let short = |arg, needed: usize, available: usize| -> Result<()> {
        if available < needed {
            return Err(kernel_rt::KernelError::Capacity {
                arg,
                needed,
                available,
            }
            .into());
        }
        Ok(())
    };
    short("decode_cp outputs", ranks * n_out, cp.parts.len())?;
    short("decode_cp LSE", ranks * n_lse, cp.lse.len())?;
    // Simulated: every rank's launch into its slot of the rank buffers.
    // Over NCCL: this rank's launch into its send buffers, then the
    // all-gather fills the rank buffers (rank-major, the same layout).
    let own = cp.comm.as_ref().map(|c| c.comm.rank());
    if let Some(c) = &cp.comm {
        if !Arc::ptr_eq(c.comm.gpu().stream(), stream) {
            return Err(kernel_rt::KernelError::unsupported(
                "stream",
                "a context-parallel decode runs on its communicator's stream (the GPU's own)",
            )
            .into());
        }
        short("decode_cp send outputs", n_out, c.send_o.len())?;
        short("decode_cp send LSE", n_lse, c.send_lse.len())?;
    }
    for rank in (0..ranks).filter(|&r| own.is_none_or(|o| o == r)) {
        let (o_dst, lse_dst) = match &mut cp.comm {
            Some(c) => (c.send_o.slice_mut(0..n_out), c.send_lse.slice_mut(0..n_lse)),
            None => (
                cp.parts.slice_mut(rank * n_out..(rank + 1) * n_out),
                cp.lse.slice_mut(rank * n_lse..(rank + 1) * n_lse),
            ),
        };
        let mut args = decode_args(
            DecodeViews {
                q: r.q.part(row0, rows, hq, d)?,
                out: StridedMut::contiguous("out", o_dst, [rows, hq, d])?,
                kv: r.cache.views(r.plan, cx.page_size, cx.model_dtype)?,
                page_table: r.b.page_table(r.plan, req0, bs)?,
                cache_seqlens: r.b.cache_seqlens(req0, bs)?,
                sinks: None,
            },
            cx,
            r.plan,
            r.b,
            r.part,
            r.max_q,
        )?;
        args.interleave = Some(Interleave {
            rank,
            ranks,
            block: cx.page_size,
        });
        args.lse = Some(StridedMut::contiguous("lse", lse_dst, [rows, hq])?);
        launch_decode(cx, stream, args, None)?;
    }
    if let Some(c) = &cp.comm {
        c.comm.all_gather_states(
            &c.send_o.slice(0..n_out),
            &mut cp.parts.slice_mut(0..ranks * n_out),
            &c.send_lse.slice(0..n_lse),
            &mut cp.lse.slice_mut(0..ranks * n_lse),
        )?;
    }
    let mut merge = MergeStatesArgs {
        o_parts: Strided::contiguous(
            "o_parts",
            cp.parts.slice(0..ranks * n_out),
            [ranks, rows, hq, d],
        )?,
        lse_parts: Strided::contiguous(
            "lse_parts",
            cp.lse.slice(0..ranks * n_lse),
            [ranks, rows, hq],
        )?,
        dtype: cx.model_dtype,
        out,
        lse_out: None,
        sinks: r.sinks,
    };
    cp.merge.launch_on(stream, &mut merge)?;
    Ok(())
}

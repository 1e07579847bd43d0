//! Attention: the launch context (`AttnCx`), a pass's shape and tables,
//! the K/V and query / output views, and the decode or context launch of
//! each part of a pass (`run_attention`, `attend_part`).

use std::sync::Arc;

use kernel_rt::cudarc::driver::sys::CUevent_flags;
use kernel_rt::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut};
use kernel_rt::{DeviceErrors, KernelError, Strided, StridedMut};
use paged_attention::{
    chunk_full_launch, ContextArgs, ContextKernel, DecodeArgs, HalfDtype, KvCache,
    PagedAttentionKernel, QueryLayout, SplitMode,
};

use crate::batch::AttnMode;
use crate::config::MixedOverlap;
use crate::error::Result;
use crate::executor::LayerPlan;
use crate::part_timing::{AttnPart, PartTimer};

use super::kerr;
use super::metadata::MetaBufs;
use super::mirrors::DevCache;

/// The launchers and state every attention call needs.
pub(super) struct AttnCx<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) decode: &'a PagedAttentionKernel,
    pub(super) context: &'a ContextKernel,
    pub(super) workspace: CudaViewMut<'a, f32>,
    /// Workspace range `[start, end)` known to hold zero split counters.
    pub(super) ws_zero: &'a mut Option<(usize, usize)>,
    pub(super) errors: &'a mut DeviceErrors,
    pub(super) model_dtype: HalfDtype,
    pub(super) page_size: usize,
    /// `max_seq_len` of every decode launch: the context length, so eager
    /// and graph launches of one shape split identically.
    pub(super) max_seq_len: usize,
    /// Split of decode launches that fill the GPU (Auto's choice is 1).
    pub(super) decode_split: SplitMode,
    /// Records spans around the launches when installed (eager passes
    /// only: `None` while a graph is captured).
    pub(super) timer: Option<&'a mut PartTimer>,
    /// `q_scale` of `bmm1 = q_scale · k_scale · sm_scale` (1 on the owning path).
    pub(super) q_scale: f32,
    /// The workspace is an engine's: zero the split counters before every
    /// split launch (nothing is known about their state).
    pub(super) foreign_workspace: bool,
    /// Runs a mixed pass's decode launch beside its context launch
    /// ([`MixedOverlap`]); `None`: one after the other on `stream`.
    pub(super) side: Option<&'a SideStream>,
    /// Decode context parallelism simulated on this GPU
    /// ([`super::cp`]); `None`: one decode launch a part.
    pub(super) cp: Option<super::cp::CpCx<'a>>,
    /// Skip-softmax factor of decode launches (`DecodeArgs::skip_softmax`).
    pub(super) skip_softmax: Option<f32>,
    /// The pass's length order for its ordered decode launches
    /// ([`UnitOrder`]); `None`: every CTA of such a launch ranks the batch.
    pub(super) unit_order: Option<&'a mut UnitOrder>,
}

/// A pass's length order (`paged_attention::DecodeArgs::unit_order`): the
/// first decode launch of the pass that reads it (an ordered launch of one
/// split: [`PagedAttentionKernel::set_length_order`], its default from
/// `2·SMs` work items) writes it from its `cache_seqlens`
/// ([`PagedAttentionKernel::write_unit_order`], one small launch on its
/// stream) and the pass's other layers read it, so their CTAs skip the
/// ranking (~2 µs each; FP8 conv-like batches 4–6% faster, docs/PERF.md
/// session 49). Valid for one pass: [`UnitOrder::reset`] whenever the
/// pass's lengths are written again (eager metadata, a graph's capture).
#[derive(Debug)]
pub(super) struct UnitOrder {
    buf: CudaSlice<i32>,
    /// `(req0, bs)`: the requests of the tables the order was written for.
    written: Option<(usize, usize)>,
}

impl UnitOrder {
    /// Room for `cap` requests.
    pub(super) fn new(stream: &Arc<CudaStream>, cap: usize) -> Result<Self> {
        Ok(Self {
            buf: stream.alloc_zeros::<i32>(cap.max(1)).map_err(kerr)?,
            written: None,
        })
    }

    /// Requests it has room for.
    pub(super) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Forgets the order (the lengths change).
    pub(super) fn reset(&mut self) {
        self.written = None;
    }
}

/// The executor's second stream for mixed passes, with the two events that
/// fork it from and join it back to the pass's stream (reused every layer:
/// each is waited on right after it is recorded).
#[derive(Debug)]
pub(super) struct SideStream {
    stream: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    order: MixedOverlap,
}

impl SideStream {
    /// A side stream on `main`'s context for `order`; `None` for
    /// [`MixedOverlap::Off`].
    pub(super) fn new(main: &Arc<CudaStream>, order: MixedOverlap) -> Result<Option<Self>> {
        if order == MixedOverlap::Off {
            return Ok(None);
        }
        let ctx = main.context();
        let flags = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        Ok(Some(Self {
            stream: ctx.new_stream().map_err(kerr)?,
            fork: ctx.new_event(flags).map_err(kerr)?,
            join: ctx.new_event(flags).map_err(kerr)?,
            order,
        }))
    }

    /// Which launch is enqueued first.
    pub(super) fn order(&self) -> MixedOverlap {
        self.order
    }

    /// Changes which launch is enqueued first (`Off` is no side stream at
    /// all: the executor drops it).
    pub(super) fn set_order(&mut self, order: MixedOverlap) {
        self.order = order;
    }
}

impl AttnCx<'_> {
    /// The start event of a span about to be launched: `from` (the end of
    /// the span just before, nothing enqueued since) or a new event; `None`
    /// without a timer.
    fn span_start(&mut self, from: Option<usize>, stream: &CudaStream) -> Result<Option<usize>> {
        match (self.timer.as_deref_mut(), from) {
            (None, _) => Ok(None),
            (Some(_), Some(i)) => Ok(Some(i)),
            (Some(t), None) => t.mark(stream).map(Some),
        }
    }

    /// Ends the span of `part` begun at `start` on `stream`; returns its
    /// end event.
    fn span_end(
        &mut self,
        part: AttnPart,
        start: Option<usize>,
        stream: &CudaStream,
    ) -> Result<Option<usize>> {
        match (self.timer.as_deref_mut(), start) {
            (Some(t), Some(a)) => t.close(part, a, stream).map(Some),
            _ => Ok(None),
        }
    }
}

/// One pass's geometry for attention.
#[derive(Debug, Clone, Copy)]
pub(super) struct PassShape {
    pub(super) mode: AttnMode,
    pub(super) bs: usize,
    pub(super) rows: usize,
    pub(super) max_q: usize,
    /// Extend / mixed only: how many requests at the end of the batch have
    /// one new token (the decode rows of a mixed batch). They go to the
    /// decode kernel, which reads each KV byte once for all G heads of a KV
    /// head; the context kernel gets the requests before them.
    pub(super) decode_tail: usize,
    /// Host-side bound on the pass's KV lengths when the host has them
    /// (eager passes): the context kernel's schedule hint
    /// (`ContextArgs::max_kv_len`); `None` on graph and engine passes.
    pub(super) max_kv: Option<usize>,
}

impl PassShape {
    /// Requests at the end of the batch that an extend / mixed pass sends
    /// to the decode kernel (0 in every other mode).
    pub(super) fn tail(&self) -> usize {
        if self.mode == AttnMode::Extend {
            self.decode_tail.min(self.bs).min(self.rows)
        } else {
            0
        }
    }
}

/// The metadata tensors attention reads: the page tables, `cache_seqlens`,
/// `cu_seqlens_k`, `cu_seqlens_q` (`[bs, M]`, `[bs]`, `[bs + 1]` ×2).
pub(super) struct Tables<'a> {
    pt: CudaView<'a, i32>,
    swa_pt: Option<CudaView<'a, i32>>,
    cache: CudaView<'a, i32>,
    cu_k: CudaView<'a, i32>,
    cu_q: CudaView<'a, i32>,
    m: usize,
}

impl<'a> Tables<'a> {
    /// The tables of `b`; `cu_q` replaces `b`'s `cu_seqlens_q` (an engine's own).
    pub(super) fn of(b: &'a MetaBufs, cu_q: Option<CudaView<'a, i32>>) -> Self {
        Self {
            pt: b.pt.slice(0..b.pt.len()),
            swa_pt: b.swa_pt.as_ref().map(|t| t.slice(0..t.len())),
            cache: b.cache.slice(0..b.cache.len()),
            cu_k: b.cu_k.slice(0..b.cu_k.len()),
            cu_q: cu_q.unwrap_or_else(|| b.cu_q.slice(0..b.cu_q.len())),
            m: b.m,
        }
    }

    /// Requests `[req0, req0 + bs)` of the layer's page table (the SWA
    /// table for SWA layers), `[bs, M]`.
    pub(super) fn page_table(
        &self,
        plan: &LayerPlan,
        req0: usize,
        bs: usize,
    ) -> Result<Strided<'_, i32, 2>> {
        let m = self.m;
        let table = match (&self.swa_pt, plan.is_swa) {
            (Some(t), true) => t,
            _ => &self.pt,
        };
        Ok(Strided::new(
            "page_table",
            table.slice(req0 * m..(req0 + bs) * m),
            [bs, m],
            [m, 1],
        )?)
    }

    /// Requests `[req0, req0 + bs)` of `cache_seqlens`.
    pub(super) fn cache_seqlens(&self, req0: usize, bs: usize) -> Result<Strided<'_, i32, 1>> {
        Ok(Strided::contiguous(
            "cache_seqlens",
            self.cache.slice(req0..req0 + bs),
            [bs],
        )?)
    }
}

/// The K/V caches a layer's attention reads: the executor's own or an
/// engine's views.
#[derive(Clone, Copy)]
pub(super) enum KvSrc<'a> {
    Own(&'a DevCache),
    Engine(&'a crate::engine::EngineKvCache<'a>),
}

impl KvSrc<'_> {
    pub(super) fn views(
        &self,
        plan: &LayerPlan,
        page_size: usize,
        dtype: HalfDtype,
    ) -> Result<KvCache<'_>> {
        match *self {
            Self::Own(c) => kv_views(plan, c, page_size, dtype),
            Self::Engine(crate::engine::EngineKvCache::Half { k, v }) => Ok(KvCache::Half {
                dtype,
                k: k.strided()?,
                v: v.strided()?,
            }),
            Self::Engine(crate::engine::EngineKvCache::E4m3 { k, v }) => Ok(KvCache::E4m3 {
                k: k.strided()?,
                v: v.strided()?,
            }),
        }
    }
}

/// A `[rows, Hq, D]` query or output tensor: device elements and strides.
pub(super) struct Rows<V> {
    pub(super) view: V,
    pub(super) strides: [usize; 3],
}

impl<'a> Rows<CudaView<'a, u16>> {
    pub(super) fn contiguous(view: CudaView<'a, u16>, hq: usize, d: usize) -> Self {
        Self {
            view,
            strides: [hq * d, d, 1],
        }
    }

    /// Rows `[row0, row0 + rows)` as a checked view.
    pub(super) fn part(
        &self,
        row0: usize,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<Strided<'_, u16, 3>> {
        let off = (row0 * self.strides[0]).min(self.view.len());
        Ok(Strided::new(
            "q",
            self.view.slice(off..),
            [rows, hq, d],
            self.strides,
        )?)
    }
}

impl<'a> Rows<CudaViewMut<'a, u16>> {
    pub(super) fn contiguous_mut(view: CudaViewMut<'a, u16>, hq: usize, d: usize) -> Self {
        Self {
            view,
            strides: [hq * d, d, 1],
        }
    }

    fn part_mut(
        &mut self,
        row0: usize,
        rows: usize,
        hq: usize,
        d: usize,
    ) -> Result<StridedMut<'_, u16, 3>> {
        let off = (row0 * self.strides[0]).min(self.view.len());
        Ok(StridedMut::new(
            "out",
            self.view.slice_mut(off..),
            [rows, hq, d],
            self.strides,
        )?)
    }
}

fn kv_views<'a>(
    plan: &LayerPlan,
    cache: &'a DevCache,
    page_size: usize,
    dtype: HalfDtype,
) -> Result<KvCache<'a>> {
    let (hkv, d, p) = (plan.num_kv_heads, plan.head_dim, page_size);
    let pages = plan.slots / p;
    let shape = [pages, hkv, p, d];
    let strides = [p * hkv * d, d, hkv * d, 1];
    let n = plan.slots * hkv * d;
    Ok(match cache {
        DevCache::Half(k, v) => KvCache::Half {
            dtype,
            k: Strided::new("k_cache", k.slice(0..n), shape, strides)?,
            v: Strided::new("v_cache", v.slice(0..n), shape, strides)?,
        },
        DevCache::Fp8(k, v) => KvCache::E4m3 {
            k: Strided::new("k_cache", k.slice(0..n), shape, strides)?,
            v: Strided::new("v_cache", v.slice(0..n), shape, strides)?,
        },
    })
}

/// Attention of `q` (`[rows, Hq, D]`) into `out` over the layer's cache
/// with the tables of `b`: decode kernel for every branch but extend; an
/// extend / mixed pass sends its trailing one-token requests
/// (`decode_tail`) to the decode kernel and the rest to the context kernel.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_attention(
    cx: &mut AttnCx<'_>,
    plan: &LayerPlan,
    cache: KvSrc<'_>,
    sinks: Option<&CudaSlice<f32>>,
    b: &Tables<'_>,
    shape: PassShape,
    q: Rows<CudaView<'_, u16>>,
    mut out: Rows<CudaViewMut<'_, u16>>,
) -> Result<()> {
    let PassShape { mode, bs, rows, .. } = shape;
    if bs == 0 || rows == 0 {
        return Ok(());
    }
    let tail = shape.tail();
    let head = Part {
        req0: 0,
        bs: bs - tail,
        row0: 0,
        rows: rows - tail,
        mode,
    };
    let tail = Part {
        req0: bs - tail,
        bs: tail,
        row0: rows - tail,
        rows: tail,
        mode: AttnMode::Decode,
    };
    let main = cx.stream.clone();
    let side = cx
        .side
        .filter(|_| head.bs > 0 && head.rows > 0 && tail.bs > 0);
    let Some(side) = side else {
        // One stream; the tail's span (if timed) starts where the head's ended.
        let end = attend_part(
            cx, &main, plan, cache, sinks, b, shape, head, None, &q, &mut out,
        )?;
        attend_part(
            cx, &main, plan, cache, sinks, b, shape, tail, end, &q, &mut out,
        )?;
        return Ok(());
    };
    // Concurrent: fork the side stream after everything enqueued so far
    // (the K/V write), run the decode launch there and the context launch
    // here, join before anything later on this stream (the next layer's
    // inputs reuse the same buffers).
    let first = cx.timer.as_deref().map(PartTimer::spans);
    let wall = cx.span_start(None, &main)?;
    side.fork.record(&main).map_err(kerr)?;
    side.stream.wait(&side.fork).map_err(kerr)?;
    let run = |cx: &mut AttnCx<'_>, on_side: bool, out: &mut Rows<CudaViewMut<'_, u16>>| {
        let (stream, part) = if on_side {
            (&side.stream, tail)
        } else {
            (&main, head)
        };
        attend_part(
            cx, stream, plan, cache, sinks, b, shape, part, None, &q, out,
        )
    };
    let context_first = side.order == MixedOverlap::ContextFirst;
    let launched = run(cx, !context_first, &mut out).and_then(|_| run(cx, context_first, &mut out));
    // Joined even when a launch failed: nothing later on this stream (a
    // freed output, the next layer) may overtake what the side stream got.
    side.join.record(&side.stream).map_err(kerr)?;
    main.wait(&side.join).map_err(kerr)?;
    launched?;
    if let (Some(t), Some(start), Some(first)) = (cx.timer.as_deref_mut(), wall, first) {
        t.close_concurrent(start, first, &main)?;
    }
    Ok(())
}

/// Requests `[req0, req0 + bs)` of a pass, owning query rows
/// `[row0, row0 + rows)`, run as `mode`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Part {
    pub(super) req0: usize,
    pub(super) bs: usize,
    pub(super) row0: usize,
    pub(super) rows: usize,
    pub(super) mode: AttnMode,
}

/// How many requests at the end of a batch have exactly one query row
/// (`cu_seqlens_q [bs + 1]`).
pub(super) fn one_token_tail(cu_seqlens_q: &[i32]) -> usize {
    cu_seqlens_q
        .windows(2)
        .rev()
        .take_while(|w| w[1] - w[0] == 1)
        .count()
}

/// One attention launch over `part` (see [`run_attention`]). Ragged layouts
/// (extend, ragged verify) read absolute `cu_seqlens_q`, so they only run
/// from request 0. With a timer, the launch is one span (context or
/// decode) starting at event `from` when given (the end of the span just
/// before); returns the span's end event (`from` when nothing launched).
#[allow(clippy::too_many_arguments)]
fn attend_part(
    cx: &mut AttnCx<'_>,
    stream: &Arc<CudaStream>,
    plan: &LayerPlan,
    cache: KvSrc<'_>,
    sinks: Option<&CudaSlice<f32>>,
    b: &Tables<'_>,
    shape: PassShape,
    part: Part,
    from: Option<usize>,
    q: &Rows<CudaView<'_, u16>>,
    out: &mut Rows<CudaViewMut<'_, u16>>,
) -> Result<Option<usize>> {
    let Part {
        req0,
        bs,
        row0,
        rows,
        mode,
    } = part;
    if bs == 0 || rows == 0 {
        return Ok(from);
    }
    let max_q = shape.max_q;
    let (hq, d) = (plan.num_q_heads, plan.head_dim);
    let out = out.part_mut(row0, rows, hq, d)?;
    let sinks_view = sinks
        .map(|s| Strided::contiguous("sinks", s.slice(0..hq), [hq]))
        .transpose()?;
    if mode == AttnMode::Extend {
        // The one scale resolver (D8), as the CPU executor.
        let (bmm1, bmm2) = crate::executor::bmm_scales(plan, cx.q_scale);
        let mut args = ContextArgs {
            q: q.part(row0, rows, hq, d)?,
            q_dtype: cx.model_dtype,
            out,
            kv: cache.views(plan, cx.page_size, cx.model_dtype)?,
            page_table: b.page_table(plan, req0, bs)?,
            cache_seqlens: b.cache_seqlens(req0, bs)?,
            cu_seqlens_q: Strided::contiguous("cu_seqlens_q", b.cu_q.slice(0..bs + 1), [bs + 1])?,
            cu_seqlens_k: Some(Strided::contiguous(
                "cu_seqlens_k",
                b.cu_k.slice(0..bs + 1),
                [bs + 1],
            )?),
            max_q_len: max_q.max(1),
            bmm1_scale: bmm1,
            bmm2_scale: bmm2,
            window_left: plan.window_left,
            sinks: sinks_view,
            max_kv_len: shape.max_kv,
            lse: None,
        };
        let start = cx.span_start(from, stream)?;
        cx.context.launch_on(stream, &mut args, cx.errors)?;
        return cx.span_end(AttnPart::Context, start, stream);
    }
    let start = cx.span_start(from, stream)?;
    // Decode context parallelism: the ranks' partial states merged into
    // `out` (decode-kernel passes; a mixed pass's decode rows run unsplit,
    // as on the CPU executor). Each rank builds its own K/V, page-table and
    // length views.
    let cp = if shape.mode == AttnMode::Extend {
        None
    } else {
        cx.cp.take()
    };
    if let Some(mut cp) = cp {
        let ranks = super::cp::RankInputs {
            plan,
            cache,
            sinks: sinks_view,
            b,
            part,
            max_q,
            q,
        };
        let r = super::cp::attend_ranks(cx, &mut cp, stream, ranks, out);
        cx.cp = Some(cp);
        r?;
        return cx.span_end(AttnPart::Decode, start, stream);
    }
    let args = decode_args(
        DecodeViews {
            q: q.part(row0, rows, hq, d)?,
            out,
            kv: cache.views(plan, cx.page_size, cx.model_dtype)?,
            page_table: b.page_table(plan, req0, bs)?,
            cache_seqlens: b.cache_seqlens(req0, bs)?,
            sinks: sinks_view,
        },
        cx,
        plan,
        b,
        part,
        max_q,
    )?;
    launch_decode(cx, stream, args, Some(part.req0))?;
    cx.span_end(AttnPart::Decode, start, stream)
}

/// The views of one decode launch.
pub(super) struct DecodeViews<'v> {
    pub(super) q: Strided<'v, u16, 3>,
    pub(super) out: StridedMut<'v, u16, 3>,
    pub(super) kv: KvCache<'v>,
    pub(super) page_table: Strided<'v, i32, 2>,
    pub(super) cache_seqlens: Strided<'v, i32, 1>,
    pub(super) sinks: Option<Strided<'v, f32, 1>>,
}

/// The decode arguments of `part` (its mode's row layout, the layer's
/// scales and window) over `v`, no split chosen yet, no interleave, no LSE.
pub(super) fn decode_args<'v>(
    v: DecodeViews<'v>,
    cx: &AttnCx<'_>,
    plan: &LayerPlan,
    b: &'v Tables<'_>,
    part: Part,
    max_q: usize,
) -> Result<DecodeArgs<'v>> {
    let bs = part.bs;
    let layout = match part.mode {
        AttnMode::Decode | AttnMode::DraftDecode { .. } => {
            QueryLayout::Uniform { q_len_per_req: 1 }
        }
        AttnMode::TargetVerify { q_len } | AttnMode::DraftExtendV2 { q_len } => {
            QueryLayout::Uniform {
                q_len_per_req: q_len,
            }
        }
        _ => QueryLayout::Ragged {
            cu_seqlens_q: Strided::contiguous("cu_seqlens_q", b.cu_q.slice(0..bs + 1), [bs + 1])?,
            max_q_len: max_q.max(1),
        },
    };
    // The one scale resolver (D8), as the CPU executor.
    let (bmm1, bmm2) = crate::executor::bmm_scales(plan, cx.q_scale);
    Ok(DecodeArgs {
        q: v.q,
        q_dtype: cx.model_dtype,
        out: v.out,
        kv: v.kv,
        page_table: v.page_table,
        cache_seqlens: v.cache_seqlens,
        layout,
        max_seq_len: cx.max_seq_len.max(1),
        bmm1_scale: bmm1,
        bmm2_scale: bmm2,
        window_left: plan.window_left,
        sinks: v.sinks,
        split: SplitMode::Auto,
        interleave: None,
        skip_softmax: cx.skip_softmax,
        skipped_slices: None,
        unit_order: None,
        workspace: None,
        lse: None,
    })
}

/// Plans and launches one decode call on `stream`: Auto's split, or the
/// executor's chunked split when Auto would not split and the workspace
/// holds it; the split counters zeroed unless known zero. `req0`: the
/// launch's `cache_seqlens` are the pass tables' requests from `req0`
/// (then an ordered launch of one split reads the pass's [`UnitOrder`],
/// written here first if the pass has none for them); `None` for lengths of
/// its own (a decode-parallel rank's).
pub(super) fn launch_decode(
    cx: &mut AttnCx<'_>,
    stream: &Arc<CudaStream>,
    args: DecodeArgs<'_>,
    req0: Option<usize>,
) -> Result<()> {
    // Shortened to this call (the workspace view borrows `cx`).
    let mut args: DecodeArgs<'_> = args;
    let args = &mut args;
    let mut lp = cx.decode.plan(args)?;
    // A launch Auto does not split fills the GPU: cut long requests into
    // chunks (length-aware, batch-independent) unless the workspace is short
    // or the launch holds enough work items for the kernel's length order
    // alone (`paged_attention::chunk_full_launch`).
    if chunk_full_launch(&lp, cx.decode.num_sms())
        && matches!(cx.decode_split, SplitMode::Chunked { .. })
    {
        args.split = cx.decode_split;
        let chunked = cx.decode.plan(args)?;
        if chunked.workspace_elems <= cx.workspace.len() {
            lp = chunked;
        } else {
            args.split = SplitMode::Auto;
        }
    }
    let bs = args.cache_seqlens.shape()[0];
    let reads = cx.decode.reads_unit_order(&lp.params);
    if let (Some(req0), Some(u), true) = (req0, cx.unit_order.as_deref_mut(), reads) {
        if bs <= u.capacity() {
            if u.written != Some((req0, bs)) {
                cx.decode.write_unit_order(
                    stream,
                    &args.cache_seqlens,
                    &mut StridedMut::contiguous("unit_order", u.buf.slice_mut(0..bs), [bs])?,
                )?;
                u.written = Some((req0, bs));
            }
            args.unit_order = Some(Strided::contiguous("unit_order", u.buf.slice(0..bs), [bs])?);
        }
    }
    let elems = lp.workspace_elems;
    if elems > 0 {
        if elems > cx.workspace.len() {
            return Err(kerr(KernelError::Capacity {
                arg: "workspace",
                needed: elems,
                available: cx.workspace.len(),
            }));
        }
        // The last `items` elements are the split counters: zero them unless
        // the previous launch (same counter range) left them zero.
        let p = &lp.params;
        let items = p.work_items();
        let region = (elems - items, elems);
        if cx.foreign_workspace || *cx.ws_zero != Some(region) {
            stream
                .memset_zeros(&mut cx.workspace.slice_mut(region.0..region.1))
                .map_err(kerr)?;
        }
        args.workspace = Some(StridedMut::contiguous(
            "workspace",
            cx.workspace.slice_mut(0..elems),
            [elems],
        )?);
        cx.decode.launch_on(stream, args, cx.errors)?;
        if !cx.foreign_workspace {
            *cx.ws_zero = Some(region);
        }
    } else {
        cx.decode.launch_on(stream, args, cx.errors)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::one_token_tail;

    /// The decode rows of a mixed batch are its trailing one-token requests;
    /// a one-token prefill chunk before a longer one stays with the context
    /// kernel.
    #[test]
    fn one_token_tail_counts_trailing_single_rows() {
        assert_eq!(one_token_tail(&[0]), 0);
        assert_eq!(one_token_tail(&[0, 5]), 0);
        assert_eq!(one_token_tail(&[0, 1]), 1);
        assert_eq!(one_token_tail(&[0, 7, 8, 9, 10]), 3);
        assert_eq!(one_token_tail(&[0, 1, 9, 10]), 1);
        assert_eq!(one_token_tail(&[0, 1, 2, 3]), 3);
        // Empty requests (length 0) end the tail.
        assert_eq!(one_token_tail(&[0, 4, 5, 5]), 0);
    }
}

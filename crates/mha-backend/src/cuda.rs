//! The CUDA executor: device K/V caches, device `req_to_token` and SWA maps
//! (uploaded on change, one stream-ordered copy each), metadata built on
//! the device by the fused graph-metadata kernel (one launch per pass, every
//! mode; extend-like modes add one copy of `cu_seqlens_q`), K/V writes by
//! fp8-kv, attention by paged-attention's decode kernel (decode, verify,
//! draft extend) or context kernel (extend, mixed), and CUDA graphs of whole
//! steps (SEMANTICS.md §backend.4–7).
//!
//! Everything is stream-ordered on the [`Gpu`]'s stream. Calls return
//! without synchronising; device error events go to the executor's error
//! words ([`Executor::device_errors`] reads them, a synchronisation). With
//! a [`PartTimer`] installed, eager K/V writes and attention launches are
//! bracketed by its events (event records only; [`crate::part_timing`]);
//! graph capture never records them.
//!
//! Buffers a graph bakes in (caches, pool tables, workspace, graph state,
//! sinks) are allocated once and never reallocated while a graph exists.

use std::collections::HashMap;
use std::sync::Arc;

use fp8_kv::{KvCacheDtype, KvWriteArgs, KvWriteKernel};
use graph_metadata::{GraphMetadataArgs, GraphMetadataKernel, GraphMode, SwaArgs, SwaWriteLocs};
use kernel_rt::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use kernel_rt::cudarc::driver::{
    CudaEvent, CudaGraph, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    PinnedHostSlice, ValidAsZeroBits,
};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use paged_attention::{
    ContextArgs, ContextKernel, DecodeArgs, HalfDtype, KvCache, PagedAttentionKernel, QueryLayout,
    SplitMode,
};

use crate::batch::{AttnMode, ForwardBatch};
use crate::engine::{EngineBatch, EngineLayer, EngineShape};
use crate::error::{BackendError, Result};
use crate::executor::{
    DeviceMetadata, Executor, ExecutorKind, KvLoc, KvSnapshot, LayerPlan, Tensor, TensorRef,
};
use crate::graph::{GraphKey, GraphKind};
use crate::metadata::ForwardMetadata;
use crate::part_timing::{attention_flops, ragged_causal_pairs, AttnPart, PartTimer};
use crate::pools::Pools;

fn kerr(e: impl Into<KernelError>) -> BackendError {
    BackendError::Kernel(e.into())
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    stream.alloc_zeros::<T>(n.max(1)).map_err(kerr)
}

/// Grows `buf` to at least `n` elements (new contents zero).
fn ensure<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    n: usize,
) -> Result<()> {
    if buf.len() < n {
        *buf = zeros(stream, n)?;
    }
    Ok(())
}

/// Copies `src` into the first `src.len()` elements of `dst` (nothing for an
/// empty `src`).
fn upload<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    src: &[T],
    dst: &mut CudaSlice<T>,
) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    if dst.len() < src.len() {
        return Err(kerr(KernelError::Capacity {
            arg: "upload",
            needed: src.len(),
            available: dst.len(),
        }));
    }
    stream
        .memcpy_htod(src, &mut dst.slice_mut(0..src.len()))
        .map_err(kerr)
}

fn read<T: DeviceRepr + Default + Clone>(
    stream: &Arc<CudaStream>,
    src: &CudaSlice<T>,
    n: usize,
) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    stream.clone_dtoh(&src.slice(0..n)).map_err(kerr)
}

/// One layer's caches, `[slots, Hkv, D]` each.
#[derive(Debug)]
enum DevCache {
    Half(CudaSlice<u16>, CudaSlice<u16>),
    Fp8(CudaSlice<u8>, CudaSlice<u8>),
}

/// Device copies of the pool tables, allocated once at their full size (a
/// graph bakes their addresses in).
#[derive(Debug)]
struct Maps {
    /// Pools generation last uploaded (`None` = never).
    generation: Option<u64>,
    r2t: CudaSlice<i32>,
    rows: usize,
    width: usize,
    pool_slots: usize,
    swa_map: Option<CudaSlice<i64>>,
    swa_map_len: usize,
    page_map: Option<CudaSlice<i32>>,
    page_map_len: usize,
    /// Applies changed `req_to_token` entries to `r2t` on the device.
    scatter: page_table::ScatterKernel,
    /// Device error word of the scatter (out-of-range entries: a bug).
    scatter_errors: DeviceErrors,
    /// `[n, 2]` i64 `(position, slot)` entries on the device.
    entries: CudaSlice<i64>,
    /// Pinned staging buffers of entries, used in turn, each with the
    /// event recorded after the copy that reads it.
    staging: [Option<(PinnedHostSlice<i64>, CudaEvent)>; STAGING_BUFFERS],
    next_staging: usize,
    /// Applies changed full pages to the device SWA maps.
    swa_update: Option<swa_pool::SwaUpdateKernel>,
    /// `SwaMapping::version` the device SWA maps hold (`None` = never synced).
    swa_version: Option<u64>,
    /// SWA pool pages, the dummy page included.
    swa_pages: usize,
}

/// Pinned staging buffers of [`Maps`] (a sync may stage twice: the
/// `req_to_token` entries and the SWA page entries).
const STAGING_BUFFERS: usize = 4;

impl Maps {
    fn new(gpu: &Arc<Gpu>, stream: &Arc<CudaStream>, pools: &Pools) -> Result<Self> {
        let rows = pools.req_to_token_rows();
        let width = pools.req_to_token_width();
        let (swa_map, swa_map_len, page_map, page_map_len) = match pools.swa_mapping() {
            Some(m) => {
                let pm = m.page_map();
                (
                    Some(zeros::<i64>(stream, m.map().len())?),
                    m.map().len(),
                    Some(zeros::<i32>(stream, pm.len())?),
                    pm.len(),
                )
            }
            None => (None, 0, None, 0),
        };
        Ok(Self {
            generation: None,
            r2t: zeros(stream, rows * width)?,
            rows,
            width,
            pool_slots: pools.full_slots(),
            swa_map,
            swa_map_len,
            page_map,
            page_map_len,
            scatter: page_table::ScatterKernel::new(gpu)?,
            scatter_errors: DeviceErrors::new(gpu)?,
            entries: zeros(stream, 2)?,
            staging: [None, None, None, None],
            next_staging: 0,
            swa_update: match pools.swa_mapping() {
                Some(_) => Some(swa_pool::SwaUpdateKernel::new(gpu)?),
                None => None,
            },
            swa_version: None,
            swa_pages: pools.swa_slots().unwrap_or(0) / pools.page_size().max(1),
        })
    }

    /// Copies `n` i64 values, written by `fill` into pinned memory, to the
    /// front of `entries` (asynchronous: no stream sync).
    fn stage(
        &mut self,
        stream: &Arc<CudaStream>,
        n: usize,
        fill: impl FnOnce(&mut [i64]),
    ) -> Result<()> {
        let k = self.next_staging;
        self.next_staging = (k + 1) % STAGING_BUFFERS;
        // The buffer's previous copy (STAGING_BUFFERS stagings ago) must
        // have finished before the host overwrites it.
        if let Some((_, ev)) = &self.staging[k] {
            ev.synchronize().map_err(kerr)?;
        }
        let (mut host, ev) = match self.staging[k].take() {
            Some((h, e)) if h.len() >= n => (h, e),
            old => {
                let want = n.max(old.as_ref().map_or(0, |(h, _)| h.len() * 3 / 2));
                // SAFETY: page-locked memory of `want` i64 the host fills
                // before the copy is enqueued; kernel-rt turns cudarc's event
                // tracking off, so reuse is guarded by this buffer's own
                // event (above).
                let h = unsafe {
                    stream
                        .context()
                        .alloc_pinned_with_flags::<i64>(want, 0)
                        .map_err(kerr)?
                };
                (h, stream.context().new_event(None).map_err(kerr)?)
            }
        };
        if self.entries.len() < n {
            self.entries = zeros(stream, n.max(self.entries.len() * 3 / 2))?;
        }
        let dst = host.as_mut_slice().map_err(kerr)?;
        fill(&mut dst[..n]);
        // The source is page-locked, so the driver copies asynchronously
        // (no stream sync, unlike a pageable source).
        let copied = stream
            .memcpy_htod(&dst[..n], &mut self.entries.slice_mut(0..n))
            .and_then(|()| ev.record(stream));
        if copied.is_err() {
            // The copy may be queued: never free its source before the
            // stream has drained (cudarc's own event tracking is off).
            let _ = stream.synchronize();
        }
        self.staging[k] = Some((host, ev));
        copied.map_err(kerr)
    }

    /// Applies the changed full pages `pages` of `m` to the device SWA
    /// slot and page maps: `(page, swa_page)` entries from pinned memory,
    /// one swa-pool update launch (no stream sync).
    fn update_swa(
        &mut self,
        stream: &Arc<CudaStream>,
        m: &swa_pool::SwaMapping,
        pages: &[usize],
    ) -> Result<()> {
        if pages.is_empty() {
            return Ok(());
        }
        let e = m.update_entries(pages);
        let n = e.len();
        self.stage(stream, n, |dst| dst.copy_from_slice(&e))?;
        let (Some(kernel), Some(map), Some(pm)) = (
            self.swa_update.as_ref(),
            self.swa_map.as_mut(),
            self.page_map.as_mut(),
        ) else {
            return Ok(());
        };
        let mut args = swa_pool::SwaUpdateArgs {
            full_to_swa: StridedMut::contiguous(
                "full_to_swa",
                map.slice_mut(0..self.swa_map_len),
                [self.swa_map_len],
            )?,
            page_map: Some(StridedMut::contiguous(
                "page_map",
                pm.slice_mut(0..self.page_map_len),
                [self.page_map_len],
            )?),
            entries: Strided::contiguous("entries", self.entries.slice(0..n), [n / 2, 2])?,
            page_size: m.page_size(),
            num_swa_pages: self.swa_pages,
        };
        kernel.launch(&mut args, &mut self.scatter_errors)?;
        Ok(())
    }

    /// Uploads the changed entries `spans` (from [`Pools::dirty_spans`]) as
    /// `(position, slot)` pairs through a pinned staging buffer
    /// (asynchronous: no stream sync) and scatters them into `r2t`.
    fn scatter_spans(
        &mut self,
        stream: &Arc<CudaStream>,
        pools: &Pools,
        spans: &[(usize, std::ops::Range<usize>)],
    ) -> Result<()> {
        let n: usize = spans.iter().map(|(_, c)| c.len()).sum();
        if n == 0 {
            return Ok(());
        }
        let w = self.width;
        let table = pools.req_to_token();
        self.stage(stream, 2 * n, |dst| {
            let mut i = 0;
            for (row, cols) in spans {
                for c in cols.clone() {
                    let pos = row * w + c;
                    dst[2 * i] = pos as i64;
                    dst[2 * i + 1] = i64::from(table[pos]);
                    i += 1;
                }
            }
        })?;
        let mut args = page_table::ScatterArgs {
            req_to_token: StridedMut::contiguous(
                "req_to_token",
                self.r2t.slice_mut(0..self.rows * w),
                [self.rows, w],
            )?,
            entries: Strided::contiguous("entries", self.entries.slice(0..2 * n), [n, 2])?,
        };
        self.scatter.launch(&mut args, &mut self.scatter_errors)?;
        Ok(())
    }

    /// Uploads what changed since the last sync: the changed
    /// `req_to_token` entries ([`Self::scatter_spans`]; the whole table on
    /// the first sync), and the SWA slot and page maps' changed pages
    /// ([`Self::update_swa`]; whole on the first sync).
    fn sync(&mut self, stream: &Arc<CudaStream>, pools: &Pools) -> Result<()> {
        let now = pools.generation();
        let (rows, swa) = match self.generation {
            Some(g) if g == now => return Ok(()),
            Some(g) => {
                // Changed entries only, through pinned memory: no stream sync.
                self.scatter_spans(stream, pools, &pools.dirty_spans(g))?;
                (None, pools.swa_dirty(g))
            }
            None => (Some(0..self.rows), true),
        };
        if let Some(r) = rows {
            let w = self.width;
            let src = &pools.req_to_token()[r.start * w..r.end * w];
            if !src.is_empty() {
                stream
                    .memcpy_htod(src, &mut self.r2t.slice_mut(r.start * w..r.end * w))
                    .map_err(kerr)?;
            }
        }
        if swa {
            if let Some(m) = pools.swa_mapping() {
                // Entry-wise from the map's change log (pinned, no stream
                // sync); whole, from pageable memory, only on the first sync
                // or when the log no longer reaches back.
                match self.swa_version.and_then(|v| m.changed_pages_since(v)) {
                    Some(pages) => self.update_swa(stream, m, &pages)?,
                    None => {
                        if let (Some(d), Some(pd)) = (self.swa_map.as_mut(), self.page_map.as_mut())
                        {
                            upload(stream, m.map(), d)?;
                            upload(stream, &m.page_map(), pd)?;
                        }
                    }
                }
                self.swa_version = Some(m.version());
            }
        }
        self.generation = Some(now);
        pools.mark_synced(now);
        Ok(())
    }
}

/// Metadata inputs and outputs of one pass (eager) or of the graph state.
#[derive(Debug)]
struct MetaBufs {
    cap_bs: usize,
    cap_tokens: usize,
    m: usize,
    rpi: CudaSlice<i64>,
    seq: CudaSlice<i64>,
    qlens: CudaSlice<i32>,
    out_loc: CudaSlice<i64>,
    cache: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    cu_q: CudaSlice<i32>,
    pt: CudaSlice<i32>,
    swa_pt: Option<CudaSlice<i32>>,
    swa_out: Option<CudaSlice<i64>>,
}

impl MetaBufs {
    fn new(
        stream: &Arc<CudaStream>,
        cap_bs: usize,
        cap_tokens: usize,
        m: usize,
        swa: bool,
    ) -> Result<Self> {
        Ok(Self {
            cap_bs,
            cap_tokens,
            m,
            rpi: zeros(stream, cap_bs)?,
            seq: zeros(stream, cap_bs)?,
            qlens: zeros(stream, cap_bs)?,
            out_loc: zeros(stream, cap_tokens)?,
            cache: zeros(stream, cap_bs)?,
            cu_k: zeros(stream, cap_bs + 1)?,
            cu_q: zeros(stream, cap_bs + 1)?,
            pt: zeros(stream, cap_bs * m)?,
            swa_pt: if swa {
                Some(zeros(stream, cap_bs * m)?)
            } else {
                None
            },
            swa_out: if swa {
                Some(zeros(stream, cap_tokens)?)
            } else {
                None
            },
        })
    }

    fn read(&self, stream: &Arc<CudaStream>, bs: usize, n_tokens: usize) -> Result<DeviceMetadata> {
        Ok(DeviceMetadata {
            cache_seqlens: read(stream, &self.cache, bs)?,
            cu_seqlens_q: read(stream, &self.cu_q, bs + 1)?,
            cu_seqlens_k: read(stream, &self.cu_k, bs + 1)?,
            page_table: read(stream, &self.pt, bs * self.m)?,
            swa_page_table: self
                .swa_pt
                .as_ref()
                .map(|t| read(stream, t, bs * self.m))
                .transpose()?,
            swa_out_cache_loc: self
                .swa_out
                .as_ref()
                .map(|t| read(stream, t, n_tokens))
                .transpose()?,
        })
    }
}

/// Host inputs of one metadata build, uploaded into a [`MetaBufs`].
struct MetaInputs<'a> {
    req_pool_indices: &'a [i64],
    seq_lens: &'a [i64],
    out_cache_loc: &'a [i64],
    /// `[bs]` ragged-verify lengths.
    qlens: Option<&'a [i32]>,
    /// `[bs+1]` host `cu_seqlens_q` (extend-like modes).
    cu_q: Option<&'a [i32]>,
}

impl MetaInputs<'_> {
    fn upload(&self, stream: &Arc<CudaStream>, b: &mut MetaBufs) -> Result<()> {
        upload(stream, self.req_pool_indices, &mut b.rpi)?;
        upload(stream, self.seq_lens, &mut b.seq)?;
        upload(stream, self.out_cache_loc, &mut b.out_loc)?;
        if let Some(q) = self.qlens {
            upload(stream, q, &mut b.qlens)?;
        }
        if let Some(q) = self.cu_q {
            upload(stream, q, &mut b.cu_q)?;
        }
        Ok(())
    }
}

/// The graph-metadata mode, whether the kernel writes `cu_seqlens_q`, and
/// whether it reads `qlens`, for a branch.
fn meta_mode(mode: AttnMode, max_q: usize) -> Result<(GraphMode, bool)> {
    Ok(match mode {
        AttnMode::Decode => (GraphMode::Decode, true),
        AttnMode::DraftDecode { step } => (GraphMode::DraftDecode { step }, true),
        AttnMode::TargetVerify { q_len } => (
            GraphMode::TargetVerify {
                q_len: q_len as u32,
            },
            true,
        ),
        AttnMode::DraftExtendV2 { q_len } => (
            GraphMode::DraftExtendV2 {
                q_len: q_len as u32,
            },
            true,
        ),
        AttnMode::RaggedVerify => (
            GraphMode::RaggedVerify {
                max_q_len: max_q.max(1) as u32,
            },
            true,
        ),
        // Offset 0 gives cache_seqlens = seq_lens; cu_seqlens_q is uploaded.
        AttnMode::Extend => (GraphMode::Decode, false),
    })
}

/// The inputs of one fused metadata launch (the executor's own buffers or
/// an engine's views): `[bs]` request rows and lengths, `[n]` write slots,
/// `[bs]` ragged lengths, `req_to_token`, the SWA maps.
struct MetaIn<'a> {
    rpi: Strided<'a, i64, 1>,
    seq: Strided<'a, i64, 1>,
    out_loc: Strided<'a, i64, 1>,
    qlens: Option<Strided<'a, i32, 1>>,
    r2t: Strided<'a, i32, 2>,
    pool_slots: Option<usize>,
    swa_map: Option<Strided<'a, i64, 1>>,
    page_map: Option<Strided<'a, i32, 1>>,
}

impl<'a> MetaIn<'a> {
    /// The executor's device pool tables (`req_to_token`, SWA maps); the
    /// batch vectors are placeholders the caller replaces.
    fn own_tables(maps: &'a Maps) -> Result<Self> {
        let empty = |arg| Strided::contiguous(arg, maps.entries.slice(0..0), [0]);
        Ok(Self {
            rpi: empty("req_pool_indices")?,
            seq: empty("seq_lens")?,
            out_loc: empty("out_cache_loc")?,
            qlens: None,
            r2t: Strided::new(
                "req_to_token",
                maps.r2t.slice(0..maps.rows * maps.width),
                [maps.rows, maps.width],
                [maps.width, 1],
            )?,
            pool_slots: Some(maps.pool_slots),
            swa_map: maps
                .swa_map
                .as_ref()
                .map(|m| {
                    Strided::contiguous(
                        "swa_mapping",
                        m.slice(0..maps.swa_map_len),
                        [maps.swa_map_len],
                    )
                })
                .transpose()?,
            page_map: match &maps.page_map {
                Some(pm) if maps.page_map_len > 0 => Some(Strided::contiguous(
                    "full_page_to_swa_page",
                    pm.slice(0..maps.page_map_len),
                    [maps.page_map_len],
                )?),
                _ => None,
            },
        })
    }
}

/// One fused metadata launch over `b` (first `bs` rows, `n_tokens` tokens),
/// from the executor's own inputs.
#[allow(clippy::too_many_arguments)]
fn launch_metadata(
    kernel: &GraphMetadataKernel,
    maps: &Maps,
    b: &mut MetaBufs,
    mode: GraphMode,
    write_cu_q: bool,
    bs: usize,
    n_tokens: usize,
    page_size: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    if bs == 0 {
        return Ok(());
    }
    let ragged = matches!(mode, GraphMode::RaggedVerify { .. });
    let MetaBufs {
        m,
        rpi,
        seq,
        qlens,
        out_loc,
        cache,
        cu_k,
        cu_q,
        pt,
        swa_pt,
        swa_out,
        ..
    } = b;
    let input = MetaIn {
        rpi: Strided::contiguous("req_pool_indices", rpi.slice(0..bs), [bs])?,
        seq: Strided::contiguous("seq_lens", seq.slice(0..bs), [bs])?,
        out_loc: Strided::contiguous("out_cache_loc", out_loc.slice(0..n_tokens), [n_tokens])?,
        qlens: if ragged {
            Some(Strided::contiguous("qlens", qlens.slice(0..bs), [bs])?)
        } else {
            None
        },
        ..MetaIn::own_tables(maps)?
    };
    let out = MetaOut {
        m: *m,
        cache,
        cu_k,
        cu_q,
        pt,
        swa_pt: swa_pt.as_mut(),
        swa_out: swa_out.as_mut(),
    };
    launch_metadata_on(
        kernel, input, out, mode, write_cu_q, bs, n_tokens, page_size, errors,
    )
}

/// The outputs of one fused metadata launch.
struct MetaOut<'a> {
    m: usize,
    cache: &'a mut CudaSlice<i32>,
    cu_k: &'a mut CudaSlice<i32>,
    cu_q: &'a mut CudaSlice<i32>,
    pt: &'a mut CudaSlice<i32>,
    swa_pt: Option<&'a mut CudaSlice<i32>>,
    swa_out: Option<&'a mut CudaSlice<i64>>,
}

impl<'a> MetaOut<'a> {
    fn of(b: &'a mut MetaBufs) -> Self {
        Self {
            m: b.m,
            cache: &mut b.cache,
            cu_k: &mut b.cu_k,
            cu_q: &mut b.cu_q,
            pt: &mut b.pt,
            swa_pt: b.swa_pt.as_mut(),
            swa_out: b.swa_out.as_mut(),
        }
    }
}

/// One fused metadata launch from `input` into `out` (first `bs` rows,
/// `n_tokens` tokens).
#[allow(clippy::too_many_arguments)]
fn launch_metadata_on(
    kernel: &GraphMetadataKernel,
    input: MetaIn<'_>,
    out: MetaOut<'_>,
    mode: GraphMode,
    write_cu_q: bool,
    bs: usize,
    n_tokens: usize,
    page_size: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    if bs == 0 {
        return Ok(());
    }
    let m = out.m;
    let MetaIn {
        rpi,
        seq,
        out_loc,
        qlens,
        r2t,
        pool_slots,
        swa_map,
        page_map,
    } = input;
    let swa = match (swa_map, out.swa_pt) {
        (Some(map), Some(swa_pt)) => Some(SwaArgs {
            swa_mapping: map,
            swa_page_table: Some(StridedMut::new(
                "swa_page_table",
                swa_pt.slice_mut(0..bs * m),
                [bs, m],
                [m, 1],
            )?),
            full_page_to_swa_page: page_map,
            write_locs: match out.swa_out {
                Some(o) if n_tokens > 0 => Some(SwaWriteLocs {
                    out_cache_loc: Some(out_loc),
                    swa_out_cache_loc: StridedMut::contiguous(
                        "swa_out_cache_loc",
                        o.slice_mut(0..n_tokens),
                        [n_tokens],
                    )?,
                }),
                _ => None,
            },
        }),
        _ => None,
    };
    let mut args = GraphMetadataArgs {
        mode,
        req_pool_indices: rpi,
        seq_lens: seq,
        req_to_token: r2t,
        page_size,
        pool_slots,
        cache_seqlens: StridedMut::contiguous("cache_seqlens", out.cache.slice_mut(0..bs), [bs])?,
        cu_seqlens_k: StridedMut::contiguous(
            "cu_seqlens_k",
            out.cu_k.slice_mut(0..bs + 1),
            [bs + 1],
        )?,
        cu_seqlens_q: if write_cu_q {
            Some(StridedMut::contiguous(
                "cu_seqlens_q",
                out.cu_q.slice_mut(0..bs + 1),
                [bs + 1],
            )?)
        } else {
            None
        },
        qlens,
        page_table: StridedMut::new("page_table", out.pt.slice_mut(0..bs * m), [bs, m], [m, 1])?,
        swa,
    };
    kernel.launch(&mut args, errors)?;
    Ok(())
}

/// The launchers and state every attention call needs.
struct AttnCx<'a> {
    stream: &'a Arc<CudaStream>,
    decode: &'a PagedAttentionKernel,
    context: &'a ContextKernel,
    workspace: CudaViewMut<'a, f32>,
    /// Workspace range `[start, end)` known to hold zero split counters.
    ws_zero: &'a mut Option<(usize, usize)>,
    errors: &'a mut DeviceErrors,
    model_dtype: HalfDtype,
    page_size: usize,
    /// `max_seq_len` of every decode launch: the context length, so eager
    /// and graph launches of one shape split identically.
    max_seq_len: usize,
    /// Split of decode launches that fill the GPU (Auto's choice is 1).
    decode_split: SplitMode,
    /// Records spans around the launches when installed (eager passes
    /// only: `None` while a graph is captured).
    timer: Option<&'a mut PartTimer>,
    /// `q_scale` of `bmm1 = q_scale · k_scale · sm_scale` (1 on the owning path).
    q_scale: f32,
    /// The workspace is an engine's: zero the split counters before every
    /// split launch (nothing is known about their state).
    foreign_workspace: bool,
}

impl AttnCx<'_> {
    /// The start event of a span about to be launched: `from` (the end of
    /// the span just before, nothing enqueued since) or a new event; `None`
    /// without a timer.
    fn span_start(&mut self, from: Option<usize>) -> Result<Option<usize>> {
        match (self.timer.as_deref_mut(), from) {
            (None, _) => Ok(None),
            (Some(_), Some(i)) => Ok(Some(i)),
            (Some(t), None) => t.mark(self.stream).map(Some),
        }
    }

    /// Ends the span of `part` begun at `start`; returns its end event.
    fn span_end(&mut self, part: AttnPart, start: Option<usize>) -> Result<Option<usize>> {
        match (self.timer.as_deref_mut(), start) {
            (Some(t), Some(a)) => t.close(part, a, self.stream).map(Some),
            _ => Ok(None),
        }
    }
}

/// One pass's geometry for attention.
#[derive(Debug, Clone, Copy)]
struct PassShape {
    mode: AttnMode,
    bs: usize,
    rows: usize,
    max_q: usize,
    /// Extend / mixed only: how many requests at the end of the batch have
    /// one new token (the decode rows of a mixed batch). They go to the
    /// decode kernel, which reads each KV byte once for all G heads of a KV
    /// head; the context kernel gets the requests before them.
    decode_tail: usize,
}

impl PassShape {
    /// Requests at the end of the batch that an extend / mixed pass sends
    /// to the decode kernel (0 in every other mode).
    fn tail(&self) -> usize {
        if self.mode == AttnMode::Extend {
            self.decode_tail.min(self.bs).min(self.rows)
        } else {
            0
        }
    }
}

/// The metadata tensors attention reads: the page tables, `cache_seqlens`,
/// `cu_seqlens_k`, `cu_seqlens_q` (`[bs, M]`, `[bs]`, `[bs + 1]` ×2).
struct Tables<'a> {
    pt: CudaView<'a, i32>,
    swa_pt: Option<CudaView<'a, i32>>,
    cache: CudaView<'a, i32>,
    cu_k: CudaView<'a, i32>,
    cu_q: CudaView<'a, i32>,
    m: usize,
}

impl<'a> Tables<'a> {
    /// The tables of `b`; `cu_q` replaces `b`'s `cu_seqlens_q` (an engine's own).
    fn of(b: &'a MetaBufs, cu_q: Option<CudaView<'a, i32>>) -> Self {
        Self {
            pt: b.pt.slice(0..b.pt.len()),
            swa_pt: b.swa_pt.as_ref().map(|t| t.slice(0..t.len())),
            cache: b.cache.slice(0..b.cache.len()),
            cu_k: b.cu_k.slice(0..b.cu_k.len()),
            cu_q: cu_q.unwrap_or_else(|| b.cu_q.slice(0..b.cu_q.len())),
            m: b.m,
        }
    }
}

/// The K/V caches a layer's attention reads: the executor's own or an
/// engine's views.
#[derive(Clone, Copy)]
enum KvSrc<'a> {
    Own(&'a DevCache),
    Engine(&'a crate::engine::EngineKvCache<'a>),
}

impl KvSrc<'_> {
    fn views(&self, plan: &LayerPlan, page_size: usize, dtype: HalfDtype) -> Result<KvCache<'_>> {
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
struct Rows<V> {
    view: V,
    strides: [usize; 3],
}

impl<'a> Rows<CudaView<'a, u16>> {
    fn contiguous(view: CudaView<'a, u16>, hq: usize, d: usize) -> Self {
        Self {
            view,
            strides: [hq * d, d, 1],
        }
    }

    /// Rows `[row0, row0 + rows)` as a checked view.
    fn part(&self, row0: usize, rows: usize, hq: usize, d: usize) -> Result<Strided<'_, u16, 3>> {
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
    fn contiguous_mut(view: CudaViewMut<'a, u16>, hq: usize, d: usize) -> Self {
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
fn run_attention(
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
    // The tail's span (if timed) starts where the head's ended.
    let end = attend_part(cx, plan, cache, sinks, b, shape, head, None, &q, &mut out)?;
    let tail = Part {
        req0: bs - tail,
        bs: tail,
        row0: rows - tail,
        rows: tail,
        mode: AttnMode::Decode,
    };
    attend_part(cx, plan, cache, sinks, b, shape, tail, end, &q, &mut out)?;
    Ok(())
}

/// Requests `[req0, req0 + bs)` of a pass, owning query rows
/// `[row0, row0 + rows)`, run as `mode`.
#[derive(Debug, Clone, Copy)]
struct Part {
    req0: usize,
    bs: usize,
    row0: usize,
    rows: usize,
    mode: AttnMode,
}

/// How many requests at the end of a batch have exactly one query row
/// (`cu_seqlens_q [bs + 1]`).
fn one_token_tail(cu_seqlens_q: &[i32]) -> usize {
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
    let (hq, d, m) = (plan.num_q_heads, plan.head_dim, b.m);
    let table = match (&b.swa_pt, plan.is_swa) {
        (Some(t), true) => t,
        _ => &b.pt,
    };
    let page_table = Strided::new(
        "page_table",
        table.slice(req0 * m..(req0 + bs) * m),
        [bs, m],
        [m, 1],
    )?;
    let cache_seqlens = Strided::contiguous("cache_seqlens", b.cache.slice(req0..req0 + bs), [bs])?;
    let q = q.part(row0, rows, hq, d)?;
    let out = out.part_mut(row0, rows, hq, d)?;
    let kv = cache.views(plan, cx.page_size, cx.model_dtype)?;
    let sinks = sinks
        .map(|s| Strided::contiguous("sinks", s.slice(0..hq), [hq]))
        .transpose()?;
    // The one scale resolver (D8), as the CPU executor.
    let (bmm1, bmm2) = crate::executor::bmm_scales(plan, cx.q_scale);
    if mode == AttnMode::Extend {
        let mut args = ContextArgs {
            q,
            q_dtype: cx.model_dtype,
            out,
            kv,
            page_table,
            cache_seqlens,
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
            sinks,
        };
        let start = cx.span_start(from)?;
        cx.context.launch(&mut args, cx.errors)?;
        return cx.span_end(AttnPart::Context, start);
    }
    let layout = match mode {
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
    let mut args = DecodeArgs {
        q,
        q_dtype: cx.model_dtype,
        out,
        kv,
        page_table,
        cache_seqlens,
        layout,
        max_seq_len: cx.max_seq_len.max(1),
        bmm1_scale: bmm1,
        bmm2_scale: bmm2,
        window_left: plan.window_left,
        sinks,
        split: SplitMode::Auto,
        workspace: None,
    };
    let mut lp = cx.decode.plan(&args)?;
    // A launch Auto does not split fills the GPU: cut long requests into
    // chunks (length-aware, batch-independent) unless the workspace is short.
    if lp.params.max_splits == 1 && matches!(cx.decode_split, SplitMode::Chunked { .. }) {
        args.split = cx.decode_split;
        let chunked = cx.decode.plan(&args)?;
        if chunked.workspace_elems <= cx.workspace.len() {
            lp = chunked;
        } else {
            args.split = SplitMode::Auto;
        }
    }
    let elems = lp.workspace_elems;
    // The span covers the split-counter reset and the launch.
    let start = cx.span_start(from)?;
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
        let items = (p.bs as usize) * (p.num_kv_heads as usize) * (p.row_tiles as usize);
        let region = (elems - items, elems);
        if cx.foreign_workspace || *cx.ws_zero != Some(region) {
            cx.stream
                .memset_zeros(&mut cx.workspace.slice_mut(region.0..region.1))
                .map_err(kerr)?;
        }
        args.workspace = Some(StridedMut::contiguous(
            "workspace",
            cx.workspace.slice_mut(0..elems),
            [elems],
        )?);
        cx.decode.launch(&mut args, cx.errors)?;
        if !cx.foreign_workspace {
            *cx.ws_zero = Some(region);
        }
    } else {
        cx.decode.launch(&mut args, cx.errors)?;
    }
    cx.span_end(AttnPart::Decode, start)
}

/// K/V write of `n` tokens at `loc` into the layer's cache.
#[allow(clippy::too_many_arguments)]
fn run_write(
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

/// A captured graph. `CudaGraph` holds raw driver handles and is not
/// `Send`; the executor only touches it behind the backend's mutex.
struct SendGraph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are
// serialised (CUDA driver docs, "Graph object thread safety"); the executor
// owns the graph exclusively and every access goes through `&mut self` /
// `&self` of the executor, which the backend only reaches under its mutex.
unsafe impl Send for SendGraph {}

impl std::fmt::Debug for SendGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CudaGraph")
    }
}

/// A layer's static graph inputs and output, `[max_num_tokens, ..]`.
#[derive(Debug)]
struct LayerIo {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    out: CudaSlice<u16>,
}

/// CUDA-graph state (SEMANTICS.md §backend.4.1): one set of metadata buffers shared
/// by every bucket and mode (each replay rewrites what its layers read,
/// stream-ordered), static per-layer inputs / outputs, the captured graphs.
#[derive(Debug)]
struct GraphState {
    bufs: MetaBufs,
    io: Vec<LayerIo>,
    graphs: HashMap<GraphKey, SendGraph>,
    last: Option<GraphKey>,
}

/// What the eager buffers hold.
#[derive(Debug, Clone, Copy)]
struct Prepared {
    id: u64,
    generation: u64,
    shape: PassShape,
}

/// Host staging buffers for host tensors (grown on demand; eager only).
#[derive(Debug)]
struct Scratch {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    loc: CudaSlice<i64>,
}

/// The CUDA executor (see the module docs).
#[derive(Debug)]
pub struct CudaExecutor {
    gpu: Arc<Gpu>,
    ordinal: usize,
    plans: Vec<LayerPlan>,
    model_dtype: HalfDtype,
    page_size: usize,
    max_num_pages: usize,
    context_len: usize,
    /// Split of decode launches that fill the GPU ([`crate::DECODE_SPLIT_ENV`]).
    decode_split: SplitMode,
    /// `N` (spec.num_draft_tokens): the `max_q_len` of every ragged-verify
    /// launch, eager or graph, so both split the same way.
    ragged_max_q: usize,
    caches: Vec<DevCache>,
    sinks: Vec<Option<CudaSlice<f32>>>,
    kv_write: KvWriteKernel,
    meta_kernel: GraphMetadataKernel,
    decode: PagedAttentionKernel,
    context: ContextKernel,
    meta_errors: DeviceErrors,
    write_errors: DeviceErrors,
    attn_errors: DeviceErrors,
    workspace: CudaSlice<f32>,
    ws_zero: Option<(usize, usize)>,
    maps: Maps,
    eager: MetaBufs,
    prepared: Option<Prepared>,
    scratch: Scratch,
    graph: Option<GraphState>,
    /// Timing by part of eager launches ([`crate::part_timing`]), when installed.
    part_timer: Option<PartTimer>,
    /// Metadata outputs of engine passes ([`Executor::reserve_engine`]).
    engine: Option<MetaBufs>,
    /// Graphs captured over engine memory.
    engine_graphs: HashMap<GraphKey, SendGraph>,
}

impl CudaExecutor {
    /// Zeroed device caches for `plans`, the pool tables sized for `pools`,
    /// a zeroed workspace of `workspace_bytes`, every launcher loaded.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (PTX load, allocation).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Arc<Gpu>,
        model_dtype: HalfDtype,
        kv_dtype: KvCacheDtype,
        plans: &[LayerPlan],
        pools: &Pools,
        max_num_pages: usize,
        context_len: usize,
        ragged_max_q: Option<usize>,
        workspace_bytes: usize,
        decode_split: SplitMode,
    ) -> Result<Self> {
        let stream = gpu.stream().clone();
        let mut caches = Vec::with_capacity(plans.len());
        let mut sinks = Vec::with_capacity(plans.len());
        for p in plans {
            let n = p.slots * p.num_kv_heads * p.head_dim;
            caches.push(match kv_dtype {
                KvCacheDtype::Fp8E4m3 => DevCache::Fp8(zeros(&stream, n)?, zeros(&stream, n)?),
                _ => DevCache::Half(zeros(&stream, n)?, zeros(&stream, n)?),
            });
            sinks.push(
                p.sinks
                    .as_ref()
                    .map(|s| stream.clone_htod(s).map_err(kerr))
                    .transpose()?,
            );
        }
        let swa = pools.swa_mapping().is_some();
        Ok(Self {
            ordinal: gpu.context().ordinal(),
            plans: plans.to_vec(),
            model_dtype,
            page_size: pools.page_size(),
            max_num_pages,
            context_len,
            decode_split,
            ragged_max_q: ragged_max_q.unwrap_or(1),
            caches,
            sinks,
            kv_write: KvWriteKernel::new(gpu)?,
            meta_kernel: GraphMetadataKernel::new(gpu)?,
            decode: PagedAttentionKernel::new(gpu)?,
            context: ContextKernel::new(gpu)?,
            meta_errors: DeviceErrors::new(gpu)?,
            write_errors: DeviceErrors::new(gpu)?,
            attn_errors: DeviceErrors::new(gpu)?,
            workspace: zeros(&stream, workspace_bytes / 4)?,
            ws_zero: None,
            maps: Maps::new(gpu, &stream, pools)?,
            eager: MetaBufs::new(&stream, 1, 1, max_num_pages.max(1), swa)?,
            prepared: None,
            scratch: Scratch {
                q: zeros(&stream, 1)?,
                k: zeros(&stream, 1)?,
                v: zeros(&stream, 1)?,
                loc: zeros(&stream, 1)?,
            },
            graph: None,
            part_timer: None,
            engine: None,
            engine_graphs: HashMap::new(),
            gpu: gpu.clone(),
        })
    }

    /// The GPU this executor runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Device error events of the metadata launches (graph-metadata flags);
    /// not part of [`Executor::device_errors`] because the host metadata
    /// build already counts the eager ones. Synchronises.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver).
    pub fn metadata_device_errors(&self) -> Result<ErrorReport> {
        Ok(self.meta_errors.read()?)
    }
}

/// Uploads a host tensor into `scratch` (grown) or passes a device view.
fn stage<'a>(
    stream: &Arc<CudaStream>,
    t: TensorRef<'a>,
    scratch: &'a mut CudaSlice<u16>,
) -> Result<CudaView<'a, u16>> {
    match t {
        TensorRef::Host(h) => {
            ensure(stream, scratch, h.len())?;
            upload(stream, h, scratch)?;
            Ok(scratch.slice(0..h.len().max(1)))
        }
        TensorRef::Device(d) => Ok(d.slice(0..d.len())),
    }
}

fn ragged_lens(cu: &[i32]) -> Vec<i32> {
    cu.windows(2).map(|w| w[1] - w[0]).collect()
}

impl Executor for CudaExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cuda(self.ordinal)
    }

    fn reserve_engine(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        let fits = self
            .engine
            .as_ref()
            .is_some_and(|b| b.cap_bs >= max_bs && b.cap_tokens >= max_num_tokens);
        if fits {
            return Ok(());
        }
        let stream = self.gpu.stream().clone();
        // Engine graphs bake the old buffers' addresses in.
        stream.synchronize().map_err(kerr)?;
        self.engine_graphs.clear();
        let swa = self.eager.swa_pt.is_some();
        self.engine = Some(MetaBufs::new(
            &stream,
            max_bs.max(1),
            max_num_tokens.max(1),
            self.max_num_pages.max(1),
            swa,
        )?);
        Ok(())
    }

    fn engine_metadata(&mut self, batch: &EngineBatch<'_>, shape: &EngineShape) -> Result<()> {
        if shape.bs == 0 {
            return Ok(());
        }
        let bufs = engine_bufs(&mut self.engine, shape)?;
        launch_engine_metadata(
            &self.meta_kernel,
            batch,
            bufs,
            shape,
            self.page_size,
            &mut self.meta_errors,
        )
    }

    fn capture_engine_graph(
        &mut self,
        key: GraphKey,
        plans: &[LayerPlan],
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        layers: &mut [EngineLayer<'_>],
        save_kv: bool,
    ) -> Result<()> {
        engine_bufs(&mut self.engine, shape)?;
        let stream = self.gpu.stream().clone();
        self.engine_graphs.remove(&key);
        stream.synchronize().map_err(kerr)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(kerr)?;
        // Nothing runs during capture: the first split launch of the
        // recorded sequence zeroes its counters.
        self.ws_zero = None;
        let recorded = (|| -> Result<()> {
            self.engine_metadata(batch, shape)?;
            for (plan, io) in plans.iter().zip(layers.iter_mut()) {
                self.engine_forward(plan, shape, batch, io, save_kv)?;
            }
            Ok(())
        })();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        self.ws_zero = None;
        recorded?;
        let graph = ended
            .map_err(kerr)?
            .ok_or_else(|| BackendError::GraphUnsupported("capture produced no graph".into()))?;
        graph.upload().map_err(kerr)?;
        self.engine_graphs.insert(key, SendGraph(graph));
        Ok(())
    }

    fn replay_engine_graph(&mut self, key: GraphKey) -> Result<()> {
        let g = self.engine_graphs.get(&key).ok_or_else(|| {
            BackendError::GraphUnsupported(format!("no engine graph captured for {key:?}"))
        })?;
        g.0.launch().map_err(kerr)?;
        // The replay's split launches leave their own counter ranges zero.
        self.ws_zero = None;
        Ok(())
    }

    fn engine_forward(
        &mut self,
        plan: &LayerPlan,
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        io: &mut EngineLayer<'_>,
        save_kv: bool,
    ) -> Result<ErrorReport> {
        if shape.bs == 0 && shape.num_tokens == 0 {
            return Ok(ErrorReport::default());
        }
        let Self {
            gpu,
            kv_write,
            write_errors,
            decode,
            context,
            workspace,
            ws_zero,
            attn_errors,
            sinks,
            engine,
            model_dtype,
            page_size,
            context_len,
            decode_split,
            ..
        } = self;
        let bufs = engine_bufs(engine, shape)?;
        engine_layer(
            &mut EngineCx {
                stream: gpu.stream(),
                kv_write,
                write_errors,
                decode,
                context,
                workspace,
                ws_zero,
                attn_errors,
                model_dtype: *model_dtype,
                page_size: *page_size,
                context_len: *context_len,
                decode_split: *decode_split,
            },
            plan,
            sinks[plan.layer].as_ref(),
            bufs,
            shape,
            batch,
            io,
            save_kv,
        )?;
        Ok(ErrorReport::default())
    }

    fn write_kv(
        &mut self,
        plan: &LayerPlan,
        loc: KvLoc<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<ErrorReport> {
        let n = loc.slots.len();
        if n == 0 {
            return Ok(ErrorReport::default());
        }
        let Self {
            gpu,
            scratch,
            kv_write,
            write_errors,
            caches,
            eager,
            prepared,
            model_dtype,
            page_size,
            part_timer,
            ..
        } = self;
        let stream = gpu.stream();
        let use_prepared = loc.prepared && prepared.is_some_and(|p| p.shape.rows == n);
        if !use_prepared {
            ensure(stream, &mut scratch.loc, n)?;
            upload(stream, loc.slots, &mut scratch.loc)?;
        }
        let Scratch {
            k: sk,
            v: sv,
            loc: sloc,
            ..
        } = scratch;
        let kview = stage(stream, k, sk)?;
        let vview = stage(stream, v, sv)?;
        let locview = if use_prepared {
            match (&eager.swa_out, plan.is_swa) {
                (Some(s), true) => s.slice(0..n),
                _ => eager.out_loc.slice(0..n),
            }
        } else {
            sloc.slice(0..n)
        };
        // Timed after the staging copies: the span is the write kernel.
        let start = part_timer.as_mut().map(|t| t.mark(stream)).transpose()?;
        run_write(
            kv_write,
            plan,
            &mut caches[plan.layer],
            *model_dtype,
            *page_size,
            locview,
            kview,
            vview,
            n,
            write_errors,
        )?;
        if let (Some(t), Some(a)) = (part_timer.as_mut(), start) {
            t.close(AttnPart::KvWrite, a, stream)?;
        }
        Ok(ErrorReport::default())
    }

    fn prepare_metadata(&mut self, meta: &ForwardMetadata, pools: &Pools) -> Result<()> {
        if self
            .prepared
            .is_some_and(|p| p.id == meta.id.0 && p.generation == pools.generation())
        {
            return Ok(());
        }
        let stream = self.gpu.stream().clone();
        self.maps.sync(&stream, pools)?;
        let bs = meta.batch_size;
        let n = meta.num_tokens;
        if self.eager.cap_bs < bs || self.eager.cap_tokens < n {
            let swa = self.eager.swa_pt.is_some();
            self.eager = MetaBufs::new(
                &stream,
                bs.max(self.eager.cap_bs),
                n.max(self.eager.cap_tokens),
                self.eager.m,
                swa,
            )?;
        }
        let max_q = if meta.mode == AttnMode::RaggedVerify {
            meta.max_seq_len_q.max(self.ragged_max_q)
        } else {
            meta.max_seq_len_q
        };
        let (gmode, write_cu_q) = meta_mode(meta.mode, max_q)?;
        let qlens = (meta.mode == AttnMode::RaggedVerify).then(|| ragged_lens(&meta.cu_seqlens_q));
        MetaInputs {
            req_pool_indices: &meta.req_pool_indices,
            seq_lens: &meta.seq_lens,
            out_cache_loc: &meta.source_out_cache_loc,
            qlens: qlens.as_deref(),
            cu_q: (!write_cu_q).then_some(&meta.cu_seqlens_q[..]),
        }
        .upload(&stream, &mut self.eager)?;
        launch_metadata(
            &self.meta_kernel,
            &self.maps,
            &mut self.eager,
            gmode,
            write_cu_q,
            bs,
            n,
            self.page_size,
            &mut self.meta_errors,
        )?;
        self.prepared = Some(Prepared {
            id: meta.id.0,
            generation: pools.generation(),
            shape: PassShape {
                mode: meta.mode,
                bs,
                rows: n,
                max_q,
                decode_tail: one_token_tail(&meta.cu_seqlens_q),
            },
        });
        Ok(())
    }

    fn attention(
        &mut self,
        plan: &LayerPlan,
        meta: &ForwardMetadata,
        page_size: usize,
        q: TensorRef<'_>,
    ) -> Result<(Tensor, ErrorReport)> {
        let _ = page_size;
        let rows = meta.num_tokens;
        let elems = rows * plan.num_q_heads * plan.head_dim;
        if rows == 0 || meta.batch_size == 0 {
            return Ok((Tensor::Host(vec![0; elems]), ErrorReport::default()));
        }
        let prepared = self
            .prepared
            .filter(|p| p.id == meta.id.0)
            .ok_or_else(|| BackendError::Metadata("metadata not prepared on the device".into()))?;
        let Self {
            gpu,
            scratch,
            decode,
            context,
            workspace,
            ws_zero,
            attn_errors,
            caches,
            sinks,
            eager,
            model_dtype,
            page_size,
            context_len,
            decode_split,
            part_timer,
            ..
        } = self;
        let stream = gpu.stream();
        if let Some(t) = part_timer.as_mut() {
            // The context kernel's causal FLOPs: the requests before the
            // one-token tail (which goes to the decode kernel).
            let shape = prepared.shape;
            if shape.mode == AttnMode::Extend {
                let head = shape.bs - shape.tail();
                let pairs = ragged_causal_pairs(
                    meta.cu_seqlens_q.get(..=head).unwrap_or(&[]),
                    meta.cache_seqlens.get(..head).unwrap_or(&[]),
                    plan.window_left,
                );
                t.add_context_flops(attention_flops(plan.num_q_heads, plan.head_dim, pairs));
            }
        }
        let qview = stage(stream, q, &mut scratch.q)?;
        let mut out = zeros::<u16>(stream, elems)?;
        let mut cx = AttnCx {
            stream,
            decode,
            context,
            workspace: workspace.as_view_mut(),
            ws_zero,
            errors: attn_errors,
            model_dtype: *model_dtype,
            page_size: *page_size,
            max_seq_len: *context_len,
            decode_split: *decode_split,
            timer: part_timer.as_mut(),
            q_scale: 1.0,
            foreign_workspace: false,
        };
        let (hq, d) = (plan.num_q_heads, plan.head_dim);
        run_attention(
            &mut cx,
            plan,
            KvSrc::Own(&caches[plan.layer]),
            sinks[plan.layer].as_ref(),
            &Tables::of(eager, None),
            prepared.shape,
            Rows::contiguous(qview, hq, d),
            Rows::contiguous_mut(out.slice_mut(0..elems), hq, d),
        )?;
        Ok((Tensor::Device(out), ErrorReport::default()))
    }

    fn read_kv(&self, plan: &LayerPlan) -> Result<KvSnapshot> {
        let s = self.gpu.stream();
        Ok(match &self.caches[plan.layer] {
            DevCache::Half(k, v) => KvSnapshot::Half {
                k: s.clone_dtoh(k).map_err(kerr)?,
                v: s.clone_dtoh(v).map_err(kerr)?,
            },
            DevCache::Fp8(k, v) => KvSnapshot::Fp8 {
                k: s.clone_dtoh(k).map_err(kerr)?,
                v: s.clone_dtoh(v).map_err(kerr)?,
            },
        })
    }

    fn read_metadata(&self, graph: bool) -> Result<Option<DeviceMetadata>> {
        let s = self.gpu.stream();
        if graph {
            match &self.graph {
                Some(GraphState {
                    bufs,
                    last: Some(k),
                    ..
                }) => Ok(Some(bufs.read(s, k.bs, k.num_tokens)?)),
                _ => Ok(None),
            }
        } else {
            match &self.prepared {
                Some(p) => Ok(Some(self.eager.read(s, p.shape.bs, p.shape.rows)?)),
                None => Ok(None),
            }
        }
    }

    fn device_errors(&self) -> Result<ErrorReport> {
        // K/V writes, attention, and the req_to_token update (page-table's
        // BAD_ENTRY: a backend bug if ever counted).
        let mut total = ErrorReport::default();
        for e in [
            &self.write_errors,
            &self.attn_errors,
            &self.maps.scatter_errors,
        ] {
            total.merge(e.read()?);
        }
        Ok(total)
    }

    fn set_part_timer(&mut self, timer: Option<PartTimer>) -> Result<Option<PartTimer>> {
        if timer
            .as_ref()
            .is_some_and(|t| !t.same_context(self.gpu.context()))
        {
            return Err(kerr(KernelError::unsupported(
                "part timer",
                format!(
                    "created for another device than this executor's cuda:{}",
                    self.ordinal
                ),
            )));
        }
        Ok(std::mem::replace(&mut self.part_timer, timer))
    }

    fn init_graph_state(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        if max_bs == 0 || max_num_tokens == 0 {
            return Err(BackendError::GraphUnsupported(
                "init_cuda_graph_state needs max_bs ≥ 1 and max_num_tokens ≥ 1".into(),
            ));
        }
        let stream = self.gpu.stream().clone();
        stream.synchronize().map_err(kerr)?;
        // Drop the old graphs before their buffers.
        self.graph = None;
        let swa = self.eager.swa_pt.is_some();
        let bufs = MetaBufs::new(
            &stream,
            max_bs,
            max_num_tokens,
            self.max_num_pages.max(1),
            swa,
        )?;
        let mut io = Vec::with_capacity(self.plans.len());
        for p in &self.plans {
            io.push(LayerIo {
                q: zeros(&stream, max_num_tokens * p.q_row_elems())?,
                k: zeros(&stream, max_num_tokens * p.kv_row_elems())?,
                v: zeros(&stream, max_num_tokens * p.kv_row_elems())?,
                out: zeros(&stream, max_num_tokens * p.q_row_elems())?,
            });
        }
        self.graph = Some(GraphState {
            bufs,
            io,
            graphs: HashMap::new(),
            last: None,
        });
        Ok(())
    }

    fn capture_graph(&mut self, key: GraphKey, pools: &Pools) -> Result<()> {
        let stream = self.gpu.stream().clone();
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        if key.bs > g.bufs.cap_bs || key.num_tokens > g.bufs.cap_tokens {
            return Err(BackendError::GraphUnsupported(format!(
                "bucket bs {} / {} tokens exceeds the graph state ({} / {})",
                key.bs, key.num_tokens, g.bufs.cap_bs, g.bufs.cap_tokens
            )));
        }
        g.graphs.remove(&key);
        // Valid inputs for the capture (their values are not recorded):
        // padding rows only (row 0, seq_len 1, slot 0).
        let empty = ForwardBatch {
            batch_size: 0,
            ..ForwardBatch::idle()
        };
        let padded = pad_for(&empty, key)?;
        self.maps.sync(&stream, pools)?;
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        graph_inputs(&padded).upload(&stream, &mut g.bufs)?;
        let mode = key.graph_mode();
        let ragged = key.kind == GraphKind::RaggedVerify;
        if ragged {
            // SEMANTICS.md §backend.5: written eagerly, outside the graph.
            launch_metadata(
                &self.meta_kernel,
                &self.maps,
                &mut g.bufs,
                mode,
                true,
                key.bs,
                key.num_tokens,
                self.page_size,
                &mut self.meta_errors,
            )?;
        }
        stream.synchronize().map_err(kerr)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(kerr)?;
        // Nothing runs during capture: the counters' state at replay start is
        // unknown to the recorded sequence, so its first split launch zeroes them.
        self.ws_zero = None;
        let recorded = self.record_step(key);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        self.ws_zero = None;
        recorded?;
        let graph = ended
            .map_err(kerr)?
            .ok_or_else(|| BackendError::GraphUnsupported("capture produced no graph".into()))?;
        graph.upload().map_err(kerr)?;
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        g.graphs.insert(key, SendGraph(graph));
        Ok(())
    }

    fn graph_keys(&self) -> Vec<GraphKey> {
        self.graph
            .as_ref()
            .map(|g| g.graphs.keys().copied().collect())
            .unwrap_or_default()
    }

    fn replay_graph(&mut self, key: GraphKey, padded: &ForwardBatch, pools: &Pools) -> Result<()> {
        let stream = self.gpu.stream().clone();
        if !self
            .graph
            .as_ref()
            .is_some_and(|g| g.graphs.contains_key(&key))
        {
            return Err(BackendError::GraphUnsupported(format!(
                "no graph captured for {key:?}"
            )));
        }
        if padded.batch_size != key.bs || padded.out_cache_loc.len() != key.num_tokens {
            return Err(BackendError::GraphUnsupported(format!(
                "batch of {} rows / {} tokens is not padded to {key:?}",
                padded.batch_size,
                padded.out_cache_loc.len()
            )));
        }
        self.maps.sync(&stream, pools)?;
        let Some(g) = self.graph.as_mut() else {
            return Err(no_graph_state());
        };
        graph_inputs(padded).upload(&stream, &mut g.bufs)?;
        if key.kind == GraphKind::RaggedVerify {
            launch_metadata(
                &self.meta_kernel,
                &self.maps,
                &mut g.bufs,
                key.graph_mode(),
                true,
                key.bs,
                key.num_tokens,
                self.page_size,
                &mut self.meta_errors,
            )?;
        }
        let graph = g.graphs.get(&key).ok_or_else(no_graph_state)?;
        graph.0.launch().map_err(kerr)?;
        g.last = Some(key);
        // The replay's split launches leave their own counter ranges zero,
        // not necessarily the one the eager path saw last.
        self.ws_zero = None;
        Ok(())
    }

    fn write_graph_inputs(
        &mut self,
        plan: &LayerPlan,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()> {
        let stream = self.gpu.stream().clone();
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        let io = g.io.get_mut(plan.layer).ok_or(BackendError::UnknownLayer {
            layer: plan.layer,
            num_layers: self.plans.len(),
        })?;
        for (t, dst) in [(q, &mut io.q), (k, &mut io.k), (v, &mut io.v)] {
            if t.len() > dst.len() {
                return Err(kerr(KernelError::Capacity {
                    arg: "graph input",
                    needed: t.len(),
                    available: dst.len(),
                }));
            }
            match t {
                TensorRef::Host(h) => upload(&stream, h, dst)?,
                TensorRef::Device(d) => {
                    if !d.is_empty() {
                        stream
                            .memcpy_dtod(d, &mut dst.slice_mut(0..d.len()))
                            .map_err(kerr)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn read_graph_output(&self, plan: &LayerPlan, rows: usize) -> Result<Vec<u16>> {
        let g = self.graph.as_ref().ok_or_else(no_graph_state)?;
        let io = g.io.get(plan.layer).ok_or(BackendError::UnknownLayer {
            layer: plan.layer,
            num_layers: self.plans.len(),
        })?;
        let n = rows * plan.q_row_elems();
        if n > io.out.len() {
            return Err(kerr(KernelError::Capacity {
                arg: "rows",
                needed: n,
                available: io.out.len(),
            }));
        }
        read(self.gpu.stream(), &io.out, n)
    }

    fn copy_graph_output(
        &self,
        plan: &LayerPlan,
        row0: usize,
        rows: usize,
        dst: &mut CudaViewMut<'_, u16>,
    ) -> Result<()> {
        let g = self.graph.as_ref().ok_or_else(no_graph_state)?;
        let io = g.io.get(plan.layer).ok_or(BackendError::UnknownLayer {
            layer: plan.layer,
            num_layers: self.plans.len(),
        })?;
        let e = plan.q_row_elems();
        let (a, b) = (row0 * e, (row0 + rows) * e);
        if b > io.out.len() || b - a > dst.len() {
            return Err(kerr(KernelError::Capacity {
                arg: "rows",
                needed: b.max(b - a),
                available: io.out.len().min(dst.len()),
            }));
        }
        if a == b {
            return Ok(());
        }
        self.gpu
            .stream()
            .memcpy_dtod(&io.out.slice(a..b), &mut dst.slice_mut(0..b - a))
            .map_err(kerr)
    }
}

fn no_graph_state() -> BackendError {
    BackendError::GraphUnsupported("no CUDA-graph state: call init_cuda_graph_state first".into())
}

/// The reserved engine metadata buffers, if they hold `shape`.
fn engine_bufs<'a>(
    engine: &'a mut Option<MetaBufs>,
    shape: &EngineShape,
) -> Result<&'a mut MetaBufs> {
    let b = engine.as_mut().ok_or_else(|| {
        crate::error::batch_err(
            "batch_size",
            "engine passes on the CUDA executor need reserve_engine_metadata first (no allocation inside a pass)",
        )
    })?;
    if b.cap_bs < shape.bs || b.cap_tokens < shape.num_tokens {
        return Err(crate::error::batch_err(
            "batch_size",
            format!(
                "{} requests / {} tokens exceed the reserved engine metadata ({} / {}): call reserve_engine_metadata",
                shape.bs, shape.num_tokens, b.cap_bs, b.cap_tokens
            ),
        ));
    }
    Ok(b)
}

/// The fused metadata launch of an engine pass, from the engine's views.
fn launch_engine_metadata(
    kernel: &GraphMetadataKernel,
    batch: &EngineBatch<'_>,
    bufs: &mut MetaBufs,
    shape: &EngineShape,
    page_size: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    let (gmode, write_cu_q) = meta_mode(shape.mode, shape.max_q)?;
    let ragged = shape.mode == AttnMode::RaggedVerify;
    let input = MetaIn {
        rpi: batch.req_pool_indices.strided()?,
        seq: batch.seq_lens.strided()?,
        out_loc: batch.out_cache_loc.strided()?,
        qlens: match (&batch.verify_lens, ragged) {
            (Some(v), true) => Some(v.strided()?),
            _ => None,
        },
        r2t: batch.req_to_token.strided()?,
        pool_slots: None,
        swa_map: batch
            .swa
            .as_ref()
            .map(|m| m.full_to_swa.strided())
            .transpose()?,
        page_map: match batch.swa.as_ref().and_then(|m| m.page_map.as_ref()) {
            Some(pm) => Some(pm.strided()?),
            None => None,
        },
    };
    launch_metadata_on(
        kernel,
        input,
        MetaOut::of(bufs),
        gmode,
        write_cu_q,
        shape.bs,
        shape.num_tokens,
        page_size,
        errors,
    )
}

/// The launchers and state one engine layer needs.
struct EngineCx<'a> {
    stream: &'a Arc<CudaStream>,
    kv_write: &'a KvWriteKernel,
    write_errors: &'a mut DeviceErrors,
    decode: &'a PagedAttentionKernel,
    context: &'a ContextKernel,
    workspace: &'a mut CudaSlice<f32>,
    ws_zero: &'a mut Option<(usize, usize)>,
    attn_errors: &'a mut DeviceErrors,
    model_dtype: HalfDtype,
    page_size: usize,
    context_len: usize,
    decode_split: SplitMode,
}

/// One engine layer: the paged K/V write into the engine's caches (at the
/// engine's `out_cache_loc`, or the SWA slots the metadata launch wrote),
/// then attention from the engine's `q` into its `out`.
#[allow(clippy::too_many_arguments)]
fn engine_layer(
    cx: &mut EngineCx<'_>,
    plan: &LayerPlan,
    sinks: Option<&CudaSlice<f32>>,
    bufs: &MetaBufs,
    shape: &EngineShape,
    batch: &EngineBatch<'_>,
    io: &mut EngineLayer<'_>,
    save_kv: bool,
) -> Result<()> {
    let n = shape.num_tokens;
    let (hq, d) = (plan.num_q_heads, plan.head_dim);
    if let (true, Some(k), Some(v), true) = (save_kv, &io.k, &io.v, n > 0) {
        let cache_loc = match (&bufs.swa_out, plan.is_swa) {
            (Some(s), true) => Strided::contiguous("cache_loc", s.slice(0..n), [n])?,
            _ => batch.out_cache_loc.strided()?,
        };
        let (k, v) = (k.strided()?, v.strided()?);
        match &mut io.kv_cache {
            crate::engine::EngineKvCache::Half { k: kc, v: vc } => {
                let mut args = fp8_kv::PagedKvWriteArgs {
                    k,
                    v,
                    cache_loc,
                    k_cache: kc.strided_mut()?,
                    v_cache: vc.strided_mut()?,
                };
                cx.kv_write
                    .set_kv_buffer_paged(&mut args, cx.write_errors)?;
            }
            crate::engine::EngineKvCache::E4m3 { k: kc, v: vc } => {
                let mut args = fp8_kv::PagedKvWriteArgs {
                    k,
                    v,
                    cache_loc,
                    k_cache: kc.strided_mut()?,
                    v_cache: vc.strided_mut()?,
                };
                let dtype = match cx.model_dtype {
                    HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                    HalfDtype::F16 => fp8_kv::KvDtype::F16,
                };
                cx.kv_write.fused_fp8_set_kv_buffer_paged(
                    &mut args,
                    dtype,
                    &plan.scales,
                    cx.write_errors,
                )?;
            }
        }
    }
    if shape.bs == 0 || n == 0 {
        return Ok(());
    }
    let cu_q = match (&batch.cu_seqlens_q, shape.mode) {
        (Some(c), AttnMode::Extend) => Some(c.device_view()?),
        _ => None,
    };
    let tables = Tables::of(bufs, cu_q);
    let q = Rows {
        view: io.q.device_view()?,
        strides: io.q.strides(),
    };
    let out_strides = io.out.strides();
    let out = Rows {
        view: io.out.device_view_mut()?,
        strides: out_strides,
    };
    let (workspace, foreign) = match io.workspace.as_mut() {
        Some(w) => (w.device_view_mut()?, true),
        None => (cx.workspace.as_view_mut(), false),
    };
    let mut acx = AttnCx {
        stream: cx.stream,
        decode: cx.decode,
        context: cx.context,
        workspace,
        ws_zero: cx.ws_zero,
        errors: cx.attn_errors,
        model_dtype: cx.model_dtype,
        page_size: cx.page_size,
        max_seq_len: cx.context_len,
        decode_split: cx.decode_split,
        timer: None,
        q_scale: io.q_scale,
        foreign_workspace: foreign,
    };
    let kv = KvSrc::Engine(&io.kv_cache);
    let pass = PassShape {
        mode: shape.mode,
        bs: shape.bs,
        rows: n,
        max_q: shape.max_q,
        decode_tail: shape.decode_tail,
    };
    let _ = (hq, d);
    run_attention(&mut acx, plan, kv, sinks, &tables, pass, q, out)
}

/// `batch` padded to the bucket `key` (D3; ragged lengths per SEMANTICS.md §backend.5).
pub(crate) fn pad_for(batch: &ForwardBatch, key: GraphKey) -> Result<ForwardBatch> {
    let mut b = batch.clone();
    if key.kind == GraphKind::RaggedVerify && b.verify_lens().is_none() {
        b.spec_info = Some(crate::SpecInfo::Verify {
            verify_lens: Some(Vec::new()),
        });
    }
    b.pad_to_bucket(key.bs, key.num_tokens, key.q_len as u32)
}

/// The device inputs of a padded graph batch.
fn graph_inputs(padded: &ForwardBatch) -> MetaInputs<'_> {
    MetaInputs {
        req_pool_indices: &padded.req_pool_indices,
        seq_lens: &padded.seq_lens,
        out_cache_loc: &padded.out_cache_loc,
        qlens: padded.verify_lens(),
        cu_q: None,
    }
}

impl CudaExecutor {
    /// Records one whole step of bucket `key` on the (capturing) stream:
    /// the fused metadata launch (not for ragged verify), then per layer the
    /// K/V write from the static inputs and attention into the static output.
    fn record_step(&mut self, key: GraphKey) -> Result<()> {
        let Self {
            gpu,
            plans,
            caches,
            sinks,
            kv_write,
            meta_kernel,
            decode,
            context,
            meta_errors,
            write_errors,
            attn_errors,
            workspace,
            ws_zero,
            maps,
            graph,
            model_dtype,
            page_size,
            context_len,
            decode_split,
            ..
        } = self;
        let stream = gpu.stream();
        let g = graph.as_mut().ok_or_else(no_graph_state)?;
        if key.kind != GraphKind::RaggedVerify {
            launch_metadata(
                meta_kernel,
                maps,
                &mut g.bufs,
                key.graph_mode(),
                true,
                key.bs,
                key.num_tokens,
                *page_size,
                meta_errors,
            )?;
        }
        let shape = PassShape {
            mode: key.attn_mode(),
            bs: key.bs,
            rows: key.num_tokens,
            max_q: key.q_len,
            decode_tail: 0,
        };
        let n = key.num_tokens;
        for (l, plan) in plans.iter().enumerate() {
            let io = &mut g.io[l];
            let loc = match (&g.bufs.swa_out, plan.is_swa) {
                (Some(s), true) => s.slice(0..n.max(1)),
                _ => g.bufs.out_loc.slice(0..n.max(1)),
            };
            run_write(
                kv_write,
                plan,
                &mut caches[l],
                *model_dtype,
                *page_size,
                loc,
                io.k.slice(0..io.k.len()),
                io.v.slice(0..io.v.len()),
                n,
                write_errors,
            )?;
            let mut cx = AttnCx {
                stream,
                decode,
                context,
                workspace: workspace.as_view_mut(),
                ws_zero,
                errors: attn_errors,
                model_dtype: *model_dtype,
                page_size: *page_size,
                max_seq_len: *context_len,
                decode_split: *decode_split,
                // Never inside a capture (see crate::part_timing).
                timer: None,
                q_scale: 1.0,
                foreign_workspace: false,
            };
            let out_len = io.out.len();
            let (hq, d) = (plan.num_q_heads, plan.head_dim);
            run_attention(
                &mut cx,
                plan,
                KvSrc::Own(&caches[l]),
                sinks[l].as_ref(),
                &Tables::of(&g.bufs, None),
                shape,
                Rows::contiguous(io.q.slice(0..io.q.len()), hq, d),
                Rows::contiguous_mut(io.out.slice_mut(0..out_len), hq, d),
            )?;
        }
        Ok(())
    }
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

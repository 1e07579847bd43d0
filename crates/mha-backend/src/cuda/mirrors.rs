//! Device mirrors: the K/V caches (`DevCache`), the device pool tables
//! (`Maps`: `req_to_token` and the SWA maps, kept current from pinned
//! staging buffers), and the allocation / upload / read helpers.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use kernel_rt::{DeviceErrors, Gpu, KernelError, Strided, StridedMut};

use crate::error::Result;
use crate::executor::TensorRef;
use crate::pools::Pools;

use super::kerr;

pub(super) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    stream.alloc_zeros::<T>(n.max(1)).map_err(kerr)
}

/// Grows `buf` to at least `n` elements (new contents zero).
pub(super) fn ensure<T: DeviceRepr + ValidAsZeroBits>(
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
pub(super) fn upload<T: DeviceRepr>(
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

pub(super) fn read<T: DeviceRepr + Default + Clone>(
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
pub(super) enum DevCache {
    Half(CudaSlice<u16>, CudaSlice<u16>),
    Fp8(CudaSlice<u8>, CudaSlice<u8>),
}

/// Device copies of the pool tables, allocated once at their full size (a
/// graph bakes their addresses in).
#[derive(Debug)]
pub(super) struct Maps {
    /// Pools generation last uploaded (`None` = never).
    generation: Option<u64>,
    pub(super) r2t: CudaSlice<i32>,
    pub(super) rows: usize,
    pub(super) width: usize,
    pub(super) pool_slots: usize,
    pub(super) swa_map: Option<CudaSlice<i64>>,
    pub(super) swa_map_len: usize,
    pub(super) page_map: Option<CudaSlice<i32>>,
    pub(super) page_map_len: usize,
    /// Applies changed `req_to_token` entries to `r2t` on the device.
    scatter: page_table::ScatterKernel,
    /// Device error word of the scatter (out-of-range entries: a bug).
    pub(super) scatter_errors: DeviceErrors,
    /// `[n, 2]` i64 `(position, slot)` entries on the device.
    pub(super) entries: CudaSlice<i64>,
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
    pub(super) fn new(gpu: &Arc<Gpu>, stream: &Arc<CudaStream>, pools: &Pools) -> Result<Self> {
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
    pub(super) fn sync(&mut self, stream: &Arc<CudaStream>, pools: &Pools) -> Result<()> {
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

/// Uploads a host tensor into `scratch` (grown) or passes a device view.
pub(super) fn stage<'a>(
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

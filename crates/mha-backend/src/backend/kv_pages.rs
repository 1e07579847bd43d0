//! KV page descriptors: what a KV-transfer library (disaggregated prefill,
//! KV offload) needs to register a layer's paged cache and move pages, and
//! an export / import of whole pages between two backends' pools.
//!
//! The backend's own caches are slot-major, `[slots, Hkv, D]` per layer for
//! K and for V, so page `p` (slots `p·P .. (p+1)·P`) is one contiguous run
//! of `P · Hkv · D` elements in each: [`KvLayout::Nhd`] pages with a page
//! stride of `P · Hkv · D · elem_bytes` bytes. Page 0 is the pool's padding
//! page (graph padding rows write there); it is described and may be moved
//! like any other.

use fp8_kv::KvCacheDtype;

use super::MhaBackend;
use crate::engine::KvLayout;
use crate::error::{batch_err, BackendError, Result};
use crate::executor::KvSnapshot;

/// Where a cache lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLocation {
    /// Host memory of this process (the CPU executor).
    Host,
    /// Device memory of CUDA device `ordinal`.
    Device {
        /// CUDA device ordinal.
        ordinal: usize,
    },
}

/// The format of a layer's pages: two caches whose pages have the same
/// format hold interchangeable bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvPageFormat {
    /// `P`, tokens per page.
    pub page_size: usize,
    /// `Hkv`.
    pub num_kv_heads: usize,
    /// `D`.
    pub head_dim: usize,
    /// Element order inside a page.
    pub layout: KvLayout,
    /// Cache dtype (bf16 / f16: 2 bytes; e4m3: 1 byte).
    pub dtype: KvCacheDtype,
    /// Resolved K scale (1.0 for 16-bit caches; D8).
    pub k_scale: f32,
    /// Resolved V scale.
    pub v_scale: f32,
}

impl KvPageFormat {
    /// Bytes of one cache element.
    pub fn elem_bytes(&self) -> usize {
        match self.dtype {
            KvCacheDtype::Fp8E4m3 => 1,
            _ => 2,
        }
    }

    /// Elements of one page of K (or V): `P · Hkv · D`.
    pub fn page_elems(&self) -> usize {
        self.page_size * self.num_kv_heads * self.head_dim
    }

    /// Bytes of one page of K (or V).
    pub fn page_bytes(&self) -> usize {
        self.page_elems() * self.elem_bytes()
    }
}

/// One layer's paged K and V caches as a transfer library registers them:
/// page `p` of K is the `format.page_bytes()` bytes at
/// `k_base + p · page_stride_bytes` (V likewise from `v_base`).
///
/// The addresses are valid while the backend that described them lives and
/// does not reallocate its caches (it never does after construction).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvPageDescriptor {
    /// Layer id.
    pub layer: usize,
    /// Where both caches live.
    pub location: KvLocation,
    /// Address of page 0 of K (host pointer or CUDA device pointer).
    pub k_base: u64,
    /// Address of page 0 of V.
    pub v_base: u64,
    /// Bytes from one page to the next, in both caches.
    pub page_stride_bytes: u64,
    /// Pages in each cache (the padding page 0 included).
    pub num_pages: usize,
    /// The pages' format.
    pub format: KvPageFormat,
}

impl KvPageDescriptor {
    /// `(address, bytes)` of page `page` of K (`v = false`) or V.
    ///
    /// # Errors
    /// [`BackendError::Batch`] naming `pages` when `page ≥ num_pages`.
    pub fn page_range(&self, page: usize, v: bool) -> Result<(u64, u64)> {
        check_pages(&[page], self.num_pages)?;
        let base = if v { self.v_base } else { self.k_base };
        Ok((
            base + page as u64 * self.page_stride_bytes,
            self.format.page_bytes() as u64,
        ))
    }
}

/// Whole pages exported from one layer ([`MhaBackend::export_kv_pages`]):
/// page `i` of the data is the `i`-th page asked for, K and V each
/// `pages · P · Hkv · D` elements.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPages {
    /// The format of the pages (an import checks it equals its own).
    pub format: KvPageFormat,
    /// Pages held.
    pub pages: usize,
    /// K and V elements, page after page.
    pub data: KvSnapshot,
}

fn check_pages(pages: &[usize], num_pages: usize) -> Result<()> {
    match pages.iter().find(|&&p| p >= num_pages) {
        Some(p) => Err(batch_err(
            "pages",
            format!("page {p} is outside the layer's pool of {num_pages} pages"),
        )),
        None => Ok(()),
    }
}

impl MhaBackend {
    /// Layer `layer`'s page format and page count.
    fn page_format(&self, layer: usize) -> Result<(KvPageFormat, usize)> {
        let core = self.core();
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        let page_size = core.config.page_size;
        let format = KvPageFormat {
            page_size,
            num_kv_heads: plan.num_kv_heads,
            head_dim: plan.head_dim,
            layout: KvLayout::Nhd,
            dtype: plan.scales.cache_dtype(),
            k_scale: plan.scales.k_scale(),
            v_scale: plan.scales.v_scale(),
        };
        Ok((format, plan.slots / page_size))
    }

    /// The descriptor of layer `layer`'s K/V pages (module docs).
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; executor errors.
    pub fn kv_page_descriptor(&self, layer: usize) -> Result<KvPageDescriptor> {
        let (format, num_pages) = self.page_format(layer)?;
        let core = self.core();
        let (location, k_base, v_base) = core.executor.kv_bases(&core.plans[layer])?;
        Ok(KvPageDescriptor {
            layer,
            location,
            k_base,
            v_base,
            page_stride_bytes: format.page_bytes() as u64,
            num_pages,
            format,
        })
    }

    /// Copies pages `pages` (in that order, repeats allowed) of layer
    /// `layer` out of the cache.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::Batch`] naming `pages`
    /// for a page outside the pool; executor (driver) errors.
    pub fn export_kv_pages(&self, layer: usize, pages: &[usize]) -> Result<KvPages> {
        let (format, num_pages) = self.page_format(layer)?;
        check_pages(pages, num_pages)?;
        let core = self.core();
        let data = core
            .executor
            .read_kv_pages(&core.plans[layer], format.page_elems(), pages)?;
        Ok(KvPages {
            format,
            pages: pages.len(),
            data,
        })
    }

    /// Writes `data`'s pages into pages `pages` of layer `layer` (page `i`
    /// of `data` into `pages[i]`), as a transfer into this pool would. On
    /// error nothing is written.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::Batch`] naming
    /// `pages` for a page outside the pool, a repeated destination page or a
    /// count other than `data.pages`, naming `format` when `data`'s format
    /// (page size, heads, head dim, layout, dtype, scales) is not this
    /// layer's; executor (driver) errors.
    pub fn import_kv_pages(&mut self, layer: usize, pages: &[usize], data: &KvPages) -> Result<()> {
        let (format, num_pages) = self.page_format(layer)?;
        if data.format != format {
            return Err(batch_err(
                "format",
                format!(
                    "pages of format {:?} cannot go into layer {layer} of format {format:?}",
                    data.format
                ),
            ));
        }
        if pages.len() != data.pages {
            return Err(batch_err(
                "pages",
                format!("{} destination pages for {} pages", pages.len(), data.pages),
            ));
        }
        check_pages(pages, num_pages)?;
        let mut seen = std::collections::HashSet::new();
        if let Some(p) = pages.iter().find(|&&p| !seen.insert(p)) {
            return Err(batch_err(
                "pages",
                format!("destination page {p} is given twice"),
            ));
        }
        let want = pages.len() * format.page_elems();
        let have = match &data.data {
            KvSnapshot::Half { k, v } => (k.len(), v.len()),
            KvSnapshot::Fp8 { k, v } => (k.len(), v.len()),
        };
        if have != (want, want) {
            return Err(batch_err(
                "pages",
                format!(
                    "{have:?} K/V elements for {} pages of {} elements",
                    pages.len(),
                    format.page_elems()
                ),
            ));
        }
        let mut core = self.core();
        let core = &mut *core;
        core.executor
            .write_kv_pages(&core.plans[layer], format.page_elems(), pages, &data.data)
    }
}

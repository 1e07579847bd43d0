//! Host side of the hybrid full / SWA pool (SEMANTICS.md §swa-pool.1, §swa-pool.2, §swa-pool.5): the
//! full→SWA slot map with page-granular allocation, freeing and eviction, and
//! the layer routing table.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::{Gpu, KernelError};

/// Errors of the host-side SWA pool. Every operation checks its whole input
/// before changing anything: on error the map and the free list are unchanged.
#[derive(Debug, thiserror::Error)]
pub enum SwaError {
    /// Sizes that do not describe a paged pool.
    #[error("invalid SWA pool configuration: {0}")]
    Config(String),
    /// Not enough free SWA pages: nothing was allocated (never an overwrite).
    #[error("SWA pool exhausted: {needed} page(s) needed, {free} free")]
    Exhausted {
        /// SWA pages the call needed.
        needed: usize,
        /// SWA pages free.
        free: usize,
    },
    /// A full slot outside `[0, size + P)`.
    #[error("full slot {slot} outside the full pool's slots [0, {slots})")]
    SlotOutOfRange {
        /// The offending slot.
        slot: i64,
        /// `size + P`.
        slots: usize,
    },
    /// A full page outside `[1, size / P]` (page 0 is the full pool's dummy
    /// page and never allocated).
    #[error("full page {page} is not an allocatable page of the full pool [1, {last}]")]
    PageOutOfRange {
        /// The offending page.
        page: usize,
        /// `size / P`.
        last: usize,
    },
    /// Mapping a full page that already has an SWA page (it would be overwritten).
    #[error("full page {page} already maps to SWA page {swa_page}")]
    AlreadyMapped {
        /// Full page.
        page: usize,
        /// Its SWA page.
        swa_page: usize,
    },
    /// Eviction over positions the request row does not have.
    #[error("request row has {len} positions, fewer than pre_len = {pre_len}")]
    RowTooShort {
        /// Row length.
        len: usize,
        /// `pre_len` asked for.
        pre_len: usize,
    },
    /// A layer id absent from the layers mapping.
    #[error("layer {0} is neither a full nor an SWA layer of this pool")]
    UnknownLayer(usize),
    /// A layer id listed twice (in one list or in both).
    #[error("layer {0} is listed more than once")]
    DuplicateLayer(usize),
    /// A device error (upload).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// How the out-of-window threshold is computed (SEMANTICS.md §swa-pool.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Chunk cache (no prefix tree): `threshold = pre_len − window`.
    ChunkCache,
    /// Radix cache: `threshold = pre_len − max(window, P)`, lowered to
    /// `retain_floor` when given (positions at or above it are kept).
    RadixCache {
        /// Optional floor the threshold is lowered to.
        retain_floor: Option<usize>,
    },
}

/// The full→SWA slot map of a hybrid pool (SEMANTICS.md §swa-pool.2) and the SWA
/// pool's page allocator.
///
/// - `map()`: `[size + P + 1]` i64; entry `f < size + P` is the SWA slot that
///   shadows full slot `f`, or 0 (unmapped); the last entry is −1 (sentinel,
///   never overwritten).
/// - Page-granular: a full page `F` is either unmapped (all its entries 0) or
///   mapped to one SWA page `S` with `map[F·P + o] = S·P + o` for every
///   offset `o`, so `map[F·P] / P` is the SWA page of the whole page.
/// - Full page 0 and SWA page 0 are the dummy pages: never allocated.
///   Allocatable full pages are `1..=size/P`, SWA pages `1..=size_swa/P`.
#[derive(Debug, Clone)]
pub struct SwaMapping {
    size: usize,
    size_swa: usize,
    page_size: usize,
    map: Vec<i64>,
    /// Full page → SWA page (0 = none), `[size / P + 1]`.
    swa_page_of: Vec<usize>,
    /// Free SWA pages, allocated from the front, returned to the back.
    free: VecDeque<usize>,
    /// Change counter: bumped by every page (un)mapping.
    version: u64,
    /// `(version, full page)` of each change after `log_floor`, by version.
    log: Vec<(u64, usize)>,
    /// The log holds every change made after this version.
    log_floor: u64,
}

/// Most entries the change log keeps before it is dropped (a consumer then
/// re-reads the whole map): twice the pages, at least this many.
const MIN_LOG_CAP: usize = 1024;

impl SwaMapping {
    /// An empty map for a full pool of `size` slots and an SWA pool of
    /// `size_swa` slots (each plus `P` padding slots: the dummy page).
    ///
    /// # Errors
    /// [`SwaError::Config`] when `page_size == 0`, a size is not a multiple
    /// of `P`, or a slot would not fit in i64.
    pub fn new(size: usize, size_swa: usize, page_size: usize) -> Result<Self, SwaError> {
        if page_size == 0 {
            return Err(SwaError::Config("page_size must be ≥ 1".into()));
        }
        if size % page_size != 0 || size_swa % page_size != 0 {
            return Err(SwaError::Config(format!(
                "size ({size}) and size_swa ({size_swa}) must be multiples of page_size ({page_size})"
            )));
        }
        let len = size
            .checked_add(page_size + 1)
            .filter(|&l| i64::try_from(l).is_ok() && i64::try_from(size_swa + page_size).is_ok())
            .ok_or_else(|| SwaError::Config("sizes do not fit in i64 slots".into()))?;
        let mut map = vec![0i64; len];
        map[len - 1] = -1;
        Ok(Self {
            size,
            size_swa,
            page_size,
            map,
            swa_page_of: vec![0; size / page_size + 1],
            free: (1..=size_swa / page_size).collect(),
            version: 0,
            log: Vec::new(),
            log_floor: 0,
        })
    }

    /// Change counter of the map: bumped once per full page mapped or
    /// unmapped (and by [`Self::clear`]). A device copy records the version
    /// it holds and asks [`Self::changed_pages_since`] what to update.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The full pages whose mapping changed after version `since`, sorted,
    /// each once (their current SWA page is [`Self::swa_page_of`], `None` =
    /// unmapped); `None` when the change log no longer reaches back to
    /// `since` (after [`Self::clear`], or when more than `max(1024, 2 ·
    /// pages)` changes piled up): the caller then re-reads the whole map.
    pub fn changed_pages_since(&self, since: u64) -> Option<Vec<usize>> {
        if since < self.log_floor {
            return None;
        }
        let i = self.log.partition_point(|&(v, _)| v <= since);
        let mut pages: Vec<usize> = self.log[i..].iter().map(|&(_, p)| p).collect();
        pages.sort_unstable();
        pages.dedup();
        Some(pages)
    }

    /// The current mapping of `pages` as the `(full_page, swa_page)` pairs
    /// [`crate::SwaUpdateKernel`] takes, flattened (`[2·k]` i64; SWA page 0 =
    /// unmapped).
    pub fn update_entries(&self, pages: &[usize]) -> Vec<i64> {
        pages
            .iter()
            .flat_map(|&p| {
                let s = self.swa_page_of.get(p).copied().unwrap_or(0);
                [p as i64, s as i64]
            })
            .collect()
    }

    fn log_change(&mut self, page: usize) {
        self.version += 1;
        self.log.push((self.version, page));
        if self.log.len() > MIN_LOG_CAP.max(2 * self.swa_page_of.len()) {
            self.log.clear();
            self.log_floor = self.version;
        }
    }

    /// Full pool slots `size` (without the `P` padding slots).
    pub fn size(&self) -> usize {
        self.size
    }

    /// SWA pool slots `size_swa` (without the `P` padding slots).
    pub fn size_swa(&self) -> usize {
        self.size_swa
    }

    /// Tokens per page `P` (both sub-pools).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The map, `[size + P + 1]` i64, last element −1.
    pub fn map(&self) -> &[i64] {
        &self.map
    }

    /// The full page → SWA page map, `[(size + P) / P]` i32 (one entry per
    /// full page, the dummy page 0 included): entry `F` is the SWA page `S`
    /// of full page `F` (`map[F·P + o] = S·P + o`), 0 when `F` is unmapped
    /// (the dummy SWA page). The page-level form of [`Self::map`], `P` times
    /// fewer entries of half the width: graph-metadata's SWA page-map fast
    /// path (`full_page_to_swa_page`) takes it and then builds the same SWA
    /// page table as from the slot map, because this map is page-granular.
    /// SWA page ids are stored as i32, as the SWA page table holds them
    /// (exact for SWA pools of fewer than 2^31 pages).
    pub fn page_map(&self) -> Vec<i32> {
        self.swa_page_of.iter().map(|&s| s as i32).collect()
    }

    /// Free SWA pages.
    pub fn free_swa_pages(&self) -> usize {
        self.free.len()
    }

    /// The SWA page of full page `page`, if it has one.
    pub fn swa_page_of(&self, page: usize) -> Option<usize> {
        self.swa_page_of.get(page).copied().filter(|&s| s != 0)
    }

    /// Full slots `size + P` (valid map indices).
    fn slots(&self) -> usize {
        self.size + self.page_size
    }

    fn check_slot(&self, slot: i64) -> Result<usize, SwaError> {
        usize::try_from(slot)
            .ok()
            .filter(|&s| s < self.slots())
            .ok_or(SwaError::SlotOutOfRange {
                slot,
                slots: self.slots(),
            })
    }

    fn check_page(&self, page: usize) -> Result<(), SwaError> {
        let last = self.size / self.page_size;
        if page == 0 || page > last {
            return Err(SwaError::PageOutOfRange { page, last });
        }
        Ok(())
    }

    fn map_page(&mut self, page: usize, swa_page: usize) {
        let p = self.page_size;
        self.swa_page_of[page] = swa_page;
        self.log_change(page);
        for o in 0..p {
            self.map[page * p + o] = (swa_page * p + o) as i64;
        }
    }

    fn unmap_page(&mut self, page: usize) -> bool {
        let swa = std::mem::take(&mut self.swa_page_of[page]);
        if swa == 0 {
            return false;
        }
        let p = self.page_size;
        self.map[page * p..(page + 1) * p].fill(0);
        self.free.push_back(swa);
        self.log_change(page);
        true
    }

    fn take_pages(&mut self, needed: usize) -> Result<Vec<usize>, SwaError> {
        if needed > self.free.len() {
            return Err(SwaError::Exhausted {
                needed,
                free: self.free.len(),
            });
        }
        Ok(self.free.drain(..needed).collect())
    }

    /// Maps whole full pages to fresh SWA pages (`map[F·P + o] = S·P + o`);
    /// returns the SWA page of each, in order.
    ///
    /// # Errors
    /// [`SwaError::PageOutOfRange`]; [`SwaError::AlreadyMapped`] for a page
    /// that has an SWA page or is listed twice; [`SwaError::Exhausted`].
    pub fn alloc_pages(&mut self, full_pages: &[usize]) -> Result<Vec<usize>, SwaError> {
        let mut seen = BTreeSet::new();
        for &page in full_pages {
            self.check_page(page)?;
            if let Some(swa_page) = self.swa_page_of(page) {
                return Err(SwaError::AlreadyMapped { page, swa_page });
            }
            if !seen.insert(page) {
                return Err(SwaError::AlreadyMapped { page, swa_page: 0 });
            }
        }
        let fresh = self.take_pages(full_pages.len())?;
        for (&page, &swa) in full_pages.iter().zip(&fresh) {
            self.map_page(page, swa);
        }
        Ok(fresh)
    }

    /// Allocates SWA slots for newly allocated full token slots (SEMANTICS.md
    /// §swa-pool.2): a slot whose full page has no SWA page yet gets one (the whole
    /// page is mapped, offsets preserved); a slot of an already mapped page
    /// keeps that page's mapping (the paired allocators extend a partly
    /// filled page). Returns the SWA slot of each input slot.
    ///
    /// # Errors
    /// [`SwaError::SlotOutOfRange`] (slots `[0, size + P)`),
    /// [`SwaError::PageOutOfRange`] (a slot in the dummy page 0),
    /// [`SwaError::Exhausted`]; nothing changes on error.
    pub fn alloc_slots(&mut self, full_slots: &[i64]) -> Result<Vec<i64>, SwaError> {
        let p = self.page_size;
        let mut new_pages = BTreeSet::new();
        for &slot in full_slots {
            let page = self.check_slot(slot)? / p;
            self.check_page(page)?;
            if self.swa_page_of[page] == 0 {
                new_pages.insert(page);
            }
        }
        let fresh = self.take_pages(new_pages.len())?;
        for (page, swa) in new_pages.into_iter().zip(fresh) {
            self.map_page(page, swa);
        }
        Ok(full_slots.iter().map(|&s| self.map[s as usize]).collect())
    }

    /// Tail-only allocation (disaggregated decode, SEMANTICS.md §swa-pool.2): only the
    /// last `k` of `full_slots` get SWA slots (page-granular, as
    /// [`Self::alloc_slots`]); every other page of `full_slots` ends unmapped
    /// (all 0; an SWA page it held is returned). Returns the SWA slot of each
    /// input slot (0 for the unmapped ones).
    ///
    /// # Errors
    /// As [`Self::alloc_slots`]; nothing changes on error.
    pub fn alloc_tail(&mut self, full_slots: &[i64], k: usize) -> Result<Vec<i64>, SwaError> {
        let p = self.page_size;
        let split = full_slots.len().saturating_sub(k);
        let (head, tail) = full_slots.split_at(split);
        let mut tail_pages = BTreeSet::new();
        for &slot in tail {
            let page = self.check_slot(slot)? / p;
            self.check_page(page)?;
            tail_pages.insert(page);
        }
        let mut release = BTreeSet::new();
        for &slot in head {
            let page = self.check_slot(slot)? / p;
            if !tail_pages.contains(&page) && self.swa_page_of[page] != 0 {
                release.insert(page);
            }
        }
        let needed = tail_pages
            .iter()
            .filter(|&&pg| self.swa_page_of[pg] == 0)
            .count();
        if needed > self.free.len() + release.len() {
            return Err(SwaError::Exhausted {
                needed,
                free: self.free.len() + release.len(),
            });
        }
        for page in release {
            self.unmap_page(page);
        }
        self.alloc_slots(tail)?;
        Ok(full_slots.iter().map(|&s| self.map[s as usize]).collect())
    }

    /// Frees the SWA slots of `full_slots` (SEMANTICS.md §swa-pool.2): each slot is
    /// widened to its whole full page; a mapped page's SWA page is returned
    /// to the free list and its entries written 0; unmapped pages are left
    /// as they are. Returns the number of SWA pages freed.
    ///
    /// # Errors
    /// [`SwaError::SlotOutOfRange`]; nothing changes on error.
    pub fn free_slots(&mut self, full_slots: &[i64]) -> Result<usize, SwaError> {
        let p = self.page_size;
        let mut pages = BTreeSet::new();
        for &slot in full_slots {
            pages.insert(self.check_slot(slot)? / p);
        }
        Ok(pages.into_iter().filter(|&pg| self.unmap_page(pg)).count())
    }

    /// Returns the SWA slots of a request's tokens that slid out of the
    /// window (SEMANTICS.md §swa-pool.5). `row` is the request's `req_to_token` row
    /// (full slots by position), `pre_len` its cached tokens, `evicted` the
    /// position below which its SWA slots are already freed (0 at first).
    ///
    /// ```text
    /// threshold = pre_len − window                (ChunkCache)
    ///           = pre_len − max(window, P)        (RadixCache; lowered to retain_floor)
    /// new       = max(evicted, threshold), floored to a multiple of P when P > 1
    /// ```
    /// Frees positions `[evicted, new)` (their pages go back to the dummy
    /// SWA page 0) and returns the new `evicted` (never below the old one).
    /// Safe for attention as long as `window ≥ window_left`.
    ///
    /// # Errors
    /// [`SwaError::RowTooShort`] when `pre_len > row.len()`;
    /// [`SwaError::SlotOutOfRange`] for a bad slot in the freed range.
    pub fn evict_out_of_window(
        &mut self,
        row: &[i32],
        pre_len: usize,
        window: usize,
        evicted: usize,
        policy: EvictionPolicy,
    ) -> Result<usize, SwaError> {
        if pre_len > row.len() {
            return Err(SwaError::RowTooShort {
                len: row.len(),
                pre_len,
            });
        }
        let p = self.page_size;
        let threshold = match policy {
            EvictionPolicy::ChunkCache => pre_len.saturating_sub(window),
            EvictionPolicy::RadixCache { retain_floor } => {
                let t = pre_len.saturating_sub(window.max(p));
                retain_floor.map_or(t, |f| t.min(f))
            }
        };
        let mut new = evicted.max(threshold);
        if p > 1 {
            new = new / p * p;
        }
        if new <= evicted {
            return Ok(evicted);
        }
        let slots: Vec<i64> = row[evicted..new].iter().map(|&s| i64::from(s)).collect();
        self.free_slots(&slots)?;
        Ok(new)
    }

    /// Clears the map (all 0 except the sentinel) and frees every SWA page.
    pub fn clear(&mut self) {
        let len = self.map.len();
        self.map.fill(0);
        self.map[len - 1] = -1;
        self.swa_page_of.fill(0);
        self.free = (1..=self.size_swa / self.page_size).collect();
        self.version += 1;
        self.log.clear();
        self.log_floor = self.version;
    }

    /// Uploads the map to a new device buffer `[size + P + 1]` i64 on `gpu`'s
    /// stream, in one call (a host→device copy, stream-ordered; the host
    /// map may change as soon as this returns).
    ///
    /// # Errors
    /// [`KernelError::Driver`] on allocation or copy failure.
    pub fn upload(&self, gpu: &Arc<Gpu>) -> Result<CudaSlice<i64>, KernelError> {
        Ok(gpu.stream().clone_htod(&self.map)?)
    }

    /// Copies the map into an existing device buffer (same address, e.g. one
    /// a CUDA graph was captured with), in one call.
    ///
    /// # Errors
    /// [`KernelError::Shape`] when `dst` is not `[size + P + 1]`;
    /// [`KernelError::Driver`] on copy failure.
    pub fn upload_into(&self, gpu: &Arc<Gpu>, dst: &mut CudaSlice<i64>) -> Result<(), KernelError> {
        if dst.len() != self.map.len() {
            return Err(KernelError::shape(
                "full_to_swa",
                format!("[{}]", self.map.len()),
                format!("[{}]", dst.len()),
            ));
        }
        gpu.stream().memcpy_htod(&self.map, dst)?;
        Ok(())
    }
}

/// Routing of global layer ids to the two sub-pools (SEMANTICS.md §swa-pool.1): full
/// layers are numbered `0..` in the order of the full-layer list, SWA layers
/// likewise.
#[derive(Debug, Clone, Default)]
pub struct LayersMapping {
    layers: BTreeMap<usize, (usize, bool)>,
    num_full: usize,
    num_swa: usize,
}

impl LayersMapping {
    /// Builds the mapping from the full-attention and SWA layer id lists.
    ///
    /// # Errors
    /// [`SwaError::DuplicateLayer`] when an id appears twice.
    pub fn new(full_layer_ids: &[usize], swa_layer_ids: &[usize]) -> Result<Self, SwaError> {
        let mut layers = BTreeMap::new();
        for (ids, is_swa) in [(full_layer_ids, false), (swa_layer_ids, true)] {
            for (index, &id) in ids.iter().enumerate() {
                if layers.insert(id, (index, is_swa)).is_some() {
                    return Err(SwaError::DuplicateLayer(id));
                }
            }
        }
        Ok(Self {
            layers,
            num_full: full_layer_ids.len(),
            num_swa: swa_layer_ids.len(),
        })
    }

    /// `(index inside its sub-pool, is_swa)` of global layer `layer`.
    ///
    /// # Errors
    /// [`SwaError::UnknownLayer`].
    pub fn get(&self, layer: usize) -> Result<(usize, bool), SwaError> {
        self.layers
            .get(&layer)
            .copied()
            .ok_or(SwaError::UnknownLayer(layer))
    }

    /// Number of full-attention layers.
    pub fn num_full_layers(&self) -> usize {
        self.num_full
    }

    /// Number of SWA layers.
    pub fn num_swa_layers(&self) -> usize {
        self.num_swa
    }

    /// Whether there is at least one SWA layer (a pool with none needs no
    /// SWA write locations: `use_sliding_window_kv_pool` is false).
    pub fn has_swa_layers(&self) -> bool {
        self.num_swa > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `page_map()` is the page-level form of `map()` after allocation,
    /// tail-only allocation, freeing, eviction and clearing: one entry per
    /// full page (`(size + P) / P`), `map[F·P + o] = S·P + o` when entry
    /// `F = S ≠ 0`, all 0 when it is 0.
    #[test]
    fn page_map_is_the_page_level_form_of_the_slot_map() {
        fn check(m: &SwaMapping) {
            let p = m.page_size();
            let pages = m.page_map();
            let map = m.map();
            assert_eq!(pages.len(), (m.size() + p) / p);
            assert_eq!(
                pages.len() * p,
                map.len() - 1,
                "covers every slot but the sentinel"
            );
            for (f, &s) in pages.iter().enumerate() {
                assert_eq!(s == 0, m.swa_page_of(f).is_none(), "page {f}");
                for o in 0..p {
                    let want = if s == 0 {
                        0
                    } else {
                        i64::from(s) * p as i64 + o as i64
                    };
                    assert_eq!(map[f * p + o], want, "page {f} offset {o}");
                }
            }
            assert_eq!(pages[0], 0, "the dummy full page is never mapped");
        }
        for p in [1usize, 4, 16] {
            let mut m = SwaMapping::new(24 * p, 10 * p, p).expect("config");
            check(&m);
            m.alloc_pages(&[3, 7, 20]).expect("alloc pages");
            check(&m);
            let slots: Vec<i64> = [5 * p, 5 * p + p - 1, 9 * p]
                .iter()
                .map(|&s| s as i64)
                .collect();
            m.alloc_slots(&slots).expect("alloc slots");
            check(&m);
            m.free_slots(&[(7 * p) as i64]).expect("free");
            check(&m);
            let tail: Vec<i64> = (10 * p..13 * p).map(|s| s as i64).collect();
            m.alloc_tail(&tail, p).expect("tail");
            check(&m);
            let row: Vec<i32> = (3 * p..6 * p).map(|s| s as i32).collect();
            m.evict_out_of_window(&row, 3 * p, p, 0, EvictionPolicy::ChunkCache)
                .expect("evict");
            check(&m);
            // Positions [0, 2P) = full pages 3 and 4 slid out of the window.
            assert_eq!(m.page_map()[3], 0, "evicted page 3 is unmapped");
            assert_ne!(m.page_map()[5], 0, "page 5 is still in the window");
            assert_ne!(m.page_map()[20], 0, "page 20 is still mapped");
            m.clear();
            check(&m);
            assert!(m.page_map().iter().all(|&s| s == 0));
        }
    }
}

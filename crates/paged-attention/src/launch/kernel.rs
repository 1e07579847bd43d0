//! The decode/verify launcher: kernel functions resolved once, launches
//! stream-ordered and graph-capturable.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kernel_rt::cudarc::driver::sys::CUdevice_attribute;
use kernel_rt::cudarc::driver::CudaStream;
use kernel_rt::launch::{EntryAttrs, Launcher};
use kernel_rt::{to_i32, DeviceErrors, Gpu, KernelError, Result};

use crate::context::env_choice;
use crate::{HalfDtype, KvDtype, DECODE_HEAD_DIMS, PTX};

use super::plan::plan_path;
use super::unit_order::check_order_view;
use super::views::{base_ptrs, stride_err};
use super::{
    entry_name, mma_entry_name, mma_smem_bytes_xv, mma_variants, smem_bytes, DecodeArgs,
    KernelPath, LaunchPlan, PagedAttentionParams, QueryLayout, BLOCK_THREADS, ROWS_PER_CTA,
};

/// Timing experiment entries of the tensor-core kernel (`<entry>_x<n>`).
const EXPERIMENT_ENTRIES: &[&str] = &[
    "paged_attention_mma_bf16_kv_bf16_d128_x16",
    "paged_attention_mma_bf16_kv_e4m3_d128_x256",
    "paged_attention_mma_bf16_kv_bf16_d128_x256",
    "paged_attention_mma_bf16_kv_e4m3_d128_x1024",
    "paged_attention_mma_bf16_kv_e4m3_d128_x5376",
    "paged_attention_mma_bf16_kv_e4m3_d128_x4368",
];

/// Experiment bit of the entries that compute only the first 8 rows of each
/// 16-row tile: they run only where `q_len · G ≤ 8` (the production entry
/// otherwise).
const EXPERIMENT_HALF_ROWS: u32 = 256;

/// Most splits a tensor-core launch folds inside one thread-block cluster
/// (the portable cluster size); launches with more fold through the
/// workspace.
const CLUSTER_FOLD_MAX: usize = 8;
/// Longest split chunk (keys, from `max_seq_len / splits`) whose launch
/// folds inside clusters: where each CTA streams more, the fold is a small
/// part of the launch and placing whole clusters costs more than it saves
/// (H200, bs 4 × 32k as 32 clusters of 8 splits of 4,096 keys: 141.7 →
/// 145.0 µs; bs 8 × 4k, splits of 1,024: 40.7 either way; PERF.md
/// session 22).
const CLUSTER_FOLD_MAX_CHUNK: usize = 1024;

/// The launches of `total` row tiles whose grid holds at most `grid_tiles`
/// of them (at least 1), or `cap` where that is smaller: `(row_tile_base,
/// row tiles)` of each, in order, covering `0..total` exactly once.
fn row_tile_blocks(
    total: usize,
    grid_tiles: usize,
    cap: Option<usize>,
) -> impl Iterator<Item = (usize, usize)> {
    let per = grid_tiles.min(cap.unwrap_or(usize::MAX)).max(1);
    (0..total)
        .step_by(per)
        .map(move |base| (base, per.min(total - base)))
}

/// The experiment number of an `_x{n}` entry name (0 for a production entry).
fn entry_experiment(entry: &str) -> u32 {
    entry
        .rsplit_once("_x")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// Environment variable that sets whether decode / verify launches are
/// programmatic dependent launches ([`PagedAttentionKernel::set_pdl`]):
/// `off` (default: it gains ≤ 0.4 µs a launch in a CUDA graph, PERF
/// session 18) or `on`.
pub const DECODE_PDL_ENV: &str = "MHA_KIT_DECODE_PDL";

/// Environment variable that sets whether new launchers run the tensor-core
/// entries of [`crate::mma_wide`] shapes ([`PagedAttentionKernel::set_wide_mma`]):
/// `on` (default since session 31) or `off` (the CUDA-core kernel there).
pub const DECODE_WIDE_MMA_ENV: &str = "MHA_KIT_DECODE_WIDE_MMA";

/// Environment variable that sets the decode timing experiment of every
/// new launcher ([`PagedAttentionKernel::set_experiment`]): `off` (default),
/// `x256` (where `q_len · G ≤ 8`, only the valid half of the rows
/// computed, in an entry of its own), `x1024` (e4m3 K/V copied as before
/// session 42's W), `x5376` (the half-row pair loop with `x1024`'s
/// copies), so that a whole replay can run it.
/// (`x192`, the same loop beside the full one in the production entry, was
/// dropped in session 44; `x2048` / `x2304`, each slice's S a step ahead,
/// in session 46; `x2` / `x4354`, the first K/V tiles issued before Q is
/// read, in session 48; `x128` / `x4480`, a persistent grid, and `x640` /
/// `x4992`, the same with the next unit's first tiles issued before each
/// unit's merge, in session 49.)
pub const DECODE_EXPERIMENT_ENV: &str = "MHA_KIT_DECODE_EXPERIMENT";

/// Whether the tensor-core entry of (`q`, `kv`, `d`) has a `_cf` twin (the
/// cluster fold, [`PagedAttentionKernel::set_cluster_fold`]): bf16 Q at
/// D 64 and 128 with bf16 or e4m3 K/V (the twins add ~250 KB of PTX each
/// to the committed tree).
pub fn cluster_fold_variant(q: HalfDtype, kv: KvDtype, d: usize) -> bool {
    q == HalfDtype::Bf16 && matches!(kv, KvDtype::Bf16 | KvDtype::E4m3) && d <= 128
}

/// Environment variable that sets whether split launches fold inside
/// thread-block clusters ([`PagedAttentionKernel::set_cluster_fold`]):
/// `on` (default) or `off`.
pub const DECODE_CLUSTER_FOLD_ENV: &str = "MHA_KIT_DECODE_CLUSTER_FOLD";

/// Environment variable that sets whether bf16-Q launches with e4m3 K/V at
/// D 128 run the pair loop ([`PagedAttentionKernel::set_pair_loop`]): `on`
/// (default) or `off` (the one-tile loop and its cluster fold).
pub const DECODE_PAIR_LOOP_ENV: &str = "MHA_KIT_DECODE_PAIR_LOOP";

/// Suffix of the pair-loop entry ([`pair_loop_variant`]) and of its
/// half-row form (launches with `q_len · G ≤ 8`).
const PAIR_SUFFIX: &str = "_pair";
const PAIR_HALF_SUFFIX: &str = "_pair_h";

/// Whether the tensor-core entry of (`q`, `kv`, `d`) has the pair-loop
/// twins (`_pair`, `_pair_h`; [`PagedAttentionKernel::set_pair_loop`]):
/// bf16 Q with e4m3 K/V at D 128, whose loop is latency-bound (PERF.md
/// sessions 42, 45).
pub fn pair_loop_variant(q: HalfDtype, kv: KvDtype, d: usize) -> bool {
    q == HalfDtype::Bf16 && kv == KvDtype::E4m3 && d == 128
}

/// Environment variable that sets when new launchers start the CTAs of the
/// longest requests first ([`PagedAttentionKernel::set_length_order`]):
/// `on` (default: launches of at least `2·SMs` work items), `always` or
/// `off`.
pub const DECODE_LENGTH_ORDER_ENV: &str = "MHA_KIT_DECODE_LENGTH_ORDER";

/// Environment variable that sets whether new launchers read a given
/// [`DecodeArgs::unit_order`] ([`PagedAttentionKernel::set_unit_order`]):
/// `on` (default) or `off` (every CTA ranks, as without one; for A/B
/// runs such as a whole replay with and without it).
pub const DECODE_UNIT_ORDER_ENV: &str = "MHA_KIT_DECODE_UNIT_ORDER";

/// The decode/verify launcher: every kernel function is resolved once, at
/// construction (with its dynamic shared memory limit raised); launches are
/// stream-ordered and graph-capturable (no host sync, allocation or copy).
#[derive(Debug)]
pub struct PagedAttentionKernel {
    /// Every entry (tensor-core, its timing experiments, CUDA-core), by name.
    pub(super) kernel: Launcher,
    num_sms: usize,
    path: KernelPath,
    /// Timing experiment: the `_x{n}` tensor-core entry where one exists.
    experiment: u32,
    /// Launch with the programmatic-dependent-launch attribute (sm_90).
    pdl: bool,
    /// The device runs PDL (compute capability 9.0 or later).
    pdl_capable: bool,
    /// Fold the splits of a tensor-core launch inside thread-block clusters
    /// where the whole grid fits at once.
    cluster_fold: bool,
    /// Per production tensor-core entry index: its `_cf` twin (the same
    /// kernel with the cluster fold) and how many clusters of 2..=8 CTAs
    /// (index size − 2) of that twin fit on the device at once
    /// (`cuOccupancyMaxActiveClusters`; 0 where clusters are not supported).
    cluster_fit: HashMap<usize, (usize, [usize; CLUSTER_FOLD_MAX - 1])>,
    /// Launches issued as clusters (the cluster fold).
    cluster_launches: AtomicU64,
    /// Per production tensor-core entry index with pair-loop twins
    /// ([`pair_loop_variant`]): the `_pair` and `_pair_h` entries.
    pair_twins: HashMap<usize, (usize, usize)>,
    /// Run the pair-loop twins where they exist ([`PagedAttentionKernel::set_pair_loop`]).
    pair_loop: bool,
    /// At most this many row tiles a launch (tests of the multi-launch
    /// path); `None`: as many as the grid holds.
    launch_row_tiles: Option<usize>,
    /// [`KernelPath::Auto`] also runs the tensor-core entries of
    /// [`crate::mma_wide`] shapes ([`PagedAttentionKernel::set_wide_mma`]).
    wide_mma: bool,
    /// Work units in descending order of request length for launches of
    /// at least this many work items ([`PagedAttentionKernel::set_length_order`]).
    length_order: Option<usize>,
    /// Entry index of `paged_attention_unit_order`
    /// ([`PagedAttentionKernel::write_unit_order`]).
    pub(super) unit_order: usize,
    /// Read [`DecodeArgs::unit_order`] where given ([`PagedAttentionKernel::set_unit_order`]).
    read_unit_order: bool,
}

impl PagedAttentionKernel {
    /// Loads every entry point on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load; [`KernelError::Driver`].
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Self::with_path(gpu, KernelPath::Auto)
    }

    /// [`PagedAttentionKernel::new`] with an explicit kernel choice.
    ///
    /// # Errors
    /// As [`PagedAttentionKernel::new`].
    pub fn with_path(gpu: &Arc<Gpu>, path: KernelPath) -> Result<Self> {
        let mut kernel = Launcher::empty(gpu);
        let mut cluster_fit = HashMap::new();
        let mut pair_twins = HashMap::new();
        for (q, kv, d) in mma_variants() {
            let name = mma_entry_name(q, kv, d);
            // The entry and its timing experiments (each with its own
            // shared memory size: `MmaSmem::X8` lays it out otherwise).
            let experiments = EXPERIMENT_ENTRIES
                .iter()
                .filter(|e| {
                    e.strip_prefix(name.as_str())
                        .is_some_and(|x| x.starts_with("_x"))
                })
                .map(|e| (*e).to_string());
            for entry in std::iter::once(name.clone()).chain(experiments) {
                let smem = mma_smem_bytes_xv(d, kv, entry_experiment(&entry));
                kernel.load(&PTX, &entry, EntryAttrs::smem_max_carveout(smem))?;
            }
            let smem = mma_smem_bytes_xv(d, kv, 0);
            let main = kernel.index(&name).expect("loaded above");
            if pair_loop_variant(q, kv, d) {
                // The same shared-memory layout as the entry.
                let attrs = EntryAttrs::smem_max_carveout(smem);
                let full = kernel.load(&PTX, &format!("{name}{PAIR_SUFFIX}"), attrs)?;
                let half = kernel.load(&PTX, &format!("{name}{PAIR_HALF_SUFFIX}"), attrs)?;
                pair_twins.insert(main, (full, half));
            }
            if !cluster_fold_variant(q, kv, d) {
                continue;
            }
            let cf = kernel.load(
                &PTX,
                &format!("{name}_cf"),
                EntryAttrs::smem_max_carveout(smem),
            )?;
            let mut fit = [0usize; CLUSTER_FOLD_MAX - 1];
            for (c, f) in fit.iter_mut().enumerate() {
                // A device without clusters (before sm_90) answers with an
                // error: no cluster fold there.
                *f = kernel
                    .max_active_clusters(cf, BLOCK_THREADS, smem as u32, c as u32 + 2)
                    .unwrap_or(0);
            }
            cluster_fit.insert(main, (cf, fit));
        }
        let unit_order = kernel.load(&PTX, super::unit_order::ENTRY, EntryAttrs::smem(0))?;
        for q in [HalfDtype::Bf16, HalfDtype::F16] {
            for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
                for d in DECODE_HEAD_DIMS {
                    let name = entry_name(q, kv, d);
                    kernel.load(&PTX, &name, EntryAttrs::smem(smem_bytes(d, kv)))?;
                }
            }
        }
        let num_sms = gpu
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as usize;
        let mut k = Self {
            kernel,
            num_sms,
            path,
            experiment: 0,
            pdl: env_choice(DECODE_PDL_ENV, &[("off", false), ("on", true)])?,
            pdl_capable: gpu.compute_capability().is_some_and(|cc| cc >= (9, 0)),
            cluster_fold: env_choice(DECODE_CLUSTER_FOLD_ENV, &[("on", true), ("off", false)])?,
            cluster_fit,
            cluster_launches: AtomicU64::new(0),
            pair_twins,
            pair_loop: env_choice(DECODE_PAIR_LOOP_ENV, &[("on", true), ("off", false)])?,
            launch_row_tiles: None,
            wide_mma: env_choice(DECODE_WIDE_MMA_ENV, &[("on", true), ("off", false)])?,
            length_order: env_choice(
                DECODE_LENGTH_ORDER_ENV,
                &[
                    ("on", Some(2 * num_sms)),
                    ("always", Some(0)),
                    ("off", None),
                ],
            )?,
            unit_order,
            read_unit_order: env_choice(DECODE_UNIT_ORDER_ENV, &[("on", true), ("off", false)])?,
        };
        k.set_experiment(env_choice(
            DECODE_EXPERIMENT_ENV,
            &[("off", 0), ("x256", 256), ("x1024", 1024), ("x5376", 5376)],
        )?)?;
        Ok(k)
    }

    /// Runs timing experiment `xv` where its entry exists (launches of
    /// other shapes keep the production entry); 0 = production. D 128 bf16-Q
    /// tensor-core entries, correct results (`_x{xv}` in the .cu; each in
    /// the production form, lean copy addresses, since session 31): `256`
    /// (e4m3 and bf16 KV), for launches with `q_len · G ≤ 8` (every row
    /// tile at most 8 rows), a loop that computes only the valid half of
    /// each MMA fragment's rows (the production entry otherwise; `192`, the
    /// same loop beside the full one in one entry, was dropped in session
    /// 44: PERF.md sessions 31, 44); `1024` (e4m3 KV) the e4m3 K/V copies
    /// of the D 128 entries before session 42's W (lane quads of 64-byte row
    /// parts with the L2's 128-byte hint, where W copies whole rows without
    /// it: whether W costs the H200, PERF.md session 44); `5376` (e4m3 KV,
    /// `q_len · G ≤ 8` only) the half-row pair
    /// loop (`_pair_h`) with `1024`'s copies; `4368` (e4m3 KV, `q_len · G ≤
    /// 8` only) the `_pair_h` loop with `16`'s trace; `16` (bf16 KV) the
    /// production entry writing a per-CTA trace through `skipped_slices`
    /// instead of counting skipped slices: 8 u64 a CTA in linear CTA order
    /// (`%smid` in the low word and the length order's ranking in ns in
    /// the high word; `%globaltimer` ns at entry (before the ranking),
    /// length read, first K/V tile landed, loop end, partial or rows
    /// written, exit; then 1 = this CTA folded the splits, 2 = no work, 0 =
    /// neither). With experiment 16 a
    /// `skipped_slices` shorter than 16 u32 a CTA is refused
    /// ([`KernelError::Capacity`]), a strided one too
    /// ([`KernelError::Stride`]).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for an unknown experiment.
    pub fn set_experiment(&mut self, xv: u32) -> Result<()> {
        if xv != 0
            && !EXPERIMENT_ENTRIES
                .iter()
                .any(|e| e.ends_with(&format!("_x{xv}")))
        {
            return Err(KernelError::unsupported(
                "experiment",
                format!("no decode experiment {xv}"),
            ));
        }
        self.experiment = xv;
        Ok(())
    }

    /// Sets whether launches carry the programmatic-dependent-launch
    /// attribute ([`kernel_rt::launch`]; ignored below compute capability
    /// 9.0): a launch may then start while the previous kernel of its stream
    /// is still running; every entry waits (`griddepcontrol.wait`) before
    /// its first global memory access, so it reads only what that kernel
    /// finished, and each CTA releases the next PDL launch once its KV loop
    /// is done. Same results, bit for bit; the default comes from
    /// [`DECODE_PDL_ENV`] (unset: off).
    pub fn set_pdl(&mut self, on: bool) {
        self.pdl = on;
    }

    /// Sets whether the splits of a tensor-core launch fold inside
    /// thread-block clusters (sm_90; default from
    /// [`DECODE_CLUSTER_FOLD_ENV`], unset: on). With it, a launch on an
    /// entry with a `_cf` twin ([`cluster_fold_variant`]) of 2 to 8
    /// splits of at most 1,024 keys each (`max_seq_len / splits`) whose
    /// clusters (one per work item: its splits) all fit on the device at
    /// once runs the entry's `_cf` twin as one cluster per item: every split
    /// leaves its partial in its shared memory and the cluster folds them
    /// over distributed shared memory, with the workspace fold's arithmetic
    /// (bit-identical rows, LSE and error words) and without its stores,
    /// fence, arrival counter and L2 reads at the launch's tail (H200, bs
    /// 1 × 1k: 9.3 → 8.9 µs, PERF.md session 22). Other launches fold
    /// through the workspace as before.
    pub fn set_cluster_fold(&mut self, on: bool) {
        self.cluster_fold = on;
    }

    /// Sets whether launches of bf16 Q with e4m3 K/V at D 128
    /// ([`pair_loop_variant`]) run the pair loop (default from
    /// [`DECODE_PAIR_LOOP_ENV`], unset: on): each warp takes two consecutive
    /// 16-key slices of its tiles a step, with one online-softmax update
    /// over their 32 keys, instead of one slice (the one-tile loop). That
    /// loop is latency-bound at two warps a scheduler; the pair halves the
    /// softmax's serial part per key and doubles the independent S chains
    /// (H200, FP8 bs 64 × 8k: 303.6 → 285.2 µs, and 272.1 µs with the
    /// half-row form that launches with `q_len · G ≤ 8` take; PERF.md
    /// session 45). Its results equal the one-tile loop's within rounding,
    /// not bit for bit (the softmax is updated once per 32 keys, not 16).
    /// The pair entries have no cluster-fold twin: with the pair loop on,
    /// their split launches fold through the workspace
    /// ([`PagedAttentionKernel::set_cluster_fold`] does not apply), so one
    /// launcher's results for a request do not depend on the batch. A
    /// timing experiment ([`PagedAttentionKernel::set_experiment`]) with an
    /// entry for the launch takes precedence.
    pub fn set_pair_loop(&mut self, on: bool) {
        self.pair_loop = on;
    }

    /// Whether the pair loop is on ([`PagedAttentionKernel::set_pair_loop`]).
    pub fn pair_loop(&self) -> bool {
        self.pair_loop
    }

    /// Sets which launches start the CTAs of their longest requests first:
    /// `Some(min_items)` those of more than one request with at least
    /// `min_items` work items (`bs·Hkv·row_tiles`), `None` none. Default
    /// from [`DECODE_LENGTH_ORDER_ENV`], unset: `Some(2·SMs)`.
    ///
    /// The block scheduler starts CTAs in grid order, and in grid order CTA
    /// slice `z` is request `z`, so in a ragged batch a long request late in
    /// the batch starts last and runs alone at the end. With the length
    /// order every CTA first ranks the batch by `⌈cache_seqlens / 128⌉`
    /// (descending, ties by index: a counting sort over 256 buckets in
    /// shared memory, one or two passes over `cache_seqlens`) and serves the
    /// work units (request, split) in that order, each request's possible
    /// splits consecutive (at most `⌈128·⌈L/128⌉ / chunk⌉`, ≤ `S_max`), the
    /// CTAs left over (units no request has) last: longest processing time
    /// first. Each request is still computed by the same splits, partials
    /// and fold, so rows, LSE and error words are bit-identical to the
    /// launch without it. Launches whose splits fold inside clusters keep
    /// the grid order. Cost: ~1.3–1.8 µs at the start of every CTA (H100,
    /// docs/PERF.md session 37), so it pays where there are many CTAs a
    /// slot: on an H200 an unsplit ragged batch of 224 requests (Azure conv
    /// lengths) went from 89% / 97% of the copy ceiling to 100% / 100%; a
    /// uniform bs 64 / 256 × 8k moved < 0.3%. Split launches with many
    /// empty CTAs (`max_splits` far above the batch's need) lose: each
    /// empty CTA pays the ranking too.
    pub fn set_length_order(&mut self, min_items: Option<usize>) {
        self.length_order = min_items;
    }

    /// Sets whether launches read a given [`DecodeArgs::unit_order`]
    /// (`false`: ignored, every CTA of an ordered launch ranks the batch;
    /// the results are the same bits either way). Default from
    /// [`DECODE_UNIT_ORDER_ENV`], unset: `true`.
    pub fn set_unit_order(&mut self, on: bool) {
        self.read_unit_order = on;
    }

    /// Whether launches read a given [`DecodeArgs::unit_order`].
    pub fn unit_order(&self) -> bool {
        self.read_unit_order
    }

    /// Whether a launch with `params` (its plan's, e.g. from
    /// [`PagedAttentionKernel::plan`]) reads a given [`DecodeArgs::unit_order`]:
    /// reading is on ([`PagedAttentionKernel::set_unit_order`]), the launch
    /// has one split and is in the length order (more than one request and
    /// at least [`PagedAttentionKernel::length_order`] work items; a launch
    /// of one split never folds in clusters). One rule for the launcher and
    /// callers that write the order only where it is read.
    pub fn reads_unit_order(&self, params: &PagedAttentionParams) -> bool {
        params.max_splits == 1
            && self.may_read_unit_order(params.bs.max(0) as usize, params.work_items())
    }

    /// The part of [`PagedAttentionKernel::reads_unit_order`] known before a
    /// launch is planned: whether a launch over `bs` requests and
    /// `work_items` work items (requests · KV heads · row tiles; a decode
    /// launch of one row tile: `bs · num_kv_heads`) can read a given order
    /// (reading is on, `bs > 1`, the length order applies). A planned
    /// launch reads it when it also has one split. For callers that write
    /// the order once a pass (e.g. the Python package's backend) and skip
    /// the write where no launch could read it.
    pub fn may_read_unit_order(&self, bs: usize, work_items: usize) -> bool {
        self.read_unit_order && self.length_ordered(bs, work_items)
    }

    /// Whether a launch over `bs` requests and `work_items` work items is in
    /// the length order unless it folds in clusters: more than one request
    /// and at least [`PagedAttentionKernel::length_order`] items. The one
    /// rule behind `PagedAttentionParams::length_order` and
    /// [`PagedAttentionKernel::may_read_unit_order`].
    fn length_ordered(&self, bs: usize, work_items: usize) -> bool {
        bs > 1 && self.length_order.is_some_and(|min| work_items >= min)
    }

    /// Launches of at least this many work items start their longest
    /// requests first (`None`: none).
    pub fn length_order(&self) -> Option<usize> {
        self.length_order
    }

    /// Whether split launches may fold inside clusters.
    pub fn cluster_fold(&self) -> bool {
        self.cluster_fold
    }

    /// Launches issued so far whose splits folded inside clusters.
    pub fn cluster_launches(&self) -> u64 {
        self.cluster_launches.load(Ordering::Relaxed)
    }

    /// At most `n` row tiles (16 packed query rows each) a launch: a call
    /// whose rows need more issues one launch per block of `n` row tiles
    /// (`row_tile_base` apart), with the same results. `None` (default):
    /// as many as one grid holds. For tests of the multi-launch path that
    /// the context call's head-dim-512 path takes on long prompts.
    pub fn set_launch_row_tiles(&mut self, n: Option<usize>) {
        self.launch_row_tiles = n.map(|n| n.max(1));
    }

    /// Whether [`KernelPath::Auto`] runs the session-29 tensor-core entries
    /// ([`crate::mma_wide`]: head dim 512, e4m3 K/V at 256 and 512, by warp
    /// groups that split the dims) instead of the CUDA-core kernel for those
    /// shapes. Default from [`DECODE_WIDE_MMA_ENV`] (`on` since they passed
    /// against the reference on an H100 in session 31; the results either
    /// way are the reference's within tolerance).
    pub fn set_wide_mma(&mut self, on: bool) {
        self.wide_mma = on;
    }

    /// Whether [`PagedAttentionKernel::set_wide_mma`] is on.
    pub fn wide_mma(&self) -> bool {
        self.wide_mma
    }

    /// Whether launches are programmatic dependent launches (set and
    /// supported by the device).
    pub fn pdl(&self) -> bool {
        self.pdl && self.pdl_capable
    }

    /// SMs of the device (input of [`launch_config`](super::launch_config)).
    pub fn num_sms(&self) -> usize {
        self.num_sms
    }

    /// Kernel launches issued so far.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// The plan [`PagedAttentionKernel::launch`] would use, to size the
    /// workspace: everything is validated except the workspace's capacity
    /// (`args.workspace` may be `None`; `LaunchPlan::workspace_elems` says
    /// how many f32 it needs).
    ///
    /// # Errors
    /// As [`validate`](super::validate), without the workspace [`KernelError::Capacity`].
    pub fn plan(&self, args: &DecodeArgs<'_>) -> Result<LaunchPlan> {
        plan_path(args, self.num_sms, self.path, false, false, self.wide_mma)
    }

    /// The kernel choice of this launcher.
    pub fn path(&self) -> KernelPath {
        self.path
    }

    /// Computes `out` (rows of requests only; other rows untouched); `bs = 0`
    /// launches nothing. One launch (splits are merged by their last CTA;
    /// the workspace counters must start at zero, see
    /// [`workspace_elems`](super::workspace_elems)). Bad device data is
    /// counted in `errors` ([`crate::ErrorFlags`]), never read through.
    /// Asynchronous.
    ///
    /// # Errors
    /// As [`validate`](super::validate); [`KernelError::Stride`] for
    /// misaligned base pointers; [`KernelError::Driver`] when a launch fails.
    pub fn launch(&self, args: &mut DecodeArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        self.launch_on(self.kernel.gpu().stream(), args, errors)
    }

    /// [`PagedAttentionKernel::launch`] on `stream` instead of the GPU's own
    /// stream (e.g. an engine's stream from [`Gpu::borrowed_stream`]), in
    /// that stream's order and CUDA-graph capture. The workspace counters
    /// follow the same rule (zero before, zero after), in that stream's order.
    ///
    /// # Errors
    /// As [`PagedAttentionKernel::launch`]; [`KernelError::Unsupported`] when
    /// the stream belongs to another context.
    pub fn launch_on(
        &self,
        stream: &CudaStream,
        args: &mut DecodeArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.launch_rows_on(stream, args, errors, false)
    }

    /// [`PagedAttentionKernel::launch_on`]; `long_rows` (the context
    /// call's head-dim-512 path, [`crate::ContextKernel`]) lifts the ragged
    /// `max_q_len` cap to [`crate::CONTEXT_MAX_Q_LEN`] and issues one launch
    /// per block of `⌊65535 / Hkv⌋` row tiles (`row_tile_base` apart) when
    /// the rows need more than one grid holds.
    pub(crate) fn launch_rows_on(
        &self,
        stream: &CudaStream,
        args: &mut DecodeArgs<'_>,
        errors: &mut DeviceErrors,
        long_rows: bool,
    ) -> Result<()> {
        self.kernel.gpu().require_stream(stream)?;
        let plan = plan_path(
            args,
            self.num_sms,
            self.path,
            true,
            long_rows,
            self.wide_mma,
        )?;
        let mut p = plan.params;
        if p.bs == 0 {
            return Ok(());
        }
        [p.q, p.out, p.k_cache, p.v_cache] = base_ptrs(stream, &args.q, &mut args.out, &args.kv)?;
        p.page_table = args.page_table.device_ptr(stream);
        p.cache_seqlens = args.cache_seqlens.device_ptr(stream);
        if let QueryLayout::Ragged { cu_seqlens_q, .. } = &args.layout {
            p.cu_seqlens_q = cu_seqlens_q.device_ptr(stream);
        }
        if let Some(s) = &args.sinks {
            p.sinks = s.device_ptr(stream);
        }
        if plan.workspace_elems > 0 {
            let ws = args
                .workspace
                .as_mut()
                .ok_or(KernelError::Capacity {
                    arg: "workspace",
                    needed: plan.workspace_elems,
                    available: 0,
                })?
                .device_ptr_mut(stream);
            if ws % 16 != 0 {
                return Err(stride_err(
                    "workspace",
                    format!("base address {ws:#x} is not 16-byte aligned"),
                ));
            }
            let items = p.work_items();
            let o_elems = items * p.max_splits as usize * ROWS_PER_CTA * plan.head_dim;
            p.ws_o = ws;
            p.ws_ml = ws + 4 * o_elems as u64;
        }
        if let Some(l) = &mut args.lse {
            p.lse = l.device_ptr_mut(stream);
        }
        if let Some(c) = &mut args.skipped_slices {
            if c.shape()[0] == 0 {
                return Err(KernelError::shape("skipped_slices", "[1]", "[0]"));
            }
            p.skip_counter = c.device_ptr_mut(stream);
        }
        p.errors = errors.device_ptr();
        // Every row tile holds at most 8 rows: the half-row entries apply.
        let half_rows = p.q_len * p.group <= 8;
        let experiment = (self.experiment != 0
            && (self.experiment & EXPERIMENT_HALF_ROWS == 0 || half_rows))
            .then(|| {
                self.kernel
                    .index(&format!("{}_x{}", plan.entry, self.experiment))
            })
            .flatten();
        let entry = experiment
            .or_else(|| self.kernel.index(&plan.entry))
            .ok_or_else(|| KernelError::unsupported("q", format!("no kernel {}", plan.entry)))?;
        // The pair loop's twin (its half-row form where `half_rows`); it has
        // no cluster-fold twin, so the match below leaves it unfolded.
        let entry = match self.pair_twins.get(&entry) {
            Some(&(full, half)) if self.pair_loop && experiment.is_none() => {
                if half_rows {
                    half
                } else {
                    full
                }
            }
            _ => entry,
        };
        let mut config = plan.config;
        if experiment.is_some() && self.experiment & 16 != 0 {
            // Experiment 16 writes a trace of 16 u32 a CTA through
            // `skipped_slices` (the kernel's docs): never past its end.
            if let Some(c) = &args.skipped_slices {
                let (x, y, z) = config.grid_dim;
                let need = 16 * x as usize * y as usize * z as usize;
                if c.shape()[0] < need {
                    return Err(KernelError::Capacity {
                        arg: "skipped_slices",
                        needed: need,
                        available: c.shape()[0],
                    });
                }
                if c.strides()[0] != 1 {
                    return Err(stride_err(
                        "skipped_slices",
                        "experiment 16's trace needs a contiguous buffer".into(),
                    ));
                }
            }
        }
        if experiment.is_some() {
            // An experiment entry may lay out its shared memory otherwise.
            config.shared_mem_bytes =
                mma_smem_bytes_xv(plan.head_dim, args.kv.dtype(), self.experiment) as u32;
        }
        // The splits of each work item as one cluster (gridDim.x =
        // max_splits, so the CTA rank is the split) on the entry's `_cf`
        // twin, where every item's cluster fits on the device at once.
        let (x, y, z) = config.grid_dim;
        let clusters = y as usize * z as usize;
        let (entry, cluster_x) = match self.cluster_fit.get(&entry) {
            Some(&(cf, fit))
                if self.cluster_fold
                    && experiment.is_none()
                    && (2..=CLUSTER_FOLD_MAX).contains(&(x as usize))
                    && args.max_seq_len.div_ceil(x as usize) <= CLUSTER_FOLD_MAX_CHUNK
                    && clusters <= fit[x as usize - 2] =>
            {
                (cf, x)
            }
            _ => (entry, 1),
        };
        // Longest requests first (not with the cluster fold: a cluster must
        // hold the splits of one item).
        p.length_order =
            i32::from(cluster_x == 1 && self.length_ordered(p.bs.max(0) as usize, p.work_items()));
        if let Some(u) = &args.unit_order {
            let bs = args.cache_seqlens.shape()[0];
            check_order_view("unit_order", u.shape()[0], u.strides()[0], bs)?;
            // Read only by ordered launches of one split (the kernel's
            // decode_unit); the others rank or use grid order.
            if self.reads_unit_order(&p) {
                p.unit_order = u.device_ptr(stream);
            }
        }
        // The row tiles in blocks of the grid's y extent (one block unless
        // `long_rows` needed more).
        let hkv = p.num_kv_heads.max(1) as usize;
        for (base, count) in row_tile_blocks(
            p.row_tiles.max(1) as usize,
            y as usize / hkv,
            self.launch_row_tiles,
        ) {
            p.row_tile_base = to_i32("max_q_len", base)?;
            config.grid_dim.1 = (hkv * count) as u32;
            // SAFETY: `validate` checked every shape and stride against the
            // buffers (Strided/StridedMut constructors), dtypes, head dim, group and
            // alignment, and the workspace size; device data (page ids, lengths,
            // cu_seqlens_q) is range-checked in the kernel; the params layout is
            // pinned; `row_tile_base + blockIdx.y / Hkv` stays below the
            // `row_tiles` the workspace was sized for. Every entry waits
            // (griddepcontrol.wait) before its first global access, as a PDL
            // launch requires.
            unsafe {
                self.kernel
                    .launch_clustered(stream, entry, config, &[&p], self.pdl(), cluster_x)
            }?;
            if cluster_x > 1 {
                self.cluster_launches.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_tile_blocks_cover_every_tile_once() {
        let blocks = |t, g, c| row_tile_blocks(t, g, c).collect::<Vec<_>>();
        // One launch when the grid holds them all (every decode launch).
        assert_eq!(blocks(7, 7, None), [(0, 7)]);
        assert_eq!(blocks(1, 1, None), [(0, 1)]);
        // Blocks of the grid's extent or the cap, the last one short.
        assert_eq!(blocks(7, 3, None), [(0, 3), (3, 3), (6, 1)]);
        assert_eq!(blocks(7, 7, Some(2)), [(0, 2), (2, 2), (4, 2), (6, 1)]);
        assert_eq!(
            blocks(6, 0, Some(0)),
            (0..6).map(|b| (b, 1)).collect::<Vec<_>>()
        );
        assert_eq!(blocks(0, 5, None), []);
        // Hkv 1, the largest grid: 2^24 row tiles (max_q_len 2^24, G 16).
        let v = blocks(1 << 24, 65_535, None);
        assert_eq!(v.len(), (1usize << 24).div_ceil(65_535));
        let mut next = 0;
        for &(base, n) in &v {
            assert_eq!(base, next);
            assert!((1..=65_535).contains(&n));
            next += n;
        }
        assert_eq!(next, 1 << 24);
    }

    #[test]
    fn experiment_entries_are_in_the_ptx_with_their_numbers() {
        for e in EXPERIMENT_ENTRIES {
            assert!(PTX.has_entry(e), "{e} missing from the PTX");
            let xv = entry_experiment(e);
            assert!(xv != 0 && e.ends_with(&format!("_x{xv}")), "{e}: {xv}");
        }
        let numbers: Vec<u32> = EXPERIMENT_ENTRIES
            .iter()
            .map(|e| entry_experiment(e))
            .collect();
        assert_eq!(numbers, [16, 256, 256, 1024, 5376, 4368]);
        for (q, kv, d) in mma_variants() {
            if pair_loop_variant(q, kv, d) {
                let name = mma_entry_name(q, kv, d);
                for twin in [PAIR_SUFFIX, PAIR_HALF_SUFFIX] {
                    assert!(PTX.has_entry(&format!("{name}{twin}")), "{name}{twin}");
                }
            }
        }
    }
}

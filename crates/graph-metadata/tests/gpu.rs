//! GPU tests of the graph-metadata family: the fused kernel equals the CPU
//! reference bit for bit (every output buffer whole, tails included, and the
//! error word), outputs poisoned before every eager launch; CUDA-graph
//! capture + replay with the bucket's buffers carried across replays; one
//! launch per update. Ignored at run time without a GPU (kernel-rt's
//! libtest-mimic harness).

mod common;

use std::sync::Arc;

use common::{
    case_with_page_map, draft_decode_case, padded_decode_case, ragged_case, spec_case_7, spec_map,
    spec_rows, target_verify_case, write_loc_case, Case, POISON,
};
use graph_metadata::reference::{update_graph_metadata, HostOutputs};
use graph_metadata::{
    prepare_replay, GraphMetadataArgs, GraphMetadataKernel, GraphMode, SwaArgs, SwaWriteLocs,
};
use kernel_rt::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUgraphNodeType, CUresult, CUstreamCaptureMode,
};
use kernel_rt::cudarc::driver::{sys, CudaGraph, CudaSlice};
use kernel_rt::testing::{gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::{rngs::StdRng, Rng, SeedableRng};

const GPU_CASES: u32 = 2_500;
const REPLAYS: usize = 200;

/// The device buffers of one case (inputs and outputs).
struct Dev {
    rpi: CudaSlice<i64>,
    seq: CudaSlice<i64>,
    r2t: CudaSlice<i32>,
    qlens: CudaSlice<i32>,
    map: CudaSlice<i64>,
    page_map: CudaSlice<i32>,
    locs: CudaSlice<i64>,
    cache: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    cu_q: CudaSlice<i32>,
    pt: CudaSlice<i32>,
    swa_pt: CudaSlice<i32>,
    swa_out: CudaSlice<i64>,
}

impl Dev {
    /// Uploads the case's inputs and `init` as the outputs' contents.
    fn new(gpu: &Arc<Gpu>, c: &Case, init: &HostOutputs) -> Result<Self, KernelError> {
        let empty: &[i64] = &[];
        Ok(Self {
            rpi: upload(gpu, &c.rpi)?,
            seq: upload(gpu, &c.seq_lens)?,
            r2t: upload(gpu, &c.r2t)?,
            qlens: upload(gpu, c.qlens.as_deref().unwrap_or(&[]))?,
            map: upload(gpu, c.map.as_deref().unwrap_or(empty))?,
            page_map: upload(gpu, c.page_map.as_deref().unwrap_or(&[]))?,
            locs: upload(
                gpu,
                c.write_locs
                    .as_ref()
                    .and_then(|w| w.0.as_deref())
                    .unwrap_or(empty),
            )?,
            cache: upload(gpu, &init.cache_seqlens)?,
            cu_k: upload(gpu, &init.cu_seqlens_k)?,
            cu_q: upload(gpu, init.cu_seqlens_q.as_deref().unwrap_or(&[]))?,
            pt: upload(gpu, &init.page_table)?,
            swa_pt: upload(gpu, init.swa_page_table.as_deref().unwrap_or(&[]))?,
            swa_out: upload(gpu, init.swa_out_cache_loc.as_deref().unwrap_or(empty))?,
        })
    }

    /// Typed views of the case's shapes over these buffers.
    fn args(&mut self, c: &Case) -> Result<GraphMetadataArgs<'_>, KernelError> {
        let bs = c.bs();
        let table = [bs, c.m];
        let strides = [c.pt_stride, 1];
        let swa = match &c.map {
            None => None,
            Some(map) => Some(SwaArgs {
                swa_mapping: Strided::contiguous(
                    "swa_mapping",
                    self.map.slice(0..map.len()),
                    [map.len()],
                )?,
                full_page_to_swa_page: match &c.page_map {
                    Some(pm) if c.swa_table => Some(Strided::contiguous(
                        "full_page_to_swa_page",
                        self.page_map.slice(0..pm.len()),
                        [pm.len()],
                    )?),
                    _ => None,
                },
                swa_page_table: if c.swa_table {
                    Some(StridedMut::new(
                        "swa_page_table",
                        self.swa_pt.as_view_mut(),
                        table,
                        strides,
                    )?)
                } else {
                    None
                },
                write_locs: match &c.write_locs {
                    None => None,
                    Some((locs, n_swa)) => Some(SwaWriteLocs {
                        out_cache_loc: match locs {
                            None => None,
                            Some(l) => Some(Strided::contiguous(
                                "out_cache_loc",
                                self.locs.slice(0..l.len()),
                                [l.len()],
                            )?),
                        },
                        swa_out_cache_loc: StridedMut::contiguous(
                            "swa_out_cache_loc",
                            self.swa_out.slice_mut(0..*n_swa),
                            [*n_swa],
                        )?,
                    }),
                },
            }),
        };
        Ok(GraphMetadataArgs {
            mode: c.mode,
            req_pool_indices: Strided::contiguous("req_pool_indices", self.rpi.slice(0..bs), [bs])?,
            seq_lens: Strided::contiguous("seq_lens", self.seq.slice(0..bs), [bs])?,
            req_to_token: Strided::new(
                "req_to_token",
                self.r2t.as_view(),
                [c.rows, c.width],
                [c.r2t_stride, 1],
            )?,
            page_size: c.p,
            pool_slots: c.pool_slots,
            cache_seqlens: StridedMut::contiguous(
                "cache_seqlens",
                self.cache.slice_mut(0..bs),
                [bs],
            )?,
            cu_seqlens_k: StridedMut::contiguous(
                "cu_seqlens_k",
                self.cu_k.slice_mut(0..bs + 1),
                [bs + 1],
            )?,
            cu_seqlens_q: if c.cu_q {
                Some(StridedMut::contiguous(
                    "cu_seqlens_q",
                    self.cu_q.slice_mut(0..bs + 1),
                    [bs + 1],
                )?)
            } else {
                None
            },
            qlens: match &c.qlens {
                Some(q) => Some(Strided::contiguous(
                    "qlens",
                    self.qlens.slice(0..q.len()),
                    [q.len()],
                )?),
                None => None,
            },
            page_table: StridedMut::new("page_table", self.pt.as_view_mut(), table, strides)?,
            swa,
        })
    }

    /// Copies the outputs back, shaped like `like`.
    fn read(&self, gpu: &Arc<Gpu>, like: &HostOutputs) -> Result<HostOutputs, KernelError> {
        let s = gpu.stream();
        let cut = |mut v: Vec<i32>, n: usize| {
            v.truncate(n);
            v
        };
        let mut out = like.clone();
        out.cache_seqlens = cut(s.clone_dtoh(&self.cache)?, like.cache_seqlens.len());
        out.cu_seqlens_k = cut(s.clone_dtoh(&self.cu_k)?, like.cu_seqlens_k.len());
        if let Some(q) = &like.cu_seqlens_q {
            out.cu_seqlens_q = Some(cut(s.clone_dtoh(&self.cu_q)?, q.len()));
        }
        out.page_table = cut(s.clone_dtoh(&self.pt)?, like.page_table.len());
        if let Some(t) = &like.swa_page_table {
            out.swa_page_table = Some(cut(s.clone_dtoh(&self.swa_pt)?, t.len()));
        }
        if let Some(o) = &like.swa_out_cache_loc {
            let mut v = s.clone_dtoh(&self.swa_out)?;
            v.truncate(o.len());
            out.swa_out_cache_loc = Some(v);
        }
        Ok(out)
    }

    /// Overwrites the per-replay inputs in place (stream-ordered copies).
    fn refill(
        &mut self,
        gpu: &Arc<Gpu>,
        rpi: &[i64],
        seq: &[i64],
        locs: &[i64],
    ) -> Result<(), KernelError> {
        let s = gpu.stream();
        s.memcpy_htod(rpi, &mut self.rpi)?;
        s.memcpy_htod(seq, &mut self.seq)?;
        if !locs.is_empty() {
            s.memcpy_htod(locs, &mut self.locs)?;
        }
        Ok(())
    }
}

/// First difference between two output sets, named.
fn diff(got: &HostOutputs, want: &HostOutputs) -> Option<String> {
    fn first<T: PartialEq + std::fmt::Debug>(name: &str, a: &[T], b: &[T]) -> Option<String> {
        if a.len() != b.len() {
            return Some(format!("{name}: length {} vs {}", a.len(), b.len()));
        }
        let i = a.iter().zip(b).position(|(x, y)| x != y)?;
        Some(format!(
            "{name}[{i}]: gpu {:?} vs reference {:?}",
            a[i], b[i]
        ))
    }
    first("cache_seqlens", &got.cache_seqlens, &want.cache_seqlens)
        .or_else(|| first("cu_seqlens_k", &got.cu_seqlens_k, &want.cu_seqlens_k))
        .or_else(|| {
            first(
                "cu_seqlens_q",
                got.cu_seqlens_q.as_deref().unwrap_or(&[]),
                want.cu_seqlens_q.as_deref().unwrap_or(&[]),
            )
        })
        .or_else(|| first("page_table", &got.page_table, &want.page_table))
        .or_else(|| {
            first(
                "swa_page_table",
                got.swa_page_table.as_deref().unwrap_or(&[]),
                want.swa_page_table.as_deref().unwrap_or(&[]),
            )
        })
        .or_else(|| {
            first(
                "swa_out_cache_loc",
                got.swa_out_cache_loc.as_deref().unwrap_or(&[]),
                want.swa_out_cache_loc.as_deref().unwrap_or(&[]),
            )
        })
}

/// One eager launch into poisoned outputs.
fn run_eager(
    gpu: &Arc<Gpu>,
    kernel: &GraphMetadataKernel,
    c: &Case,
) -> Result<(HostOutputs, ErrorReport), String> {
    let init = c.poisoned();
    let mut dev = Dev::new(gpu, c, &init).or_fail("upload")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
    {
        let mut args = dev.args(c).or_fail("views")?;
        kernel.launch(&mut args, &mut errors).or_fail("launch")?;
    }
    let out = dev.read(gpu, &init).or_fail("read")?;
    Ok((out, errors.read().or_fail("error word")?))
}

/// GPU == reference: whole buffers (tails must stay poisoned) and error word.
fn check(gpu: &Arc<Gpu>, kernel: &GraphMetadataKernel, c: &Case) -> Result<HostOutputs, String> {
    let (want, want_err) = c.reference();
    let (got, got_err) = run_eager(gpu, kernel, c)?;
    if let Some(d) = diff(&got, &want) {
        return Err(format!("{d} ({c:?})"));
    }
    if got_err != want_err {
        return Err(format!(
            "error word: gpu {got_err:?} vs reference {want_err:?} ({c:?})"
        ));
    }
    Ok(got)
}

/// Both SWA page-table paths on the page-granular variant of `c`
/// ([`Case::granular`]): the slot-map launch and the page-map launch each
/// equal the reference bit for bit (every buffer, error word), and the two
/// references — so the two launches — are identical.
fn check_both_paths(
    gpu: &Arc<Gpu>,
    kernel: &GraphMetadataKernel,
    c: &Case,
) -> Result<(HostOutputs, HostOutputs), String> {
    let slot_case = c.granular();
    let page_case = slot_case.clone().with_page_map();
    let (slot_ref, slot_err) = slot_case.reference();
    let (page_ref, page_err) = page_case.reference();
    if let Some(d) = diff(&page_ref, &slot_ref) {
        return Err(format!(
            "reference: page-map path vs slot-map path: {d} ({page_case:?})"
        ));
    }
    if page_err != slot_err {
        return Err(format!(
            "reference error word: page-map path {page_err:?} vs slot-map path {slot_err:?} ({page_case:?})"
        ));
    }
    let slot = check(gpu, kernel, &slot_case).map_err(|e| format!("slot-map path: {e}"))?;
    let page = check(gpu, kernel, &page_case).map_err(|e| format!("page-map path: {e}"))?;
    if let Some(d) = diff(&page, &slot) {
        return Err(format!("gpu: page-map path vs slot-map path: {d}"));
    }
    Ok((slot, page))
}

/// Number of nodes of a captured graph, and how many are kernel nodes.
fn graph_nodes(graph: &CudaGraph) -> Result<(usize, usize), String> {
    let mut n = 0usize;
    // SAFETY: the graph handle is live (owned by `graph`); a null node array
    // asks only for the count.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut n) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!("cuGraphGetNodes: {r:?}"));
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries, as the driver was told.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), nodes.as_mut_ptr(), &mut n) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!("cuGraphGetNodes: {r:?}"));
    }
    let mut kernels = 0;
    for node in nodes.iter().take(n) {
        let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` was just returned by the driver for this live graph.
        let r = unsafe { sys::cuGraphNodeGetType(*node, &mut t) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("cuGraphNodeGetType: {r:?}"));
        }
        kernels += usize::from(t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL);
    }
    Ok((n, kernels))
}

/// Captures one update of `c`'s shapes over `dev`; checks it is one launcher
/// call and one kernel node.
fn capture(
    gpu: &Arc<Gpu>,
    kernel: &GraphMetadataKernel,
    dev: &mut Dev,
    c: &Case,
    errors: &mut DeviceErrors,
) -> Result<CudaGraph, String> {
    let stream = gpu.stream();
    stream.synchronize().or_fail("sync")?;
    let before = kernel.launches();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .or_fail("begin_capture")?;
    let launched = dev
        .args(c)
        .or_fail("views")
        .and_then(|mut a| kernel.launch(&mut a, errors).or_fail("launch"));
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .or_fail("end_capture")?;
    launched?;
    let graph = graph.ok_or("capture produced no graph")?;
    if kernel.launches() != before + 1 {
        return Err(format!(
            "capture made {} launcher calls, want 1",
            kernel.launches() - before
        ));
    }
    let (nodes, kernels) = graph_nodes(&graph)?;
    if (nodes, kernels) != (1, 1) {
        return Err(format!(
            "graph has {nodes} node(s), {kernels} kernel node(s); want exactly one kernel node"
        ));
    }
    Ok(graph)
}

/// The eager ("capture pass") launch and a replay of the captured launch
/// give the reference, for the same inputs.
fn eager_and_replayed(gpu: &Arc<Gpu>, c: &Case) -> Result<HostOutputs, String> {
    let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
    let eager = check(gpu, &kernel, c)?;
    let (want, want_err) = c.reference();
    let init = c.poisoned();
    let mut dev = Dev::new(gpu, c, &init).or_fail("upload")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
    let graph = capture(gpu, &kernel, &mut dev, c, &mut errors)?;
    graph.launch().or_fail("replay")?;
    let got = dev.read(gpu, &init).or_fail("read")?;
    if let Some(d) = diff(&got, &want) {
        return Err(format!("replayed: {d}"));
    }
    let err = errors.read().or_fail("error word")?;
    if err != want_err {
        return Err(format!("replayed error word {err:?} vs {want_err:?}"));
    }
    Ok(eager)
}

fn expect<T: PartialEq + std::fmt::Debug + ?Sized>(
    what: &str,
    got: &T,
    want: &T,
) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

/// Capture once for bs = 8 with zeroed inputs and zeroed outputs (as the
/// backend's graph state), then replay `REPLAYS` random batches of 1..=8
/// real rows, inputs rewritten in place before each replay; every replay's
/// buffers equal a CPU model carried across replays, bit for bit.
fn graph_replay(gpu: &Arc<Gpu>, mode: GraphMode, seed: u64) -> Result<(), String> {
    const BS: usize = 8;
    const ROWS: usize = 12;
    let (p, m) = (16usize, 8usize);
    let width = p * m;
    let pool = 4096usize;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rows = vec![vec![0i32; width]];
    for _ in 1..ROWS {
        rows.push(
            (0..width)
                .map(|_| rng.gen_range(p as i32..pool as i32))
                .collect(),
        );
    }
    let mut map: Vec<i64> = (0..pool + p)
        .map(|_| {
            if rng.gen_bool(0.2) {
                0
            } else {
                rng.gen_range(p as i64..2048)
            }
        })
        .collect();
    map[0] = 0;
    map.push(-1);
    let tokens = mode.num_tokens(BS);
    let zero_case = Case::new(mode, &rows, &[0; BS], &[0; BS], p, m)
        .with_swa(map, Some((Some(vec![0; tokens]), tokens)));
    let mut model = HostOutputs::filled(BS, m, true, true, Some(tokens), 0);
    let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
    let mut dev = Dev::new(gpu, &zero_case, &model).or_fail("upload")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
    let graph = capture(gpu, &kernel, &mut dev, &zero_case, &mut errors)?;
    let max_len = (p * m) as i64 - mode.seqlen_offset();
    for replay in 0..REPLAYS {
        let raw_bs = rng.gen_range(1..=BS);
        let rpi: Vec<i64> = (0..raw_bs).map(|_| rng.gen_range(1..ROWS as i64)).collect();
        let seq: Vec<i64> = (0..raw_bs).map(|_| rng.gen_range(1..=max_len)).collect();
        let locs: Vec<i64> = (0..raw_bs * mode.q_stride() as usize)
            .map(|_| rng.gen_range(1..pool as i64))
            .collect();
        let prep = prepare_replay(BS, tokens, &rpi, &seq, &locs).or_fail("prepare")?;
        dev.refill(
            gpu,
            &prep.req_pool_indices,
            &prep.seq_lens,
            &prep.out_cache_loc,
        )
        .or_fail("refill")?;
        graph.launch().or_fail("replay")?;
        let got = dev.read(gpu, &model).or_fail("read")?;
        let mut c = zero_case.clone();
        c.rpi = prep.req_pool_indices;
        c.seq_lens = prep.seq_lens;
        c.write_locs = Some((Some(prep.out_cache_loc), tokens));
        let err = update_graph_metadata(&c.inputs(), &mut model);
        if !err.is_clean() {
            return Err(format!(
                "replay {replay}: test inputs should be valid, reference counted {err:?}"
            ));
        }
        if let Some(d) = diff(&got, &model) {
            return Err(format!("{mode:?} replay {replay} (raw_bs {raw_bs}): {d}"));
        }
    }
    let err = errors.read().or_fail("error word")?;
    if !err.is_clean() {
        return Err(format!(
            "device error word after {REPLAYS} replays: {err:?}"
        ));
    }
    if kernel.launches() != 1 {
        return Err(format!(
            "{} launcher calls for one capture + {REPLAYS} replays",
            kernel.launches()
        ));
    }
    println!("graph_replay {mode:?}: {REPLAYS} replays bit-exact, 1 kernel node, 1 launcher call");
    Ok(())
}

/// A large bucket (the proptest stays at bs ≤ 12, M ≤ 20): `bs` rows over
/// `bs + 1` request rows of width `P·M`, lengths uniform in `[0, P·M + P]`
/// with full rows, row 0 all zeros, a few bad request indices, negative slots
/// and slots past the pool; the SWA map holds -1, 0 and entries past
/// `i32::MAX` (their 64-bit page path); `pool_slots` checked.
fn large_case(seed: u64, bs: usize, p: usize, m: usize, swa: bool) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let width = p * m;
    let rows = bs + 1;
    let pool = 64 * 1024usize;
    let mut r2t = vec![0i32; width];
    for _ in 1..rows {
        r2t.extend((0..width).map(|_| match rng.gen_range(0..2000) {
            0 => -5,
            1 => (pool + 3) as i32,
            _ => rng.gen_range(0..pool as i32),
        }));
    }
    let pm = (p * m) as i64;
    let seq_lens: Vec<i64> = (0..bs)
        .map(|_| match rng.gen_range(0..8) {
            0 => pm,
            1 => pm + p as i64,
            _ => rng.gen_range(0..=pm),
        })
        .collect();
    let rpi: Vec<i64> = (0..bs)
        .map(|_| match rng.gen_range(0..100) {
            0 => -1,
            1 => rows as i64,
            _ => rng.gen_range(0..rows as i64),
        })
        .collect();
    let mut c = Case::new(GraphMode::Decode, &[], &rpi, &seq_lens, p, m);
    c.r2t = r2t;
    c.rows = rows;
    c.width = width;
    c.r2t_stride = width;
    c.pt_stride = m + 3;
    c.pool_slots = Some(pool);
    if swa {
        let mut map: Vec<i64> = (0..pool + p)
            .map(|_| match rng.gen_range(0..50) {
                0 => -1,
                1 => 0,
                2 => rng.gen_range(1i64 << 31..1i64 << 40),
                _ => rng.gen_range(0..pool as i64),
            })
            .collect();
        map.push(-1);
        let n_swa = bs + 5;
        let locs: Vec<i64> = (0..bs).map(|_| rng.gen_range(0..pool as i64)).collect();
        c = c.with_swa(map, Some((Some(locs), n_swa)));
    }
    c
}

/// An arbitrary full page → SWA page map for a large case: shorter than the
/// pool's pages (the last pages' slots count as outside the map), entries
/// mostly valid SWA pages, some 0, −1, −9 and `i32::MAX`.
fn random_page_map(seed: u64, c: &Case) -> Vec<i32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let pages = c
        .pool_slots
        .unwrap_or(1)
        .div_ceil(c.p)
        .saturating_sub(2)
        .max(1);
    (0..pages)
        .map(|_| match rng.gen_range(0..50) {
            0 => -1,
            1 => -9,
            2 => i32::MAX,
            3..=9 => 0,
            _ => rng.gen_range(1..pages as i32 + 1),
        })
        .collect()
}

/// GPU == reference for large buckets: many page blocks per row, several
/// pages per thread, rows interleaved over blocks, P a power of two or not,
/// with and without the SWA table; with the SWA table also through the page
/// map (an arbitrary one, and both paths on the page-granular variant).
fn large_buckets(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
    let shapes: [(usize, usize, usize); 7] = [
        (256, 16, 512),
        (3, 1, 5000),
        (1, 1, 300_000),
        (600, 7, 800),
        (2000, 64, 40),
        (37, 3, 3000),
        (1100, 16, 300),
    ];
    let mut seed = 11u64;
    let mut with_errors = 0;
    let mut page_map_cases = 0;
    for (bs, p, m) in shapes {
        for swa in [false, true] {
            seed += 1;
            let c = large_case(seed, bs, p, m, swa);
            let (want, want_err) = c.reference();
            let (got, got_err) = run_eager(gpu, &kernel, &c)?;
            let what = format!("bs {bs}, P {p}, M {m}, swa {swa}");
            if let Some(d) = diff(&got, &want) {
                return Err(format!("{what}: {d}"));
            }
            if got_err != want_err {
                return Err(format!(
                    "{what}: error word gpu {got_err:?} vs reference {want_err:?}"
                ));
            }
            // A small bucket may draw no bad data (bs 1 often samples the
            // all-zero row 0); the set as a whole must exercise the error path.
            with_errors += usize::from(!want_err.is_clean());
            if swa {
                let mut pc = c.clone();
                pc.page_map = Some(random_page_map(seed + 1000, &c));
                let (want, want_err) = pc.reference();
                let (got, got_err) = run_eager(gpu, &kernel, &pc)?;
                if let Some(d) = diff(&got, &want) {
                    return Err(format!("{what}, arbitrary page map: {d}"));
                }
                if got_err != want_err {
                    return Err(format!(
                        "{what}, arbitrary page map: error word gpu {got_err:?} vs reference {want_err:?}"
                    ));
                }
                check_both_paths(gpu, &kernel, &c)
                    .map_err(|e| format!("{what}, page-granular map: {e}"))?;
                page_map_cases += 3;
            }
        }
    }
    if with_errors < shapes.len() {
        return Err(format!(
            "only {with_errors} of {} cases counted bad data: the generator no longer exercises the error path",
            2 * shapes.len()
        ));
    }
    println!(
        "large_buckets_match_reference: {} cases, {with_errors} with bad data counted; {page_map_cases} more launches for the SWA page map",
        2 * shapes.len()
    );
    Ok(())
}

fn main() {
    let trials = vec![
        gpu_trial("large_buckets_match_reference", large_buckets),
        gpu_trial("gpu_matches_reference_proptest", |gpu| {
            let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
            let mut runner = TestRunner::new(Config {
                cases: GPU_CASES,
                failure_persistence: None,
                ..Config::default()
            });
            let page_launches = std::cell::Cell::new(0u64);
            runner
                .run(&case_with_page_map(), |c| {
                    // 1. The slot-map path (the case as drawn).
                    let mut slot = c.clone();
                    slot.page_map = None;
                    check(gpu, &kernel, &slot).map_err(TestCaseError::fail)?;
                    if c.page_map.is_some() {
                        // 2. An arbitrary page map: page-map path == reference.
                        check(gpu, &kernel, &c)
                            .map_err(|e| TestCaseError::fail(format!("page-map path: {e}")))?;
                        // 3. Page-granular variant: both paths == reference,
                        //    and identical to each other.
                        check_both_paths(gpu, &kernel, &c).map_err(TestCaseError::fail)?;
                        page_launches.set(page_launches.get() + 2);
                    }
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
            println!(
                "gpu_matches_reference_proptest: {GPU_CASES} cases, {} launches ({} through the SWA page map)",
                kernel.launches(),
                page_launches.get()
            );
            Ok(())
        }),
        gpu_trial("page_map_and_slot_map_give_identical_tables", |gpu| {
            let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
            // The spec's map (page-granular): full pages 3→1, 2→2, 10→3, 5→4, 9→5.
            let spec = spec_case_7(&[1, 2, 0, 0]);
            let (slot, page) = check_both_paths(gpu, &kernel, &spec)?;
            for out in [&slot, &page] {
                for (row, want) in [&[1, 0, 2][..], &[4], &[0], &[0]].iter().enumerate() {
                    expect("SWA page row", out.swa_page_row(row, want.len()), want)?;
                }
            }
            // Large buckets, P a power of two or not, many pages per thread.
            let mut mapped = 0usize;
            for (seed, bs, p, m) in [(91, 256, 16, 512), (92, 64, 1, 3000), (93, 300, 7, 200)] {
                let c = large_case(seed, bs, p, m, true);
                let (_, page) = check_both_paths(gpu, &kernel, &c)
                    .map_err(|e| format!("bs {bs}, P {p}, M {m}: {e}"))?;
                mapped += page
                    .swa_page_table
                    .as_deref()
                    .unwrap_or(&[])
                    .iter()
                    .filter(|&&v| v > 0)
                    .count();
            }
            if mapped == 0 {
                return Err("no mapped SWA page in the large cases: the test is vacuous".into());
            }
            println!("page_map_and_slot_map_give_identical_tables: 4 buckets, {mapped} mapped SWA pages, identical");
            Ok(())
        }),
        gpu_trial("graph_replay_decode", |gpu| {
            graph_replay(gpu, GraphMode::Decode, 1)
        }),
        gpu_trial("graph_replay_draft_decode", |gpu| {
            graph_replay(gpu, GraphMode::DraftDecode { step: 1 }, 2)
        }),
        gpu_trial("graph_replay_target_verify", |gpu| {
            graph_replay(gpu, GraphMode::TargetVerify { q_len: 3 }, 3)
        }),
        gpu_trial("graph_replay_draft_extend_v2", |gpu| {
            graph_replay(gpu, GraphMode::DraftExtendV2 { q_len: 2 }, 4)
        }),
        gpu_trial("must_pass_padded_decode", |gpu| {
            let out = eager_and_replayed(gpu, &padded_decode_case())?;
            expect("cache_seqlens", &out.cache_seqlens[..], &[5, 3, 4, 1])?;
            expect("cu_seqlens_k", &out.cu_seqlens_k[..], &[0, 5, 8, 12, 13])?;
            expect("row 3 page row", out.page_row(3, 1), &[0])
        }),
        gpu_trial("must_pass_draft_decode", |gpu| {
            let out = eager_and_replayed(gpu, &draft_decode_case(1))?;
            expect("cache_seqlens", &out.cache_seqlens[..], &[7, 9])?;
            expect("cu_seqlens_k", &out.cu_seqlens_k[..], &[0, 7, 16])?;
            expect(
                "cu_seqlens_q",
                out.cu_seqlens_q.as_deref().unwrap_or(&[]),
                &[0, 1, 2],
            )?;
            expect("row 0 page 2 untouched", &out.page_table[2], &POISON)?;
            expect("row 1 page 3 untouched", &out.page_table[6 + 3], &POISON)?;
            let out = eager_and_replayed(gpu, &draft_decode_case(0))?;
            expect("step 0 cache_seqlens", &out.cache_seqlens[..], &[6, 8])
        }),
        gpu_trial("must_pass_target_verify_uses_captured_shape", |gpu| {
            let out = eager_and_replayed(gpu, &target_verify_case())?;
            expect("cache_seqlens", &out.cache_seqlens[..], &[7, 5])?;
            expect(
                "cu_seqlens_q",
                out.cu_seqlens_q.as_deref().unwrap_or(&[]),
                &[0, 3, 6],
            )
        }),
        gpu_trial("must_pass_swa_write_locations", |gpu| {
            let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
            let first = write_loc_case(&[12, 13, 16, 17]);
            let init = HostOutputs::filled(4, first.m, true, true, Some(4), 0);
            let mut dev = Dev::new(gpu, &first, &init).or_fail("upload")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            let graph = capture(gpu, &kernel, &mut dev, &first, &mut errors)?;
            graph.launch().or_fail("replay")?;
            let out = dev.read(gpu, &init).or_fail("read")?;
            expect(
                "replay 1",
                out.swa_out_cache_loc.as_deref().unwrap_or(&[]),
                &[20, 21, 4, 5],
            )?;
            let second = write_loc_case(&[14, 18]);
            let locs = second
                .write_locs
                .as_ref()
                .and_then(|w| w.0.clone())
                .unwrap_or_default();
            expect("padded out_cache_loc", &locs[..], &[14, 18, 0, 0])?;
            dev.refill(gpu, &second.rpi, &second.seq_lens, &locs)
                .or_fail("refill")?;
            graph.launch().or_fail("replay")?;
            let out = dev.read(gpu, &init).or_fail("read")?;
            expect(
                "replay 2",
                out.swa_out_cache_loc.as_deref().unwrap_or(&[]),
                &[22, 6, 0, 0],
            )?;
            expect(
                "error word",
                &errors.read().or_fail("error word")?,
                &ErrorReport::default(),
            )
        }),
        gpu_trial("spec_edge_cases_7_to_13_and_18", |gpu| {
            let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
            let sr = spec_rows();
            let cases = vec![
                spec_case_7(&[1, 2, 0, 0]),
                spec_case_7(&[1, 2, 1, 1]),
                Case::new(
                    GraphMode::DraftDecode { step: 1 },
                    &sr,
                    &[1, 2],
                    &[10, 4],
                    4,
                    4,
                )
                .with_swa(spec_map(), None),
                Case::new(
                    GraphMode::TargetVerify { q_len: 3 },
                    &sr,
                    &[1, 2],
                    &[10, 4],
                    4,
                    4,
                )
                .with_swa(spec_map(), None),
                Case::new(
                    GraphMode::DraftExtendV2 { q_len: 3 },
                    &sr,
                    &[1, 2],
                    &[13, 7],
                    4,
                    4,
                ),
                Case::new(GraphMode::Decode, &sr, &[1], &[4], 4, 4)
                    .with_swa(spec_map(), Some((Some(vec![-1, 23, 29]), 5))),
                Case::new(
                    GraphMode::Decode,
                    &[(100..124).collect()],
                    &[0],
                    &[17],
                    4,
                    4,
                ),
                ragged_case(),
            ];
            for c in &cases {
                check(gpu, &kernel, c)?;
            }
            let out = check(gpu, &kernel, &cases[0])?;
            expect(
                "case 7 swa_out",
                out.swa_out_cache_loc.as_deref().unwrap_or(&[]),
                &[9, 19, 0, 0, 0, 0],
            )?;
            // Case 13: bs 0 launches nothing and writes nothing.
            let before = kernel.launches();
            let empty = Case::new(GraphMode::Decode, &sr, &[], &[], 4, 4)
                .with_swa(spec_map(), Some((Some(vec![9]), 2)));
            check(gpu, &kernel, &empty)?;
            expect("launches for bs 0", &(kernel.launches() - before), &0)
        }),
        gpu_trial("one_launch_per_update", |gpu| {
            let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
            let c = spec_case_7(&[1, 2, 0, 0]);
            let mut dev = Dev::new(gpu, &c, &c.poisoned()).or_fail("upload")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            for i in 1..=5u64 {
                let mut args = dev.args(&c).or_fail("views")?;
                kernel.launch(&mut args, &mut errors).or_fail("launch")?;
                expect("eager launcher calls", &kernel.launches(), &i)?;
            }
            // Under a graph: one kernel node, and replays make no launcher call.
            let graph = capture(gpu, &kernel, &mut dev, &c, &mut errors)?;
            for _ in 0..10 {
                graph.launch().or_fail("replay")?;
            }
            gpu.synchronize().or_fail("sync")?;
            expect(
                "launcher calls after capture + 10 replays",
                &kernel.launches(),
                &6,
            )
        }),
        gpu_trial("bad_arguments_are_errors_before_launch", |gpu| {
            let kernel = GraphMetadataKernel::new(gpu).or_fail("load")?;
            let c = spec_case_7(&[1, 2, 0, 0]);
            let mut dev = Dev::new(gpu, &c, &c.poisoned()).or_fail("upload")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            let mut short = gpu.stream().alloc_zeros::<i32>(1).or_fail("alloc")?;
            let pages = gpu.stream().alloc_zeros::<i32>(13).or_fail("alloc")?;
            let mut args = dev.args(&c).or_fail("views")?;
            args.page_size = 0;
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Unsupported {
                    arg: "page_size", ..
                }) => {}
                other => return Err(format!("expected page_size to be rejected, got {other:?}")),
            }
            args.page_size = 4;
            args.mode = GraphMode::RaggedVerify { max_q_len: 2 };
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Unsupported { arg: "qlens", .. }) => {}
                other => {
                    return Err(format!(
                        "expected missing qlens to be rejected, got {other:?}"
                    ))
                }
            }
            args.mode = GraphMode::Decode;
            // A page map without an SWA page table to fill.
            let table = {
                let swa = args.swa.as_mut().ok_or("spec case 7 binds SWA")?;
                swa.full_page_to_swa_page =
                    Some(Strided::of("full_page_to_swa_page", &pages, [13]).or_fail("view")?);
                swa.swa_page_table.take()
            };
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Unsupported {
                    arg: "full_page_to_swa_page",
                    ..
                }) => {}
                other => {
                    return Err(format!(
                        "expected a page map without an SWA table to be rejected, got {other:?}"
                    ))
                }
            }
            if let Some(swa) = args.swa.as_mut() {
                swa.swa_page_table = table;
                swa.full_page_to_swa_page = None;
            }
            args.cu_seqlens_k = StridedMut::of("cu_seqlens_k", &mut short, [1]).or_fail("view")?;
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Shape {
                    arg: "cu_seqlens_k",
                    ..
                }) => {}
                other => {
                    return Err(format!(
                        "expected cu_seqlens_k [bs+1] to be required, got {other:?}"
                    ))
                }
            }
            expect("launches after rejected calls", &kernel.launches(), &0)
        }),
    ];
    run_trials(trials)
}

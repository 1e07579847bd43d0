//! GPU tests of the swa-pool family: both kernels equal the CPU reference bit
//! for bit (outputs and error word), outputs poisoned before every launch and
//! guard elements past each view checked unchanged. Ignored at run time
//! without a GPU (kernel-rt's libtest-mimic harness).

use std::sync::Arc;

use kernel_rt::testing::{gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use swa_pool::reference::{translate_locs, translate_pages, update_pages, PageInputs};
use swa_pool::{
    EvictionPolicy, SwaLocArgs, SwaLocKernel, SwaMapping, SwaPageArgs, SwaPageKernel,
    SwaUpdateArgs, SwaUpdateKernel,
};

const POISON32: i32 = -0x5A5A_5A5A;
const POISON64: i64 = -0x5A5A_5A5A_5A5A_5A5A;
const LOC_CASES: u32 = 2_500;
const PAGE_CASES: u32 = 2_000;
/// Poisoned elements after every output view, checked unchanged.
const GUARD: usize = 8;

fn first_diff<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ---- token-location translation ------------------------------------------------

/// One location launch: the input sits at `offset` inside its buffer (any
/// 8-byte alignment), the output is `[n + tail]` followed by a guard.
#[derive(Debug, Clone)]
struct LocCase {
    map: Vec<i64>,
    locs: Vec<i64>,
    offset: usize,
    tail: usize,
}

impl LocCase {
    fn out_len(&self) -> usize {
        self.locs.len() + self.tail
    }

    /// Whole output buffer (view + guard) as the reference leaves it.
    fn reference(&self) -> (Vec<i64>, ErrorReport) {
        let mut out = vec![POISON64; self.out_len() + GUARD];
        let err = translate_locs(&self.map, &self.locs, &mut out[..self.out_len()]);
        (out, err)
    }

    fn gpu(
        &self,
        gpu: &Arc<Gpu>,
        kernel: &SwaLocKernel,
    ) -> Result<(Vec<i64>, ErrorReport), KernelError> {
        let s = gpu.stream();
        let mut padded = vec![7i64; self.offset];
        padded.extend(&self.locs);
        let input = upload(gpu, &padded)?;
        let map = upload(gpu, &self.map)?;
        let mut out = s.clone_htod(&vec![POISON64; self.out_len() + GUARD])?;
        let mut errors = DeviceErrors::new(gpu)?;
        let n = self.locs.len();
        let mut args = SwaLocArgs {
            out_cache_loc: Strided::contiguous(
                "out_cache_loc",
                input.slice(self.offset..self.offset + n),
                [n],
            )?,
            full_to_swa: Strided::contiguous(
                "full_to_swa",
                map.slice(0..self.map.len()),
                [self.map.len()],
            )?,
            swa_loc: StridedMut::contiguous(
                "swa_loc",
                out.slice_mut(0..self.out_len()),
                [self.out_len()],
            )?,
        };
        kernel.launch(&mut args, &mut errors)?;
        Ok((s.clone_dtoh(&out)?, errors.read()?))
    }

    fn check(&self, gpu: &Arc<Gpu>, kernel: &SwaLocKernel) -> Result<(), String> {
        let (want, want_err) = self.reference();
        let (got, got_err) = self.gpu(gpu, kernel).or_fail("launch")?;
        if let Some(i) = first_diff(&got, &want) {
            return Err(format!(
                "swa_loc differs at {i} (n = {}, out_len = {}): gpu {:?} vs reference {:?}; input {:?}",
                self.locs.len(),
                self.out_len(),
                got.get(i),
                want.get(i),
                self.locs.get(i)
            ));
        }
        if got_err != want_err {
            return Err(format!(
                "error word: gpu {got_err:?} vs reference {want_err:?}"
            ));
        }
        Ok(())
    }
}

/// Maps with unmapped (0), negative and large entries and the sentinel;
/// inputs from empty to past one full grid tile, mixing in-map locations,
/// −1, other negatives, the sentinel index and indices past the map; tails
/// from none to more than a tile.
fn loc_case() -> impl Strategy<Value = LocCase> {
    let n_map = prop_oneof![Just(1usize), Just(2), 3usize..64, 64usize..5000];
    let n = prop_oneof![
        Just(0usize),
        1usize..8,
        8usize..1100,
        1020usize..1030,
        1100usize..6000
    ];
    (n_map, n, 0usize..5, prop_oneof![3 => Just(0usize), 1 => 1usize..1500])
        .prop_flat_map(|(n_map, n, offset, tail)| {
            let entry = prop_oneof![3 => 0i64..1 << 40, 2 => Just(0i64), 1 => Just(-1i64), 1 => any::<i64>()];
            let m = n_map as i64;
            let loc = prop_oneof![
                12 => 0i64..m,
                2 => Just(-1i64),
                1 => Just(m - 1),
                1 => m..m + 50,
                1 => -40i64..-1,
                1 => any::<i64>(),
            ];
            (
                proptest::collection::vec(entry, n_map..=n_map),
                proptest::collection::vec(loc, n..=n),
                Just(offset),
                Just(tail),
            )
        })
        .prop_map(|(mut map, locs, offset, tail)| {
            *map.last_mut().expect("n_map ≥ 1") = -1;
            LocCase { map, locs, offset, tail }
        })
}

// ---- page-id translation --------------------------------------------------------

#[derive(Debug, Clone)]
struct PageCase {
    p: usize,
    m: usize,
    r2t: Vec<i32>,
    rows: usize,
    width: usize,
    r2t_stride: usize,
    rpi: Vec<i64>,
    lens: Vec<i32>,
    pt_stride: usize,
    map: Vec<i64>,
}

impl PageCase {
    fn bs(&self) -> usize {
        self.rpi.len()
    }

    fn table_len(&self) -> usize {
        self.bs() * self.pt_stride
    }

    fn reference(&self) -> (Vec<i32>, ErrorReport) {
        let input = PageInputs {
            req_to_token: &self.r2t,
            req_to_token_rows: self.rows,
            req_to_token_width: self.width,
            req_to_token_stride: self.r2t_stride,
            req_pool_indices: &self.rpi,
            cache_seqlens: &self.lens,
            page_size: self.p,
            max_num_pages: self.m,
            full_to_swa: &self.map,
        };
        let mut table = vec![POISON32; self.table_len() + GUARD];
        let err = translate_pages(&input, &mut table, self.pt_stride);
        (table, err)
    }

    fn gpu(
        &self,
        gpu: &Arc<Gpu>,
        kernel: &SwaPageKernel,
    ) -> Result<(Vec<i32>, ErrorReport), KernelError> {
        let s = gpu.stream();
        let r2t = upload(gpu, &self.r2t)?;
        let rpi = upload(gpu, &self.rpi)?;
        let lens = upload(gpu, &self.lens)?;
        let map = upload(gpu, &self.map)?;
        let mut table = s.clone_htod(&vec![POISON32; self.table_len() + GUARD])?;
        let mut errors = DeviceErrors::new(gpu)?;
        let bs = self.bs();
        let mut args = SwaPageArgs {
            req_to_token: Strided::new(
                "req_to_token",
                r2t.as_view(),
                [self.rows, self.width],
                [self.r2t_stride, 1],
            )?,
            req_pool_indices: Strided::contiguous("req_pool_indices", rpi.slice(0..bs), [bs])?,
            cache_seqlens: Strided::contiguous("cache_seqlens", lens.slice(0..bs), [bs])?,
            page_size: self.p,
            full_to_swa: Strided::contiguous(
                "full_to_swa",
                map.slice(0..self.map.len()),
                [self.map.len()],
            )?,
            swa_page_table: StridedMut::new(
                "swa_page_table",
                table.slice_mut(0..self.table_len()),
                [bs, self.m],
                [self.pt_stride, 1],
            )?,
        };
        kernel.launch(&mut args, &mut errors)?;
        Ok((s.clone_dtoh(&table)?, errors.read()?))
    }

    fn check(&self, gpu: &Arc<Gpu>, kernel: &SwaPageKernel) -> Result<(), String> {
        let (want, want_err) = self.reference();
        let (got, got_err) = self.gpu(gpu, kernel).or_fail("launch")?;
        if let Some(i) = first_diff(&got, &want) {
            return Err(format!(
                "swa_page_table differs at flat index {i}: gpu {:?} vs reference {:?} ({self:?})",
                got.get(i),
                want.get(i)
            ));
        }
        if got_err != want_err {
            return Err(format!(
                "error word: gpu {got_err:?} vs reference {want_err:?}"
            ));
        }
        Ok(())
    }
}

/// Page-granular maps from `SwaMapping` (plus a little corruption), rows of
/// random full slots, P ∈ {1, 2, 16, 32, 64, 128} and random, lengths at and
/// around page boundaries and the table width, padded strides, bad request
/// indices, negative and out-of-map slots.
fn page_case() -> impl Strategy<Value = PageCase> {
    let p = prop_oneof![
        Just(1usize),
        Just(2),
        Just(16),
        Just(32),
        Just(64),
        Just(128),
        1usize..=130
    ];
    (
        p,
        1usize..=24,
        1usize..=6,
        0usize..=12,
        0usize..=3,
        0usize..=2,
        1usize..=40,
    )
        .prop_flat_map(|(p, m, rows, bs, pad, pt_pad, full_pages)| {
            let width = p * m + (pad * 7) % (p + 1);
            let stride = width + pad;
            let n_slots = (full_pages + 1) * p;
            let slot = prop_oneof![
                20 => 0i32..n_slots as i32,
                1 => Just(-1i32),
                1 => -9i32..-1,
                1 => (n_slots as i32)..(n_slots as i32 + 40),
            ];
            let len = prop_oneof![
                Just(0i32),
                Just(1),
                Just(p as i32 - 1),
                Just(p as i32),
                Just(p as i32 + 1),
                Just((p * m) as i32),
                Just((p * m) as i32 + 1),
                Just(-1),
                0i32..=(p * m + p) as i32,
            ];
            let rpi =
                prop_oneof![12 => 0i64..rows as i64, 1 => Just(rows as i64), 1 => Just(-3i64)];
            (
                Just((p, m, rows, width, stride, pt_pad, full_pages)),
                proptest::collection::vec(slot, rows * stride..=rows * stride),
                proptest::collection::vec((rpi, len), bs..=bs),
                proptest::collection::vec(any::<bool>(), full_pages..=full_pages),
                proptest::collection::vec((0usize..n_slots + 1, any::<i64>()), 0..3),
            )
        })
        .prop_map(
            |((p, m, rows, width, stride, pt_pad, full_pages), r2t, pairs, mapped, corrupt)| {
                let mut mapping =
                    SwaMapping::new(full_pages * p, full_pages * p, p).expect("valid sizes");
                let pages: Vec<usize> = (1..=full_pages)
                    .rev()
                    .filter(|&pg| mapped[pg - 1])
                    .collect();
                mapping.alloc_pages(&pages).expect("enough SWA pages");
                let mut map = mapping.map().to_vec();
                for (i, v) in corrupt {
                    map[i] = v; // the sentinel too, sometimes
                }
                PageCase {
                    p,
                    m,
                    r2t,
                    rows,
                    width,
                    r2t_stride: stride,
                    rpi: pairs.iter().map(|x| x.0).collect(),
                    lens: pairs.iter().map(|x| x.1).collect(),
                    pt_stride: m + pt_pad,
                    map,
                }
            },
        )
}

// ---- named cases ------------------------------------------------------------------

fn spec_map() -> Vec<i64> {
    let mut map = vec![0i64; 53];
    for (full, swa) in [(3, 1), (2, 2), (10, 3), (5, 4), (9, 5)] {
        for o in 0..4 {
            map[full * 4 + o] = (swa * 4 + o) as i64;
        }
    }
    map[52] = -1;
    map
}

fn loc_expect(
    gpu: &Arc<Gpu>,
    k: &SwaLocKernel,
    map: &[i64],
    locs: &[i64],
    tail: usize,
    want: &[i64],
) -> Result<(), String> {
    let c = LocCase {
        map: map.to_vec(),
        locs: locs.to_vec(),
        offset: 1,
        tail,
    };
    let (got, err) = c.gpu(gpu, k).or_fail("launch")?;
    if &got[..want.len()] != want
        || got[want.len()..].iter().any(|&v| v != POISON64)
        || !err.is_clean()
    {
        return Err(format!(
            "{locs:?} (tail {tail}): got {got:?} err {err:?}, want {want:?} then poison"
        ));
    }
    c.check(gpu, k)
}

fn spec_page_case(lens: Vec<i32>) -> PageCase {
    let mut r2t = vec![0; 16];
    r2t.extend([12, 13, 14, 15, 28, 29, 30, 31, 8, 9, 10, 11, 40, 41, 42, 43]);
    r2t.extend([20, 21, 22, 23, 36, 37, 38, 39]);
    r2t.extend([0; 8]);
    PageCase {
        p: 4,
        m: 4,
        r2t,
        rows: 3,
        width: 16,
        r2t_stride: 16,
        rpi: vec![1, 2],
        lens,
        pt_stride: 4,
        map: spec_map(),
    }
}

fn main() {
    let trials = vec![
        gpu_trial("loc_gpu_matches_reference_proptest", |gpu| {
            let kernel = SwaLocKernel::new(gpu).or_fail("load")?;
            let mut runner = TestRunner::new(Config {
                cases: LOC_CASES,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&loc_case(), |c| {
                    c.check(gpu, &kernel).map_err(TestCaseError::fail)
                })
                .map_err(|e| e.to_string())?;
            println!(
                "loc_gpu_matches_reference_proptest: {LOC_CASES} cases, {} launches",
                kernel.launches()
            );
            Ok(())
        }),
        gpu_trial("pages_gpu_matches_reference_proptest", |gpu| {
            let kernel = SwaPageKernel::new(gpu).or_fail("load")?;
            let mut runner = TestRunner::new(Config {
                cases: PAGE_CASES,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&page_case(), |c| {
                    c.check(gpu, &kernel).map_err(TestCaseError::fail)
                })
                .map_err(|e| e.to_string())?;
            println!(
                "pages_gpu_matches_reference_proptest: {PAGE_CASES} cases, {} launches",
                kernel.launches()
            );
            Ok(())
        }),
        gpu_trial("issue_example_translate_sentinel_zero_and_mapped", |gpu| {
            let k = SwaLocKernel::new(gpu).or_fail("load")?;
            // Full size 24, P = 4, slots 12..15 → 20..23 (SWA page 5), slot 0 → 0.
            let mut m = SwaMapping::new(24, 20, 4).or_fail("map")?;
            m.alloc_pages(&[1, 2, 4, 5]).or_fail("alloc")?;
            m.alloc_pages(&[3]).or_fail("alloc")?;
            m.free_slots(&[4, 8, 16, 20]).or_fail("free")?;
            if m.map()[12..16] != [20, 21, 22, 23] {
                return Err(format!("map {:?}", m.map()));
            }
            loc_expect(gpu, &k, m.map(), &[-1, 0, 13], 0, &[-1, 0, 21])
        }),
        gpu_trial("sentinel_survives_every_page_size", |gpu| {
            let k = SwaLocKernel::new(gpu).or_fail("load")?;
            for p in [1usize, 2, 3, 4, 16, 64, 128] {
                let mut m = SwaMapping::new(8 * p, 4 * p, p).or_fail("map")?;
                m.alloc_slots(&[p as i64]).or_fail("alloc")?;
                let want = [-1, m.map()[p], 0, -1];
                loc_expect(gpu, &k, m.map(), &[-1, p as i64, 0, -1], 0, &want)?;
            }
            Ok(())
        }),
        gpu_trial("spec_worked_example_and_edge_case_12", |gpu| {
            let k = SwaLocKernel::new(gpu).or_fail("load")?;
            let map = spec_map();
            loc_expect(gpu, &k, &map, &[9, 23, 29, -1], 0, &[9, 19, 0, -1])?;
            // Edge case 12: eager [−1, 19, 0]; into a length-5 buffer with its zero tail.
            loc_expect(gpu, &k, &map, &[-1, 23, 29], 0, &[-1, 19, 0])?;
            loc_expect(gpu, &k, &map, &[-1, 23, 29], 2, &[-1, 19, 0, 0, 0])
        }),
        gpu_trial("edge_case_5_swa_page_table_with_evicted_page", |gpu| {
            let k = SwaPageKernel::new(gpu).or_fail("load")?;
            for (lens, want) in [
                (vec![10, 4], [vec![1, 0, 2], vec![4]]),
                (vec![12, 6], [vec![1, 0, 2], vec![4, 5]]),
                (vec![13, 7], [vec![1, 0, 2, 3], vec![4, 5]]),
            ] {
                let c = spec_page_case(lens.clone());
                let (got, err) = c.gpu(gpu, &k).or_fail("launch")?;
                for (row, w) in want.iter().enumerate() {
                    let live = &got[row * 4..row * 4 + w.len()];
                    let rest = &got[row * 4 + w.len()..row * 4 + 4];
                    if live != &w[..] || rest.iter().any(|&v| v != POISON32) || !err.is_clean() {
                        return Err(format!(
                            "lens {lens:?} row {row}: got {got:?}, want {w:?} then poison"
                        ));
                    }
                }
                c.check(gpu, &k)?;
            }
            Ok(())
        }),
        gpu_trial("outside_the_map_is_counted_and_zero", |gpu| {
            let k = SwaLocKernel::new(gpu).or_fail("load")?;
            let c = LocCase {
                map: spec_map(),
                locs: vec![-2, 52, 53, i64::MAX, i64::MIN, -1, 51],
                offset: 0,
                tail: 0,
            };
            let (got, err) = c.gpu(gpu, &k).or_fail("launch")?;
            if got[..7] != [0, 0, 0, 0, 0, -1, 0] || err.count != 5 {
                return Err(format!("got {got:?} err {err:?}"));
            }
            c.check(gpu, &k)
        }),
        gpu_trial("grid_stride_three_million_locations", |gpu| {
            // More than MAX_LOC_BLOCKS tiles: the grid-stride loop runs several times.
            let k = SwaLocKernel::new(gpu).or_fail("load")?;
            let n_map = 1 << 20;
            let mut map: Vec<i64> = (0..n_map as i64)
                .map(|i| (i * 7919) % n_map as i64)
                .collect();
            map[n_map - 1] = -1;
            let locs: Vec<i64> = (0..3_000_003i64)
                .map(|i| match i % 97 {
                    0 => -1,
                    1 => n_map as i64 + i,
                    _ => (i * 104_729) % (n_map as i64 - 1),
                })
                .collect();
            LocCase {
                map,
                locs,
                offset: 3,
                tail: 5,
            }
            .check(gpu, &k)
        }),
        gpu_trial("host_map_round_trip_alloc_evict_free_upload", |gpu| {
            let lk = SwaLocKernel::new(gpu).or_fail("load")?;
            let pk = SwaPageKernel::new(gpu).or_fail("load")?;
            let p = 4;
            let mut m = SwaMapping::new(64, 64, p).or_fail("map")?;
            let row: Vec<i32> = (4..36).collect();
            let slots: Vec<i64> = row.iter().map(|&s| i64::from(s)).collect();
            m.alloc_slots(&slots).or_fail("alloc")?;
            let mut dev = m.upload(gpu).or_fail("upload")?;
            let evicted = m
                .evict_out_of_window(&row, 30, 7, 0, EvictionPolicy::ChunkCache)
                .or_fail("evict")?;
            m.upload_into(gpu, &mut dev).or_fail("upload_into")?;
            let host_map = m.map().to_vec();
            // Locations: device result equals the host map, evicted positions give 0.
            let (want, _) = LocCase {
                map: host_map.clone(),
                locs: slots.clone(),
                offset: 0,
                tail: 0,
            }
            .reference();
            let s = gpu.stream();
            let input = s.clone_htod(&slots).or_fail("htod")?;
            let mut out = s
                .clone_htod(&vec![POISON64; slots.len() + GUARD])
                .or_fail("htod")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            let mut args = SwaLocArgs {
                out_cache_loc: Strided::of("out_cache_loc", &input, [slots.len()])
                    .or_fail("view")?,
                full_to_swa: Strided::of("full_to_swa", &dev, [host_map.len()]).or_fail("view")?,
                swa_loc: StridedMut::contiguous(
                    "swa_loc",
                    out.slice_mut(0..slots.len()),
                    [slots.len()],
                )
                .or_fail("view")?,
            };
            lk.launch(&mut args, &mut errors).or_fail("launch")?;
            let got = s.clone_dtoh(&out).or_fail("dtoh")?;
            if got != want
                || got[..evicted].iter().any(|&v| v != 0)
                || got[evicted..32].iter().any(|&v| v <= 0)
            {
                return Err(format!("evicted {evicted}: got {got:?}"));
            }
            // Page ids from the same device map.
            let r2t = s.clone_htod(&row).or_fail("htod")?;
            let rpi = s.clone_htod(&[0i64]).or_fail("htod")?;
            let lens = s.clone_htod(&[30i32]).or_fail("htod")?;
            let mut table = s.clone_htod(&[POISON32; 8]).or_fail("htod")?;
            let mut args = SwaPageArgs {
                req_to_token: Strided::of("req_to_token", &r2t, [1, 32]).or_fail("view")?,
                req_pool_indices: Strided::of("req_pool_indices", &rpi, [1]).or_fail("view")?,
                cache_seqlens: Strided::of("cache_seqlens", &lens, [1]).or_fail("view")?,
                page_size: p,
                full_to_swa: Strided::of("full_to_swa", &dev, [host_map.len()]).or_fail("view")?,
                swa_page_table: StridedMut::of("swa_page_table", &mut table, [1, 8])
                    .or_fail("view")?,
            };
            pk.launch(&mut args, &mut errors).or_fail("launch")?;
            let t = s.clone_dtoh(&table).or_fail("dtoh")?;
            let want_t: Vec<i32> = (0..8)
                .map(|pg| (host_map[row[pg * p] as usize] / p as i64) as i32)
                .collect();
            if t != want_t || t[..5] != [0; 5] || !errors.read().or_fail("read")?.is_clean() {
                return Err(format!("table {t:?}, want {want_t:?}"));
            }
            // A wrong-size device buffer is refused.
            let mut small = s.alloc_zeros::<i64>(3).or_fail("alloc")?;
            if m.upload_into(gpu, &mut small).is_ok() {
                return Err("upload_into a [3] buffer was accepted".into());
            }
            Ok(())
        }),
        gpu_trial("page_updates_keep_the_device_maps_exact", |gpu| {
            // Random alloc / free / evict sequences; after each, the changed
            // pages (plus a few out-of-range entries) go through the update
            // kernel; device slot map and page map == host, error word == reference.
            let uk = SwaUpdateKernel::new(gpu).or_fail("load")?;
            let s = gpu.stream();
            for (seed, p) in [(1u64, 1usize), (2, 4), (3, 16), (4, 5)] {
                // xorshift64: no rand dependency in this crate.
                let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let pages = 40;
                let mut m = SwaMapping::new(pages * p, 24 * p, p).or_fail("map")?;
                let mut dev = m.upload(gpu).or_fail("upload")?;
                let mut dev_pm = s.clone_htod(&m.page_map()).or_fail("htod")?;
                let mut synced = m.version();
                let mut want_err = ErrorReport::default();
                let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
                for step in 0..200 {
                    let slot = (p + (next() as usize) % (pages * p)) as i64;
                    let _ = if next() % 10 < 6 {
                        m.alloc_slots(&[slot]).map(|_| ())
                    } else {
                        m.free_slots(&[slot]).map(|_| ())
                    };
                    let changed = m.changed_pages_since(synced).ok_or("log lost")?;
                    let mut e = m.update_entries(&changed);
                    if step % 17 == 0 {
                        e.extend([pages as i64 + 1, 1, 1, 99, -3, 0]);
                    }
                    synced = m.version();
                    if e.is_empty() {
                        continue;
                    }
                    let mut ref_map = s.clone_dtoh(&dev).or_fail("dtoh")?;
                    let mut ref_pm = s.clone_dtoh(&dev_pm).or_fail("dtoh")?;
                    want_err.merge(update_pages(&mut ref_map, Some(&mut ref_pm), p, 25, &e));
                    let ent = s.clone_htod(&e).or_fail("htod")?;
                    let (n_map, n_pm) = (dev.len(), dev_pm.len());
                    let mut args = SwaUpdateArgs {
                        full_to_swa: StridedMut::of("full_to_swa", &mut dev, [n_map])
                            .or_fail("view")?,
                        page_map: Some(
                            StridedMut::of("page_map", &mut dev_pm, [n_pm]).or_fail("view")?,
                        ),
                        entries: Strided::of("entries", &ent, [e.len() / 2, 2]).or_fail("view")?,
                        page_size: p,
                        num_swa_pages: 25,
                    };
                    uk.launch(&mut args, &mut errors).or_fail("launch")?;
                    let got = s.clone_dtoh(&dev).or_fail("dtoh")?;
                    let got_pm = s.clone_dtoh(&dev_pm).or_fail("dtoh")?;
                    if got != m.map()
                        || got != ref_map
                        || got_pm != m.page_map()
                        || got_pm != ref_pm
                    {
                        return Err(format!("P {p} step {step}: device maps differ from host"));
                    }
                }
                let e = errors.read().or_fail("read")?;
                if e != want_err || want_err.is_clean() {
                    return Err(format!("P {p}: errors {e:?}, want {want_err:?}"));
                }
            }
            Ok(())
        }),
        gpu_trial("empty_inputs_launch_nothing", |gpu| {
            let lk = SwaLocKernel::new(gpu).or_fail("load")?;
            let pk = SwaPageKernel::new(gpu).or_fail("load")?;
            let c = LocCase {
                map: vec![-1],
                locs: vec![],
                offset: 0,
                tail: 0,
            };
            let (got, err) = c.gpu(gpu, &lk).or_fail("launch")?;
            if lk.launches() != 0 || !err.is_clean() || got.iter().any(|&v| v != POISON64) {
                return Err(format!("out_len 0 launched {} kernel(s)", lk.launches()));
            }
            // n = 0 with a tail: one launch that only zeroes the tail.
            let c = LocCase {
                map: vec![-1],
                locs: vec![],
                offset: 0,
                tail: 3,
            };
            c.check(gpu, &lk)?;
            let c = PageCase {
                rpi: vec![],
                lens: vec![],
                ..spec_page_case(vec![])
            };
            let (_, err) = c.gpu(gpu, &pk).or_fail("launch")?;
            if pk.launches() != 0 || !err.is_clean() {
                return Err(format!("bs 0 launched {} kernel(s)", pk.launches()));
            }
            Ok(())
        }),
        gpu_trial("bad_arguments_are_errors_before_launch", |gpu| {
            let lk = SwaLocKernel::new(gpu).or_fail("load")?;
            let pk = SwaPageKernel::new(gpu).or_fail("load")?;
            let s = gpu.stream();
            let input = s.alloc_zeros::<i64>(8).or_fail("alloc")?;
            let map = s.alloc_zeros::<i64>(8).or_fail("alloc")?;
            let mut out = s.alloc_zeros::<i64>(8).or_fail("alloc")?;
            let mut short = s.alloc_zeros::<i64>(4).or_fail("alloc")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            let mut args = SwaLocArgs {
                out_cache_loc: Strided::of("out_cache_loc", &input, [8]).or_fail("view")?,
                full_to_swa: Strided::contiguous("full_to_swa", map.slice(0..0), [0])
                    .or_fail("view")?,
                swa_loc: StridedMut::of("swa_loc", &mut out, [8]).or_fail("view")?,
            };
            match lk.launch(&mut args, &mut errors) {
                Err(KernelError::Shape {
                    arg: "full_to_swa", ..
                }) => {}
                other => {
                    return Err(format!(
                        "expected an empty map to be rejected, got {other:?}"
                    ))
                }
            }
            args.full_to_swa = Strided::of("full_to_swa", &map, [8]).or_fail("view")?;
            args.swa_loc = StridedMut::of("swa_loc", &mut short, [4]).or_fail("view")?;
            match lk.launch(&mut args, &mut errors) {
                Err(KernelError::Shape { arg: "swa_loc", .. }) => {}
                other => {
                    return Err(format!(
                        "expected a short output to be rejected, got {other:?}"
                    ))
                }
            }
            args.out_cache_loc =
                Strided::new("out_cache_loc", input.as_view(), [4], [2]).or_fail("view")?;
            match lk.launch(&mut args, &mut errors) {
                Err(KernelError::Stride {
                    arg: "out_cache_loc",
                    ..
                }) => {}
                other => {
                    return Err(format!(
                        "expected a strided input to be rejected, got {other:?}"
                    ))
                }
            }
            let r2t = s.alloc_zeros::<i32>(64).or_fail("alloc")?;
            let rpi = s.alloc_zeros::<i64>(3).or_fail("alloc")?;
            let lens = s.alloc_zeros::<i32>(2).or_fail("alloc")?;
            let mut table = s.alloc_zeros::<i32>(8).or_fail("alloc")?;
            let mut args = SwaPageArgs {
                req_to_token: Strided::of("req_to_token", &r2t, [4, 16]).or_fail("view")?,
                req_pool_indices: Strided::of("req_pool_indices", &rpi, [3]).or_fail("view")?,
                cache_seqlens: Strided::of("cache_seqlens", &lens, [2]).or_fail("view")?,
                page_size: 4,
                full_to_swa: Strided::of("full_to_swa", &map, [8]).or_fail("view")?,
                swa_page_table: StridedMut::of("swa_page_table", &mut table, [2, 4])
                    .or_fail("view")?,
            };
            match pk.launch(&mut args, &mut errors) {
                Err(KernelError::Shape {
                    arg: "req_pool_indices",
                    ..
                }) => {}
                other => {
                    return Err(format!(
                        "expected a shape error naming req_pool_indices, got {other:?}"
                    ))
                }
            }
            args.req_pool_indices =
                Strided::contiguous("req_pool_indices", rpi.slice(0..2), [2]).or_fail("view")?;
            args.page_size = 0;
            match pk.launch(&mut args, &mut errors) {
                Err(KernelError::Unsupported {
                    arg: "page_size", ..
                }) => {}
                other => {
                    return Err(format!(
                        "expected page_size 0 to be rejected, got {other:?}"
                    ))
                }
            }
            if lk.launches() != 0 || pk.launches() != 0 {
                return Err("a rejected call launched".into());
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}

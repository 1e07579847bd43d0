//! GPU tests of the page-table family: the kernel equals the CPU reference bit
//! for bit (tables and error word), outputs poisoned before every launch.
//! Ignored at run time without a GPU (kernel-rt's libtest-mimic harness).

use std::sync::Arc;

use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::testing::{gpu_cases, gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use page_table::reference::{build_page_table, scatter, HostInputs};
use page_table::{PageTableArgs, PageTableKernel, ScatterArgs, ScatterKernel, SwaTables};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const POISON: i32 = -0x5A5A_5A5A;
const GPU_CASES: u32 = 2_500;

/// One launch's inputs, host side.
#[derive(Debug, Clone)]
struct Case {
    p: usize,
    m: usize,
    /// `[R, stride]`, `W` used of each row.
    r2t: Vec<i32>,
    rows: usize,
    width: usize,
    r2t_stride: usize,
    rpi: Vec<i64>,
    lens: Vec<i32>,
    pt_stride: usize,
    map: Option<Vec<i64>>,
    pool_slots: Option<usize>,
}

struct Out {
    table: Vec<i32>,
    swa: Vec<i32>,
    err: ErrorReport,
}

impl Case {
    fn bs(&self) -> usize {
        self.rpi.len()
    }

    fn reference(&self) -> Out {
        let input = HostInputs {
            req_to_token: &self.r2t,
            req_to_token_rows: self.rows,
            req_to_token_width: self.width,
            req_to_token_stride: self.r2t_stride,
            req_pool_indices: &self.rpi,
            cache_seqlens: &self.lens,
            page_size: self.p,
            max_num_pages: self.m,
            full_to_swa: self.map.as_deref(),
            pool_slots: self.pool_slots,
        };
        let mut table = vec![POISON; self.bs() * self.pt_stride];
        let mut swa = vec![POISON; self.bs() * self.pt_stride];
        let err = build_page_table(
            &input,
            &mut table,
            self.pt_stride,
            self.map.is_some().then_some((&mut swa[..], self.pt_stride)),
        );
        Out { table, swa, err }
    }

    fn gpu(&self, gpu: &Arc<Gpu>, kernel: &PageTableKernel) -> Result<Out, KernelError> {
        let s = gpu.stream();
        let r2t = upload(gpu, &self.r2t)?;
        let rpi = upload(gpu, &self.rpi)?;
        let lens = upload(gpu, &self.lens)?;
        let poison = vec![POISON; (self.bs() * self.pt_stride).max(1)];
        let mut table = s.clone_htod(&poison)?;
        let mut swa = s.clone_htod(&poison)?;
        let map: Option<CudaSlice<i64>> = self.map.as_ref().map(|m| s.clone_htod(m)).transpose()?;
        let mut errors = DeviceErrors::new(gpu)?;
        let shape = [self.bs(), self.m];
        let strides = [self.pt_stride, 1];
        let mut args = PageTableArgs {
            req_to_token: Strided::new(
                "req_to_token",
                r2t.as_view(),
                [self.rows, self.width],
                [self.r2t_stride, 1],
            )?,
            req_pool_indices: Strided::contiguous(
                "req_pool_indices",
                rpi.slice(0..self.bs()),
                [self.bs()],
            )?,
            cache_seqlens: Strided::contiguous(
                "cache_seqlens",
                lens.slice(0..self.bs()),
                [self.bs()],
            )?,
            page_size: self.p,
            page_table: StridedMut::new("page_table", table.as_view_mut(), shape, strides)?,
            swa: match &map {
                Some(m) => Some(SwaTables {
                    full_to_swa: Strided::of("full_to_swa", m, [m.len()])?,
                    swa_page_table: StridedMut::new(
                        "swa_page_table",
                        swa.as_view_mut(),
                        shape,
                        strides,
                    )?,
                }),
                None => None,
            },
            pool_slots: self.pool_slots,
        };
        kernel.launch(&mut args, &mut errors)?;
        let mut table = s.clone_dtoh(&table)?;
        let mut swa = s.clone_dtoh(&swa)?;
        table.truncate(self.bs() * self.pt_stride);
        swa.truncate(self.bs() * self.pt_stride);
        Ok(Out {
            table,
            swa,
            err: errors.read()?,
        })
    }

    /// GPU == reference, whole buffers (tails must stay poisoned) and error word.
    fn check(&self, gpu: &Arc<Gpu>, kernel: &PageTableKernel) -> Result<(), String> {
        let want = self.reference();
        let got = self.gpu(gpu, kernel).or_fail("launch")?;
        let diff = |a: &[i32], b: &[i32]| a.iter().zip(b).position(|(x, y)| x != y);
        if let Some(i) = diff(&got.table, &want.table) {
            return Err(format!(
                "page_table differs at flat index {i}: gpu {} vs reference {} ({self:?})",
                got.table[i], want.table[i]
            ));
        }
        if self.map.is_some() {
            if let Some(i) = diff(&got.swa, &want.swa) {
                return Err(format!(
                    "swa_page_table differs at flat index {i}: gpu {} vs reference {}",
                    got.swa[i], want.swa[i]
                ));
            }
        }
        if got.err != want.err {
            return Err(format!(
                "error word: gpu {:?} vs reference {:?}",
                got.err, want.err
            ));
        }
        Ok(())
    }
}

/// The whole input space, edges first: bs 0, P ∈ {1, 2, 16, 32, 64, 128} and
/// random, lengths 0, 1, P−1, P, P+1 and the table-width limit (and past it),
/// padded strides, SWA maps with unmapped slots and the −1 sentinel, and a few
/// bad request indices and bad slots.
fn case() -> impl Strategy<Value = Case> {
    let p = prop_oneof![
        Just(1usize),
        Just(2),
        Just(16),
        Just(32),
        Just(64),
        Just(128),
        1usize..=130
    ];
    (p, 1usize..=24, 1usize..=6, 0usize..=12, 0usize..=3, 0usize..=2, any::<bool>(), any::<bool>())
        .prop_flat_map(|(p, m, rows, bs, pad, pt_pad, swa, pool)| {
            let width = p * m + (pad * 7) % (p + 1);
            let stride = width + pad;
            let pool_len = 64 * p + 17;
            let slot = prop_oneof![20 => 0i32..pool_len as i32, 1 => Just(-1i32), 1 => (pool_len as i32)..(pool_len as i32 + 40)];
            let r2t = proptest::collection::vec(slot, rows * stride..=rows * stride);
            let len = prop_oneof![
                Just(0i32), Just(1), Just(p as i32 - 1), Just(p as i32), Just(p as i32 + 1),
                Just((p * m) as i32), Just((p * m) as i32 + 1), Just(-1),
                0i32..=(p * m + p) as i32,
            ];
            let rpi = prop_oneof![12 => 0i64..rows as i64, 1 => Just(rows as i64), 1 => Just(-3i64)];
            let map = proptest::collection::vec(prop_oneof![3 => 0i64..(pool_len as i64), 1 => Just(0i64), 1 => Just(-1i64)], pool_len..=pool_len);
            (Just((p, m, rows, width, stride, pt_pad, swa, pool, pool_len)), r2t, proptest::collection::vec((rpi, len), bs..=bs), map)
        })
        .prop_map(|((p, m, rows, width, stride, pt_pad, swa, pool, pool_len), r2t, pairs, mut map)| {
            *map.last_mut().expect("non-empty") = -1;
            Case {
                p,
                m,
                r2t,
                rows,
                width,
                r2t_stride: stride,
                rpi: pairs.iter().map(|x| x.0).collect(),
                lens: pairs.iter().map(|x| x.1).collect(),
                pt_stride: m + pt_pad,
                map: swa.then_some(map),
                pool_slots: pool.then_some(pool_len - 9),
            }
        })
}

fn single_row(p: usize, m: usize, row: Vec<i32>, rpi: i64, len: i32) -> Case {
    Case {
        p,
        m,
        rows: 1,
        width: row.len(),
        r2t_stride: row.len(),
        r2t: row,
        rpi: vec![rpi],
        lens: vec![len],
        pt_stride: m,
        map: None,
        pool_slots: None,
    }
}

/// A scatter case: `[rows, width]` at row stride `stride`, distinct valid
/// positions (the kernel leaves duplicates unspecified) and some bad entries.
fn scatter_case() -> impl Strategy<Value = (usize, usize, usize, Vec<[i64; 2]>)> {
    (1usize..9, 1usize..300, 0usize..5).prop_flat_map(|(rows, width, pad)| {
        let total = rows * width;
        (
            Just(rows),
            Just(width),
            Just(width + pad),
            proptest::sample::subsequence(
                (0..total as i64).collect::<Vec<_>>(),
                0..=total.min(700),
            ),
            proptest::collection::vec(
                prop_oneof![
                    (-5i64..0, any::<i32>()).prop_map(|(p, v)| [p, i64::from(v)]),
                    (total as i64..total as i64 + 5, any::<i32>())
                        .prop_map(|(p, v)| [p, i64::from(v)]),
                    (
                        0..total as i64,
                        prop_oneof![Just(i64::MAX), Just(1i64 << 31), Just(-(1i64 << 31) - 1)]
                    )
                        .prop_map(|(p, v)| [p, v]),
                ],
                0..4,
            ),
            any::<u64>(),
        )
            .prop_map(|(rows, width, stride, pos, bad, seed)| {
                let mut e: Vec<[i64; 2]> = pos
                    .iter()
                    .map(|&p| {
                        [
                            p,
                            (p.wrapping_mul(2_654_435_761) ^ seed as i64) as i32 as i64,
                        ]
                    })
                    .collect();
                // Bad entries between good ones.
                for (i, b) in bad.into_iter().enumerate() {
                    let at = (seed as usize).wrapping_add(i * 7) % (e.len() + 1);
                    e.insert(at, b);
                }
                (rows, width, stride, e)
            })
    })
}

fn scatter_check(
    gpu: &Arc<Gpu>,
    kernel: &ScatterKernel,
    (rows, width, stride, entries): &(usize, usize, usize, Vec<[i64; 2]>),
) -> Result<(), String> {
    let (rows, width, stride) = (*rows, *width, *stride);
    let init: Vec<i32> = (0..rows * stride).map(|i| POISON + i as i32).collect();
    let mut want = init.clone();
    let want_err = scatter(&mut want, rows, width, stride, entries);
    let s = gpu.stream();
    let mut t = upload(gpu, &init).or_fail("upload")?;
    let flat: Vec<i64> = entries.iter().flatten().copied().chain([0, 0]).collect();
    let e = upload(gpu, &flat).or_fail("upload")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("errors")?;
    let n = entries.len();
    let mut args = ScatterArgs {
        req_to_token: StridedMut::new(
            "req_to_token",
            t.slice_mut(0..rows * stride),
            [rows, width],
            [stride, 1],
        )
        .or_fail("view")?,
        entries: Strided::contiguous("entries", e.slice(0..2 * n), [n, 2]).or_fail("view")?,
    };
    kernel.launch(&mut args, &mut errors).or_fail("launch")?;
    let got = s.clone_dtoh(&t).or_fail("read")?;
    let got_err = errors.read().or_fail("errors")?;
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "[{rows}, {width}] stride {stride}, {n} entries: element {i} got {} want {}",
            got[i], want[i]
        ));
    }
    if got_err != want_err {
        return Err(format!("error word {got_err:?}, want {want_err:?}"));
    }
    Ok(())
}

fn main() {
    let trials = vec![
        gpu_trial("scatter_matches_reference_proptest", |gpu| {
            let kernel = ScatterKernel::new(gpu).or_fail("load")?;
            let cases = gpu_cases(GPU_CASES);
            let mut runner = TestRunner::new(Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&scatter_case(), |c| {
                    scatter_check(gpu, &kernel, &c).map_err(TestCaseError::fail)
                })
                .map_err(|e| e.to_string())?;
            // Large list: grid-stride past one wave of blocks.
            let (rows, width) = (257, 4096);
            let e: Vec<[i64; 2]> = (0..(rows * width) as i64)
                .step_by(3)
                .map(|p| [p, p ^ 0x55])
                .collect();
            scatter_check(gpu, &kernel, &(rows, width, width, e))?;
            println!(
                "scatter_matches_reference_proptest: {cases} cases + 1 large, {} launches",
                kernel.launches()
            );
            Ok(())
        }),
        gpu_trial("scatter_rejects_misaligned_and_bad_shapes", |gpu| {
            let kernel = ScatterKernel::new(gpu).or_fail("load")?;
            let s = gpu.stream();
            let mut t = s.alloc_zeros::<i32>(16).or_fail("alloc")?;
            let e = s.alloc_zeros::<i64>(8).or_fail("alloc")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("errors")?;
            let mut args = ScatterArgs {
                req_to_token: StridedMut::of("req_to_token", &mut t, [4, 4]).or_fail("view")?,
                entries: Strided::contiguous("entries", e.slice(1..7), [3, 2]).or_fail("view")?,
            };
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Stride { arg: "entries", .. }) => {}
                other => return Err(format!("misaligned entries: {other:?}")),
            }
            args.entries = Strided::contiguous("entries", e.slice(0..6), [2, 3]).or_fail("view")?;
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Shape { arg: "entries", .. }) => {}
                other => return Err(format!("[2, 3] entries: {other:?}")),
            }
            if kernel.launches() != 0 {
                return Err("a rejected call launched".into());
            }
            Ok(())
        }),
        gpu_trial("gpu_matches_reference_proptest", |gpu| {
            let kernel = PageTableKernel::new(gpu).or_fail("load")?;
            let cases = gpu_cases(GPU_CASES);
            let mut runner = TestRunner::new(Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&case(), |c| {
                    c.check(gpu, &kernel).map_err(TestCaseError::fail)
                })
                .map_err(|e| e.to_string())?;
            println!(
                "gpu_matches_reference_proptest: {cases} cases, {} launches",
                kernel.launches()
            );
            Ok(())
        }),
        gpu_trial("issue_example_p4_row2", |gpu| {
            let kernel = PageTableKernel::new(gpu).or_fail("load")?;
            let mut r2t: Vec<i32> = vec![0; 64];
            let row2: Vec<i32> = [40, 8, 100, 12]
                .iter()
                .flat_map(|&s| s..s + 4)
                .chain(16..32)
                .collect();
            r2t.extend(row2);
            for (len, want) in [
                (10, vec![10, 2, 25]),
                (12, vec![10, 2, 25]),
                (13, vec![10, 2, 25, 3]),
            ] {
                let c = Case {
                    rows: 3,
                    width: 32,
                    r2t_stride: 32,
                    r2t: r2t.clone(),
                    ..single_row(4, 8, vec![], 2, len)
                };
                let out = c.gpu(gpu, &kernel).or_fail("launch")?;
                if out.table[..want.len()] != want[..]
                    || out.table[want.len()..].iter().any(|&v| v != POISON)
                {
                    return Err(format!(
                        "seq_len {len}: got {:?}, want {want:?} then poison",
                        out.table
                    ));
                }
                c.check(gpu, &kernel)?;
            }
            Ok(())
        }),
        gpu_trial("issue_example_identity_row_4097", |gpu| {
            let kernel = PageTableKernel::new(gpu).or_fail("load")?;
            let m = 130;
            let mut r2t = vec![0; m * 32];
            r2t.extend((0..(m * 32) as i32).map(|t| 32000 + t));
            let c = Case {
                rows: 2,
                width: m * 32,
                r2t_stride: m * 32,
                r2t,
                ..single_row(32, m, vec![], 1, 4097)
            };
            let out = c.gpu(gpu, &kernel).or_fail("launch")?;
            let want: Vec<i32> = (0..129).map(|p| 1000 + p).collect();
            if out.table[..129] != want[..]
                || out.table[128] != 1128
                || out.table[129] != POISON
                || !out.err.is_clean()
            {
                return Err(format!("got {:?} err {:?}", out.table, out.err));
            }
            Ok(())
        }),
        gpu_trial("empty_batch_no_launch", |gpu| {
            let kernel = PageTableKernel::new(gpu).or_fail("load")?;
            let c = single_row(4, 4, vec![0; 16], 0, 0);
            let c = Case {
                rpi: vec![],
                lens: vec![],
                ..c
            };
            let out = c.gpu(gpu, &kernel).or_fail("launch")?;
            if kernel.launches() != 0 || !out.err.is_clean() || !out.table.is_empty() {
                return Err(format!("bs 0 launched {} kernel(s)", kernel.launches()));
            }
            Ok(())
        }),
        gpu_trial("bad_arguments_are_errors_before_launch", |gpu| {
            let kernel = PageTableKernel::new(gpu).or_fail("load")?;
            let s = gpu.stream();
            let r2t = s.alloc_zeros::<i32>(64).or_fail("alloc")?;
            let rpi = s.alloc_zeros::<i64>(3).or_fail("alloc")?;
            let lens = s.alloc_zeros::<i32>(2).or_fail("alloc")?;
            let mut table = s.alloc_zeros::<i32>(8).or_fail("alloc")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            let mut args = PageTableArgs {
                req_to_token: Strided::of("req_to_token", &r2t, [4, 16]).or_fail("view")?,
                req_pool_indices: Strided::of("req_pool_indices", &rpi, [3]).or_fail("view")?,
                cache_seqlens: Strided::of("cache_seqlens", &lens, [2]).or_fail("view")?,
                page_size: 4,
                page_table: StridedMut::of("page_table", &mut table, [2, 4]).or_fail("view")?,
                swa: None,
                pool_slots: None,
            };
            match kernel.launch(&mut args, &mut errors) {
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
            match kernel.launch(&mut args, &mut errors) {
                Err(KernelError::Unsupported {
                    arg: "page_size", ..
                }) => {}
                other => return Err(format!("expected page_size to be rejected, got {other:?}")),
            }
            if kernel.launches() != 0 {
                return Err("a rejected call launched".into());
            }
            // A view past its buffer is refused at construction.
            if Strided::of("req_to_token", &r2t, [5, 16]).is_ok() {
                return Err("a [5, 16] view of 64 elements was accepted".into());
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}

//! GPU tests of `mha_replay_gen_qkv`: device Q/K/V equal
//! [`Generator::element`] rounded to bf16, bit for bit, for random seeds,
//! models, layers, salts, shapes, head offsets (tensor-parallel ranks) and
//! rows (outputs poisoned before each
//! launch); rejected arguments launch nothing. Ignored without a GPU.

use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::testing::{gpu_cases, gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{Gpu, KernelError, Strided, StridedMut};
use mha_replay::gen::{Act, Generator, ModelId};
use mha_replay::launch::{GenArgs, GenKernel, GenKey};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Random cases of the property test (`MHA_KIT_GPU_CASES` overrides).
const GPU_CASES: u32 = 2_000;
/// Poison of the outputs (a NaN bf16 the generator never writes).
const POISON: u16 = 0x7FFF;

#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    model: ModelId,
    layer: usize,
    salt: u64,
    hq: usize,
    hkv: usize,
    d: usize,
    /// Global index of local Q / KV head 0 (a tensor-parallel rank's share).
    q_off: usize,
    kv_off: usize,
    rows: Vec<(u64, u64)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        any::<bool>(),
        0usize..96,
        any::<u64>(),
        prop_oneof![
            Just((32, 8)),
            Just((8, 1)),
            Just((64, 8)),
            Just((4, 4)),
            Just((2, 1))
        ],
        prop_oneof![Just(64usize), Just(128), Just(256)],
        proptest::collection::vec((0u64..20_000, 0u64..200_000), 1..10),
        prop_oneof![Just(0usize), 0usize..8],
    )
        .prop_map(
            |(seed, draft, layer, salt, (hq, hkv), d, rows, rank)| Case {
                seed,
                model: if draft {
                    ModelId::Draft
                } else {
                    ModelId::Target
                },
                layer,
                salt,
                hq,
                hkv,
                d,
                q_off: rank * hq,
                kv_off: rank * hkv,
                rows,
            },
        )
}

fn run_case(gpu: &std::sync::Arc<Gpu>, kernel: &GenKernel, c: &Case) -> Result<(), String> {
    let n = c.rows.len();
    let s = gpu.stream();
    let mut q: CudaSlice<u16> = upload(gpu, &vec![POISON; n * c.hq * c.d]).or_fail("q")?;
    let mut k: CudaSlice<u16> = upload(gpu, &vec![POISON; n * c.hkv * c.d]).or_fail("k")?;
    let mut v: CudaSlice<u16> = upload(gpu, &vec![POISON; n * c.hkv * c.d]).or_fail("v")?;
    let req: Vec<u64> = c.rows.iter().map(|r| r.0).collect();
    let pos: Vec<u64> = c.rows.iter().map(|r| r.1).collect();
    let rq = upload(gpu, &req).or_fail("row_req")?;
    let rp = upload(gpu, &pos).or_fail("row_pos")?;
    {
        let mut args = GenArgs {
            q: StridedMut::of("q", &mut q, [n, c.hq, c.d]).or_fail("view")?,
            k: StridedMut::of("k", &mut k, [n, c.hkv, c.d]).or_fail("view")?,
            v: StridedMut::of("v", &mut v, [n, c.hkv, c.d]).or_fail("view")?,
            row_req: Strided::of("row_req", &rq, [n]).or_fail("view")?,
            row_pos: Strided::of("row_pos", &rp, [n]).or_fail("view")?,
            key: GenKey {
                seed: c.seed,
                model: c.model,
                layer: c.layer,
                salt: c.salt,
                q_head_offset: c.q_off,
                kv_head_offset: c.kv_off,
            },
        };
        kernel.launch(&mut args).or_fail("launch")?;
    }
    let g = Generator::new(c.seed);
    for (act, buf, heads, salt, first) in [
        (Act::Q, &q, c.hq, c.salt, c.q_off),
        (Act::K, &k, c.hkv, 0, c.kv_off),
        (Act::V, &v, c.hkv, 0, c.kv_off),
    ] {
        let got = s.clone_dtoh(buf).or_fail("copy back")?;
        for (r, &(req, p)) in c.rows.iter().enumerate() {
            for h in 0..heads {
                for d in 0..c.d {
                    let want = half::bf16::from_f32(g.element(
                        act,
                        c.model,
                        c.layer,
                        req as usize,
                        p as usize,
                        salt,
                        first + h,
                        d,
                    ))
                    .to_bits();
                    let have = got[(r * heads + h) * c.d + d];
                    if have != want {
                        return Err(format!(
                            "{act:?} row {r} (req {req}, pos {p}) head {h} d {d}: got {have:#06x}, want {want:#06x} ({c:?})"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn main() {
    let trials = vec![
        gpu_trial("gpu_matches_generator_proptest", |gpu| {
            let kernel = GenKernel::new(gpu).or_fail("load")?;
            let cases = gpu_cases(GPU_CASES);
            let mut runner = TestRunner::new(Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&case(), |c| {
                    run_case(gpu, &kernel, &c).map_err(TestCaseError::fail)
                })
                .map_err(|e| e.to_string())?;
            println!(
                "gpu_matches_generator_proptest: {cases} cases, {} launches",
                kernel.launches()
            );
            Ok(())
        }),
        gpu_trial("gpu_large_pass_llama3_8b_shape", |gpu| {
            // A 3000-row extend pass of llama3-8b's heads: 2.3 M threads of
            // work over at most 132 × 16 blocks of 256, so the grid-stride
            // loop runs several rounds.
            let kernel = GenKernel::new(gpu).or_fail("load")?;
            let rows: Vec<(u64, u64)> = (0..3000u64).map(|i| (i / 700, i % 700)).collect();
            run_case(
                gpu,
                &kernel,
                &Case {
                    seed: 11,
                    model: ModelId::Target,
                    layer: 31,
                    salt: 123_456,
                    hq: 32,
                    hkv: 8,
                    d: 128,
                    q_off: 0,
                    kv_off: 0,
                    rows,
                },
            )
        }),
        gpu_trial("gpu_rejects_bad_arguments", |gpu| {
            let kernel = GenKernel::new(gpu).or_fail("load")?;
            let mut q: CudaSlice<u16> = upload(gpu, &[0u16; 4 * 60]).or_fail("q")?;
            let mut k: CudaSlice<u16> = upload(gpu, &[0u16; 4 * 60]).or_fail("k")?;
            let mut v: CudaSlice<u16> = upload(gpu, &[0u16; 4 * 60]).or_fail("v")?;
            let rq = upload(gpu, &[0u64; 4]).or_fail("rq")?;
            let rp = upload(gpu, &[0u64; 4]).or_fail("rp")?;
            // head_dim 60 is not a multiple of 8.
            let mut args = GenArgs {
                q: StridedMut::of("q", &mut q, [4, 1, 60]).or_fail("view")?,
                k: StridedMut::of("k", &mut k, [4, 1, 60]).or_fail("view")?,
                v: StridedMut::of("v", &mut v, [4, 1, 60]).or_fail("view")?,
                row_req: Strided::of("row_req", &rq, [4]).or_fail("view")?,
                row_pos: Strided::of("row_pos", &rp, [4]).or_fail("view")?,
                key: GenKey {
                    seed: 0,
                    model: ModelId::Target,
                    layer: 0,
                    salt: 0,
                    q_head_offset: 0,
                    kv_head_offset: 0,
                },
            };
            match kernel.launch(&mut args) {
                Err(KernelError::Unsupported {
                    arg: "head_dim", ..
                }) => {}
                other => return Err(format!("expected head_dim to be rejected, got {other:?}")),
            }
            if kernel.launches() != 0 {
                return Err("a rejected call launched".into());
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}

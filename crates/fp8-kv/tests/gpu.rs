//! GPU tests of the fp8-kv family: the kernels equal the CPU reference byte
//! for byte (caches and error word), caches poisoned before every launch;
//! the issue's named examples again on the GPU; all 256 e4m3 codes; a pool
//! of more than 2³¹ elements; prefill-sized writes. Property cases and the
//! prefill-sized writes run on the device-planned grid and on a grid planned
//! for 1 SM (grid-stride loop, several tokens in flight per thread). Ignored
//! at run time without a GPU.
#![allow(clippy::excessive_precision)] // spec values are quoted digit for digit

use std::sync::Arc;

use fp8_kv::codec::{bf16_bits_to_f32, e4m3_decode, f16_bits_to_f32, quantize};
use fp8_kv::reference::{fused_fp8_set_kv_buffer, set_kv_buffer, HostCache, HostRows, HostWrite};
use fp8_kv::{ErrorFlags, KvCacheDtype, KvDtype, KvScales, KvWriteArgs, KvWriteKernel, ScaleInput};
use half::{bf16, f16};
use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::testing::{gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const POISON8: u8 = 0xA5;
const POISON16: u16 = 0xA5A5;
const GPU_CASES: u32 = 2_500;

/// Which kernel a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `set_kv_buffer`, u16 cache.
    Copy,
    /// Fused FP8 write of bf16 rows.
    Fp8Bf16,
    /// Fused FP8 write of f16 rows.
    Fp8F16,
}

/// One write, host side. Inputs and caches are flat buffers; views start at
/// element offsets `in_off` / `out_off` (an odd offset forces the 1-element path).
#[derive(Debug, Clone)]
struct Case {
    mode: Mode,
    h: usize,
    d: usize,
    n: usize,
    ts: usize,
    hs: usize,
    in_off: usize,
    slots: usize,
    p: usize,
    ss: usize,
    chs: usize,
    out_off: usize,
    loc: Vec<i64>,
    k: Vec<u16>,
    v: Vec<u16>,
    k_scale: Option<f32>,
    v_scale: Option<f32>,
    scale_as_tensor: bool,
    /// Run on the launcher planned for 1 SM (a 4-block wave): the grid-stride
    /// loop and several tokens per thread even for a few dozen tokens.
    small_grid: bool,
}

struct Out {
    k_cache: Vec<u8>,
    v_cache: Vec<u8>,
    err: ErrorReport,
}

fn as_bytes16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Case {
    fn in_len(&self) -> usize {
        self.in_off + self.n.max(1) * self.ts + 16
    }

    fn cache_len(&self) -> usize {
        self.out_off + self.slots * self.ss + 16
    }

    fn dtype(&self) -> KvDtype {
        if self.mode == Mode::Fp8F16 {
            KvDtype::F16
        } else {
            KvDtype::Bf16
        }
    }

    fn host_scales(&self) -> KvScales {
        KvScales::from_values(KvCacheDtype::Fp8E4m3, self.k_scale, self.v_scale)
    }

    fn reference(&self) -> Out {
        let w = HostWrite {
            cache_loc: &self.loc,
            num_kv_heads: self.h,
            head_dim: self.d,
            k: HostRows {
                data: &self.k[self.in_off..],
                token_stride: self.ts,
                head_stride: self.hs,
            },
            v: HostRows {
                data: &self.v[self.in_off..],
                token_stride: self.ts,
                head_stride: self.hs,
            },
        };
        let len = self.cache_len();
        let (slots, ss, chs, off) = (self.slots, self.ss, self.chs, self.out_off);
        let (k_cache, v_cache, err) = if self.mode == Mode::Copy {
            let mut kc = vec![POISON16; len];
            let mut vc = vec![POISON16; len];
            let err = set_kv_buffer(
                &w,
                &mut HostCache {
                    data: &mut kc[off..],
                    slots,
                    slot_stride: ss,
                    head_stride: chs,
                },
                &mut HostCache {
                    data: &mut vc[off..],
                    slots,
                    slot_stride: ss,
                    head_stride: chs,
                },
            );
            (as_bytes16(&kc), as_bytes16(&vc), err)
        } else {
            let mut kc = vec![POISON8; len];
            let mut vc = vec![POISON8; len];
            let err = fused_fp8_set_kv_buffer(
                &w,
                self.dtype(),
                &self.host_scales(),
                &mut HostCache {
                    data: &mut kc[off..],
                    slots,
                    slot_stride: ss,
                    head_stride: chs,
                },
                &mut HostCache {
                    data: &mut vc[off..],
                    slots,
                    slot_stride: ss,
                    head_stride: chs,
                },
            );
            (kc, vc, err)
        };
        Out {
            k_cache,
            v_cache,
            err,
        }
    }

    fn gpu(&self, gpu: &Arc<Gpu>, kernel: &KvWriteKernel) -> Result<Out, KernelError> {
        let s = gpu.stream();
        let k = upload(gpu, &self.k)?;
        let v = upload(gpu, &self.v)?;
        let loc = upload(gpu, &self.loc)?;
        let mut errors = DeviceErrors::new(gpu)?;
        let in_shape = [self.n, self.h, self.d];
        let in_strides = [self.ts, self.hs, 1];
        let c_shape = [self.slots, self.h, self.d];
        let c_strides = [self.ss, self.chs, 1];
        let len = self.cache_len();
        let (k_cache, v_cache) = if self.mode == Mode::Copy {
            let mut kc = s.clone_htod(&vec![POISON16; len])?;
            let mut vc = s.clone_htod(&vec![POISON16; len])?;
            let mut args = KvWriteArgs {
                k: Strided::new("k", k.slice(self.in_off..), in_shape, in_strides)?,
                v: Strided::new("v", v.slice(self.in_off..), in_shape, in_strides)?,
                cache_loc: Strided::contiguous("cache_loc", loc.slice(0..self.n), [self.n])?,
                k_cache: StridedMut::new(
                    "k_cache",
                    kc.slice_mut(self.out_off..),
                    c_shape,
                    c_strides,
                )?,
                v_cache: StridedMut::new(
                    "v_cache",
                    vc.slice_mut(self.out_off..),
                    c_shape,
                    c_strides,
                )?,
                page_size: self.p,
            };
            kernel.set_kv_buffer(&mut args, &mut errors)?;
            (
                as_bytes16(&s.clone_dtoh(&kc)?),
                as_bytes16(&s.clone_dtoh(&vc)?),
            )
        } else {
            let scales = if self.scale_as_tensor {
                let kt = self.k_scale.map(|x| upload(gpu, &[x])).transpose()?;
                let vt = self.v_scale.map(|x| upload(gpu, &[x])).transpose()?;
                fn input(t: &Option<CudaSlice<f32>>) -> ScaleInput<'_> {
                    match t {
                        Some(t) => ScaleInput::Tensor(t.as_view()),
                        None => ScaleInput::Missing,
                    }
                }
                KvScales::resolve(gpu, KvCacheDtype::Fp8E4m3, &input(&kt), &input(&vt))?
            } else {
                let f = |x: Option<f32>| {
                    x.map_or(ScaleInput::Missing, |x| ScaleInput::Float(f64::from(x)))
                };
                KvScales::resolve(
                    gpu,
                    KvCacheDtype::Fp8E4m3,
                    &f(self.k_scale),
                    &f(self.v_scale),
                )?
            };
            let mut kc = s.clone_htod(&vec![POISON8; len])?;
            let mut vc = s.clone_htod(&vec![POISON8; len])?;
            let mut args = KvWriteArgs {
                k: Strided::new("k", k.slice(self.in_off..), in_shape, in_strides)?,
                v: Strided::new("v", v.slice(self.in_off..), in_shape, in_strides)?,
                cache_loc: Strided::contiguous("cache_loc", loc.slice(0..self.n), [self.n])?,
                k_cache: StridedMut::new(
                    "k_cache",
                    kc.slice_mut(self.out_off..),
                    c_shape,
                    c_strides,
                )?,
                v_cache: StridedMut::new(
                    "v_cache",
                    vc.slice_mut(self.out_off..),
                    c_shape,
                    c_strides,
                )?,
                page_size: self.p,
            };
            kernel.fused_fp8_set_kv_buffer(&mut args, self.dtype(), &scales, &mut errors)?;
            (s.clone_dtoh(&kc)?, s.clone_dtoh(&vc)?)
        };
        Ok(Out {
            k_cache,
            v_cache,
            err: errors.read()?,
        })
    }

    /// GPU == reference: whole cache buffers (everything not written must
    /// still hold the poison) and the error word. `small` is the launcher
    /// planned for 1 SM, used when `small_grid` is set.
    fn check(
        &self,
        gpu: &Arc<Gpu>,
        kernel: &KvWriteKernel,
        small: &KvWriteKernel,
    ) -> Result<(), String> {
        let want = self.reference();
        let k = if self.small_grid { small } else { kernel };
        let got = self.gpu(gpu, k).or_fail("launch")?;
        for (name, g, w) in [
            ("k_cache", &got.k_cache, &want.k_cache),
            ("v_cache", &got.v_cache, &want.v_cache),
        ] {
            if let Some(i) = g.iter().zip(w.iter()).position(|(a, b)| a != b) {
                return Err(format!(
                    "{name} differs at byte {i}: gpu {:#04x} vs reference {:#04x} (mode {:?}, h {}, d {}, n {}, {} SMs)",
                    g[i], w[i], self.mode, self.h, self.d, self.n, k.sm_count()
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

/// xorshift64*, for case data derived from one proptest seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One input element: raw bits, values around the e4m3 range and its edges
/// (ties, subnormals, 448..464, overflow), or specials (±0, ±inf, NaNs).
fn element(rng: &mut Rng, mode: Mode) -> u16 {
    let pick = rng.below(10);
    if mode == Mode::Copy || pick == 0 {
        return rng.next() as u16;
    }
    let enc = |x: f32| {
        if mode == Mode::Fp8F16 {
            f16::from_f32(x).to_bits()
        } else {
            bf16::from_f32(x).to_bits()
        }
    };
    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    match pick {
        1..=5 => enc(sign * (rng.below(1 << 20) as f32) * 600.0 / (1 << 20) as f32),
        6 => enc(sign * (rng.below(64) as f32) * 2f32.powi(-11)),
        7 => enc(sign * (440.0 + rng.below(40) as f32)),
        8 => {
            let code = rng.below(256) as u8;
            enc(e4m3_decode(code) * [1.0, 0.5, 2.0, 0.9, 3.0][rng.below(5) as usize])
        }
        _ => {
            let specials_bf16 = [
                0x0000u16, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF,
            ];
            let specials_f16 = [
                0x0000u16, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7BFF,
            ];
            let s = if mode == Mode::Fp8F16 {
                specials_f16
            } else {
                specials_bf16
            };
            s[rng.below(8) as usize]
        }
    }
}

/// Sizes and layout; data and slots come from `seed`.
#[allow(clippy::type_complexity)]
fn case() -> impl Strategy<Value = Case> {
    let mode = prop_oneof![Just(Mode::Copy), Just(Mode::Fp8Bf16), Just(Mode::Fp8F16)];
    let d = prop_oneof![3 => Just(16usize), 2 => Just(128), 2 => Just(64), 1 => Just(8), 1 => Just(256), 2 => 1usize..=40];
    let h = prop_oneof![4 => 1usize..=4, 1 => Just(8)];
    let p = prop_oneof![Just(1usize), Just(2), Just(4), Just(16)];
    let in_pad = prop_oneof![4 => Just((0usize, 0usize, 0usize)), 1 => Just((8, 8, 8)), 1 => Just((3, 1, 1)), 1 => Just((0, 0, 1))];
    let out_pad = prop_oneof![4 => Just((0usize, 0usize, 0usize)), 1 => Just((16, 16, 16)), 1 => Just((5, 2, 1)), 1 => Just((0, 0, 1))];
    let scale = prop_oneof![
        2 => Just(None),
        3 => (0.01f32..10.0).prop_map(Some),
        1 => Just(Some(0.9f32)),
        1 => Just(Some(2.0f32)),
        1 => prop_oneof![Just(0.0f32), Just(-1.0), Just(f32::NAN), Just(1e-3), Just(300.0)].prop_map(Some),
    ];
    (
        mode,
        d,
        h,
        p,
        1usize..=6,
        in_pad,
        out_pad,
        (scale.clone(), scale, any::<bool>(), any::<bool>()),
        any::<u64>(),
        0usize..=48,
    )
        .prop_map(
            |(
                mode,
                d,
                h,
                p,
                pages,
                (tpad, hpad, in_off),
                (spad, chpad, out_off),
                (ks, vs, tensor, small_grid),
                seed,
                n_max,
            )| {
                let mut rng = Rng(seed | 1);
                let slots = p * pages;
                let hs = d + hpad;
                let ts = h * hs + tpad;
                let chs = d + chpad;
                let ss = h * chs + spad;
                // Distinct valid slots (a duplicate has no defined winner), plus a few bad ones.
                let mut perm: Vec<i64> = (0..slots as i64).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut loc: Vec<i64> = perm[..n_max.min(slots)].to_vec();
                for _ in 0..rng.below(3) {
                    let bad = [-1i64, slots as i64, i64::MIN, i64::MAX, -(slots as i64)]
                        [rng.below(5) as usize];
                    let at = rng.below(loc.len() as u64 + 1) as usize;
                    loc.insert(at, bad);
                }
                let n = loc.len();
                let mut c = Case {
                    mode,
                    h,
                    d,
                    n,
                    ts,
                    hs,
                    in_off,
                    slots,
                    p,
                    ss,
                    chs,
                    out_off,
                    loc,
                    k: vec![],
                    v: vec![],
                    k_scale: ks,
                    v_scale: vs,
                    scale_as_tensor: tensor,
                    small_grid,
                };
                let len = c.in_len();
                c.k = (0..len).map(|_| element(&mut rng, mode)).collect();
                c.v = (0..len).map(|_| element(&mut rng, mode)).collect();
                c
            },
        )
}

/// A fused bf16 write of one token `row` (`[1, 1, D]`) at slot `loc` of a
/// `[slots, 1, D]` cache; returns (K cache, V cache, error word).
#[allow(clippy::too_many_arguments)]
fn one_row(
    gpu: &Arc<Gpu>,
    kernel: &KvWriteKernel,
    row: &[u16],
    dtype: KvDtype,
    loc: i64,
    slots: usize,
    p: usize,
    scales: &KvScales,
) -> Result<(Vec<u8>, Vec<u8>, ErrorReport), KernelError> {
    let s = gpu.stream();
    let d = row.len();
    let k = upload(gpu, row)?;
    let cl = upload(gpu, &[loc])?;
    let mut kc = s.clone_htod(&vec![POISON8; slots * d])?;
    let mut vc = s.clone_htod(&vec![POISON8; slots * d])?;
    let mut errors = DeviceErrors::new(gpu)?;
    let mut args = KvWriteArgs {
        k: Strided::of("k", &k, [1, 1, d])?,
        v: Strided::of("v", &k, [1, 1, d])?,
        cache_loc: Strided::of("cache_loc", &cl, [1])?,
        k_cache: StridedMut::of("k_cache", &mut kc, [slots, 1, d])?,
        v_cache: StridedMut::of("v_cache", &mut vc, [slots, 1, d])?,
        page_size: p,
    };
    kernel.fused_fp8_set_kv_buffer(&mut args, dtype, scales, &mut errors)?;
    Ok((s.clone_dtoh(&kc)?, s.clone_dtoh(&vc)?, errors.read()?))
}

fn bf(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// Issue 3: loc 13, P = 4, K = [4, −3, 500, 1000], k_scale 2 as a float and
/// as a one-element device tensor → 0x40 0xBC 0x78 0x7E at byte 52, both
/// paths (D = 4: 1-element path; the row repeated to D = 16: 16-byte path).
fn issue_example(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let tensor = upload(gpu, &[2.0f32]).or_fail("upload")?;
    let from_tensor = KvScales::resolve(
        gpu,
        KvCacheDtype::Fp8E4m3,
        &ScaleInput::Tensor(tensor.as_view()),
        &ScaleInput::Missing,
    )
    .or_fail("resolve tensor")?;
    let from_float = KvScales::resolve(
        gpu,
        KvCacheDtype::Fp8E4m3,
        &ScaleInput::Float(2.0),
        &ScaleInput::Missing,
    )
    .or_fail("resolve float")?;
    if from_tensor != from_float || from_tensor.k_scale() != 2.0 {
        return Err(format!("tensor {from_tensor:?} vs float {from_float:?}"));
    }
    let base = [4.0, -3.0, 500.0, 1000.0].map(bf);
    for reps in [1usize, 4] {
        let row: Vec<u16> = base.iter().copied().cycle().take(4 * reps).collect();
        let d = row.len();
        for scales in [from_float, from_tensor] {
            let (kc, _, err) =
                one_row(gpu, &kernel, &row, KvDtype::Bf16, 13, 16, 4, &scales).or_fail("launch")?;
            let at = 13 * d;
            let want: Vec<u8> = [0x40u8, 0xBC, 0x78, 0x7E]
                .iter()
                .copied()
                .cycle()
                .take(d)
                .collect();
            if kc[at..at + d] != want[..] || !err.is_clean() {
                return Err(format!(
                    "D={d}: bytes {:02x?} at {at}, err {err:?}",
                    &kc[at..at + d]
                ));
            }
            if kc[..at].iter().chain(&kc[at + d..]).any(|&b| b != POISON8) {
                return Err(format!("D={d}: bytes outside slot 13 changed"));
            }
            let back: Vec<f32> = kc[at..at + 4]
                .iter()
                .map(|&c| e4m3_decode(c) * 2.0)
                .collect();
            if back != [4.0, -3.0, 512.0, 896.0] || kc.contains(&0x7F) {
                return Err(format!("read back {back:?}"));
            }
        }
    }
    Ok(())
}

/// Issue 3: bf16 0.02197265625 with k_scale 0.9 → 0x0D on the GPU (both paths).
fn reciprocal_example(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let scales = KvScales::from_values(KvCacheDtype::Fp8E4m3, Some(0.9), Some(0.9));
    for d in [1usize, 16] {
        let row = vec![bf(0.02197265625); d];
        let (kc, vc, _) =
            one_row(gpu, &kernel, &row, KvDtype::Bf16, 0, 1, 1, &scales).or_fail("launch")?;
        if kc.iter().chain(&vc).any(|&b| b != 0x0D) {
            return Err(format!(
                "D={d}: got {kc:02x?}, want 0x0D (0x0C would be a true division)"
            ));
        }
    }
    Ok(())
}

/// All 256 codes, scales {1, 2, 0.5, 0.0625, 0.9, 3}, bf16 and f16: GPU
/// encode(decode(code)·scale) with that scale equals the host codec (and the
/// code itself for power-of-two scales, NaN → 0x7F); then saturation and NaN rows.
fn all_codes(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    for dtype in [KvDtype::Bf16, KvDtype::F16] {
        #[allow(clippy::type_complexity)]
        let (enc, widen): (fn(f32) -> u16, fn(u16) -> f32) = match dtype {
            KvDtype::Bf16 => (|x| bf16::from_f32(x).to_bits(), bf16_bits_to_f32),
            KvDtype::F16 => (|x| f16::from_f32(x).to_bits(), f16_bits_to_f32),
        };
        for scale in [1.0f32, 2.0, 0.5, 0.0625, 0.9, 3.0] {
            let scales = KvScales::from_values(KvCacheDtype::Fp8E4m3, Some(scale), Some(scale));
            let row: Vec<u16> = (0..=255u8).map(|c| enc(e4m3_decode(c) * scale)).collect();
            for d_path in [256usize, 255] {
                // 255 elements: the 1-element path.
                let row = &row[..d_path];
                let (kc, _, _) =
                    one_row(gpu, &kernel, row, dtype, 0, 1, 1, &scales).or_fail("launch")?;
                for (i, (&got, &x)) in kc.iter().zip(row).enumerate() {
                    let want = quantize(widen(x), scales.inv_k_scale());
                    if got != want {
                        return Err(format!("{dtype:?} scale {scale} code {i:#04x}: gpu {got:#04x}, host {want:#04x}"));
                    }
                    let exact = scale.log2().fract() == 0.0;
                    let code_back = if i & 0x7F == 0x7F { 0x7F } else { i as u8 };
                    if exact && got != code_back {
                        return Err(format!(
                            "{dtype:?} scale {scale}: code {i:#04x} came back as {got:#04x}"
                        ));
                    }
                }
            }
        }
        // Saturation and NaN, 16 elements (16-byte path) with scale 1.
        let specials: Vec<(u16, u8)> = match dtype {
            KvDtype::Bf16 => vec![
                (bf(450.0), 0x7E),
                (bf(464.0), 0x7E),
                (bf(466.0), 0x7E),
                (bf(480.0), 0x7E),
                (bf(1e38), 0x7E),
                (0x7F80, 0x7E),
                (0xFF80, 0xFE),
                (bf(-450.0), 0xFE),
                (bf(-1e30), 0xFE),
                (0x7FC0, 0x7F),
                (0xFFC0, 0x7F),
                (0x7F81, 0x7F),
                (0xFF81, 0x7F),
                (0xFFFF, 0x7F),
                (bf(448.0), 0x7E),
                (0x8000, 0x80),
            ],
            KvDtype::F16 => vec![
                (0x5F08, 0x7E),
                (0x5F40, 0x7E),
                (0x5F48, 0x7E),
                (0x5F80, 0x7E),
                (0x7BFF, 0x7E),
                (0x7C00, 0x7E),
                (0xFC00, 0xFE),
                (0xDF08, 0xFE),
                (0xFBFF, 0xFE),
                (0x7E00, 0x7F),
                (0xFE00, 0x7F),
                (0x7C01, 0x7F),
                (0xFC01, 0x7F),
                (0xFFFF, 0x7F),
                (0x5F00, 0x7E),
                (0x8000, 0x80),
            ],
        };
        let row: Vec<u16> = specials.iter().map(|x| x.0).collect();
        for d in [16usize, 15] {
            let (kc, _, _) = one_row(
                gpu,
                &kernel,
                &row[..d],
                dtype,
                0,
                1,
                1,
                &KvScales::unit(KvCacheDtype::Fp8E4m3),
            )
            .or_fail("launch")?;
            for (i, &got) in kc.iter().enumerate() {
                if got != specials[i].1 {
                    return Err(format!(
                        "{dtype:?} input {:#06x}: gpu {got:#04x}, want {:#04x}",
                        specials[i].0, specials[i].1
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A pool of 2²² slots × 8 heads × 128 dims (2³² elements) written at its
/// last slot: FP8 (4 GiB per cache) and bf16 (8 GiB per cache). Windows
/// (first slots, the 2³¹-element boundary, the last slots) are poisoned and
/// read back: only the last slot's row changes; a slot past the end is counted.
fn large_pool(gpu: &Arc<Gpu>, fp8: bool) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let s = gpu.stream();
    let (slots, h, d) = (1usize << 22, 8usize, 128usize);
    let row = h * d;
    let last = slots - 1;
    let row_vals: Vec<u16> = (0..row).map(|i| bf(1.0 + (i % 97) as f32 * 0.75)).collect();
    let windows = [
        0..2 * row,
        (1 << 31) - row..(1 << 31) + row,
        (slots - 3) * row..slots * row,
    ];
    let k = upload(gpu, &row_vals).or_fail("upload")?;
    let v_vals: Vec<u16> = row_vals.iter().map(|&x| x ^ 0x8000).collect();
    let v = upload(gpu, &v_vals).or_fail("upload")?;
    let loc = upload(gpu, &[last as i64, slots as i64]).or_fail("upload")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
    let views = |n: usize| -> Result<_, KernelError> {
        Ok((
            // Every token reads the same row (token stride 0).
            Strided::new("k", k.as_view(), [n, h, d], [0, d, 1])?,
            Strided::new("v", v.as_view(), [n, h, d], [0, d, 1])?,
            Strided::contiguous("cache_loc", loc.slice(0..n), [n])?,
        ))
    };
    let (want_k, want_v): (Vec<u8>, Vec<u8>) = if fp8 {
        (
            row_vals
                .iter()
                .map(|&x| quantize(bf16_bits_to_f32(x), 1.0))
                .collect(),
            v_vals
                .iter()
                .map(|&x| quantize(bf16_bits_to_f32(x), 1.0))
                .collect(),
        )
    } else {
        (as_bytes16(&row_vals), as_bytes16(&v_vals))
    };
    let check = |name: &str,
                 got: Vec<u8>,
                 want_row: &[u8],
                 elem: usize,
                 w: &std::ops::Range<usize>|
     -> Result<(), String> {
        for (i, &b) in got.iter().enumerate() {
            let e = w.start + i / elem;
            let want = if e >= last * row {
                want_row[(e - last * row) * elem + i % elem]
            } else {
                POISON8
            };
            if b != want {
                return Err(format!(
                    "{name}: element {e} byte {} is {b:#04x}, want {want:#04x}",
                    i % elem
                ));
            }
        }
        Ok(())
    };
    if fp8 {
        let mut kc = s.alloc_zeros::<u8>(slots * row).or_fail("alloc 4 GiB")?;
        let mut vc = s.alloc_zeros::<u8>(slots * row).or_fail("alloc 4 GiB")?;
        for w in &windows {
            s.memcpy_htod(&vec![POISON8; w.len()], &mut kc.slice_mut(w.clone()))
                .or_fail("poison")?;
            s.memcpy_htod(&vec![POISON8; w.len()], &mut vc.slice_mut(w.clone()))
                .or_fail("poison")?;
        }
        let (kv, vv, lv) = views(2).or_fail("views")?;
        let mut args = KvWriteArgs {
            k: kv,
            v: vv,
            cache_loc: lv,
            k_cache: StridedMut::of("k_cache", &mut kc, [slots, h, d]).or_fail("view")?,
            v_cache: StridedMut::of("v_cache", &mut vc, [slots, h, d]).or_fail("view")?,
            page_size: 64,
        };
        let scales = KvScales::unit(KvCacheDtype::Fp8E4m3);
        kernel
            .fused_fp8_set_kv_buffer(&mut args, KvDtype::Bf16, &scales, &mut errors)
            .or_fail("launch")?;
        for w in &windows {
            check(
                "k_cache",
                s.clone_dtoh(&kc.slice(w.clone())).or_fail("read")?,
                &want_k,
                1,
                w,
            )?;
            check(
                "v_cache",
                s.clone_dtoh(&vc.slice(w.clone())).or_fail("read")?,
                &want_v,
                1,
                w,
            )?;
        }
    } else {
        let mut kc = s.alloc_zeros::<u16>(slots * row).or_fail("alloc 8 GiB")?;
        let mut vc = s.alloc_zeros::<u16>(slots * row).or_fail("alloc 8 GiB")?;
        for w in &windows {
            s.memcpy_htod(&vec![POISON16; w.len()], &mut kc.slice_mut(w.clone()))
                .or_fail("poison")?;
            s.memcpy_htod(&vec![POISON16; w.len()], &mut vc.slice_mut(w.clone()))
                .or_fail("poison")?;
        }
        let (kv, vv, lv) = views(2).or_fail("views")?;
        let mut args = KvWriteArgs {
            k: kv,
            v: vv,
            cache_loc: lv,
            k_cache: StridedMut::of("k_cache", &mut kc, [slots, h, d]).or_fail("view")?,
            v_cache: StridedMut::of("v_cache", &mut vc, [slots, h, d]).or_fail("view")?,
            page_size: 64,
        };
        kernel
            .set_kv_buffer(&mut args, &mut errors)
            .or_fail("launch")?;
        for w in &windows {
            check(
                "k_cache",
                as_bytes16(&s.clone_dtoh(&kc.slice(w.clone())).or_fail("read")?),
                &want_k,
                2,
                w,
            )?;
            check(
                "v_cache",
                as_bytes16(&s.clone_dtoh(&vc.slice(w.clone())).or_fail("read")?),
                &want_v,
                2,
                w,
            )?;
        }
    }
    let err = errors.read().or_fail("error word")?;
    if err
        != (ErrorReport {
            count: 1,
            flags: ErrorFlags::SLOT_OUTSIDE_POOL.bits(),
        })
    {
        return Err(format!(
            "slot 2^22 (past the pool) should be counted once: {err:?}"
        ));
    }
    Ok(())
}

fn bad_arguments(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let s = gpu.stream();
    let k = s.alloc_zeros::<u16>(64).or_fail("alloc")?;
    let loc = s.alloc_zeros::<i64>(4).or_fail("alloc")?;
    let mut kc = s.alloc_zeros::<u8>(256).or_fail("alloc")?;
    let mut vc = s.alloc_zeros::<u8>(256).or_fail("alloc")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
    let fp8 = KvScales::unit(KvCacheDtype::Fp8E4m3);
    let mut args = KvWriteArgs {
        k: Strided::of("k", &k, [4, 2, 8]).or_fail("view")?,
        v: Strided::of("v", &k, [4, 1, 8]).or_fail("view")?,
        cache_loc: Strided::of("cache_loc", &loc, [4]).or_fail("view")?,
        k_cache: StridedMut::of("k_cache", &mut kc, [16, 2, 8]).or_fail("view")?,
        v_cache: StridedMut::of("v_cache", &mut vc, [16, 2, 8]).or_fail("view")?,
        page_size: 4,
    };
    match kernel.fused_fp8_set_kv_buffer(&mut args, KvDtype::Bf16, &fp8, &mut errors) {
        Err(KernelError::Shape { arg: "v", .. }) => {}
        other => return Err(format!("expected a shape error naming v, got {other:?}")),
    }
    args.v = Strided::of("v", &k, [4, 2, 8]).or_fail("view")?;
    args.page_size = 3;
    match kernel.fused_fp8_set_kv_buffer(&mut args, KvDtype::Bf16, &fp8, &mut errors) {
        Err(KernelError::Unsupported { arg: "k_cache", .. }) => {}
        other => return Err(format!("expected S % P to be rejected, got {other:?}")),
    }
    args.page_size = 0;
    match kernel.fused_fp8_set_kv_buffer(&mut args, KvDtype::Bf16, &fp8, &mut errors) {
        Err(KernelError::Unsupported {
            arg: "page_size", ..
        }) => {}
        other => {
            return Err(format!(
                "expected page_size 0 to be rejected, got {other:?}"
            ))
        }
    }
    args.page_size = 4;
    let bf16_scales = KvScales::unit(KvCacheDtype::Bf16);
    match kernel.fused_fp8_set_kv_buffer(&mut args, KvDtype::Bf16, &bf16_scales, &mut errors) {
        Err(KernelError::Unsupported { arg: "scales", .. }) => {}
        other => {
            return Err(format!(
                "expected bf16-cache scales to be rejected, got {other:?}"
            ))
        }
    }
    if kernel.launches() != 0 {
        return Err("a rejected call launched".into());
    }
    let empty = s.alloc_zeros::<f32>(1).or_fail("alloc")?;
    match KvScales::resolve(
        gpu,
        KvCacheDtype::Fp8E4m3,
        &ScaleInput::Tensor(empty.slice(0..0)),
        &ScaleInput::Missing,
    ) {
        Err(KernelError::Shape { arg: "k_scale", .. }) => {}
        other => {
            return Err(format!(
                "expected an empty scale tensor to be rejected, got {other:?}"
            ))
        }
    }
    // Non-FP8 caches never read the tensor and ignore the scales.
    let t = upload(gpu, &[0.25f32]).or_fail("upload")?;
    let r = KvScales::resolve(
        gpu,
        KvCacheDtype::Bf16,
        &ScaleInput::Tensor(t.as_view()),
        &ScaleInput::Float(4.0),
    )
    .or_fail("resolve")?;
    if (r.k_scale(), r.v_scale()) != (1.0, 1.0) {
        return Err(format!("bf16 cache kept scales {r:?}"));
    }
    Ok(())
}

/// Prefill-sized writes: thousands of tokens in page-contiguous slots of
/// shuffled pages (P = 64) plus three bad slots, on the device-planned grid
/// (one wave, several batches of tokens per thread) and on the 1-SM grid;
/// vectorized and 1-element paths, one token over several lane passes.
fn many_tokens(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let small = KvWriteKernel::new(gpu).or_fail("load")?.with_sm_count(1);
    let shapes = [
        (Mode::Fp8Bf16, 8usize, 128usize, 9_001usize),
        (Mode::Fp8F16, 8, 128, 9_001),
        (Mode::Copy, 8, 128, 9_001),
        (Mode::Fp8Bf16, 3, 40, 5_003),
        (Mode::Copy, 3, 40, 5_003),
        (Mode::Copy, 3, 37, 2_001),
        (Mode::Fp8Bf16, 64, 128, 700),
        (Mode::Copy, 64, 128, 700),
    ];
    let mut rng = Rng(0x5DEE_CE66_D1CE_F00D);
    for (mode, h, d, n) in shapes {
        const P: usize = 64;
        let pages = 2 * n.div_ceil(P) + 1;
        let mut order: Vec<usize> = (0..pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut loc: Vec<i64> = (0..n - 3)
            .map(|t| (order[t / P] * P + t % P) as i64)
            .collect();
        for bad in [-1i64, (pages * P) as i64, i64::MIN] {
            let at = rng.below(loc.len() as u64 + 1) as usize;
            loc.insert(at, bad);
        }
        let mut c = Case {
            mode,
            h,
            d,
            n,
            ts: h * d,
            hs: d,
            in_off: 0,
            slots: pages * P,
            p: P,
            ss: h * d,
            chs: d,
            out_off: 0,
            loc,
            k: vec![],
            v: vec![],
            k_scale: Some(0.9),
            v_scale: Some(1.7),
            scale_as_tensor: false,
            small_grid: false,
        };
        let len = c.in_len();
        c.k = (0..len).map(|_| element(&mut rng, mode)).collect();
        c.v = (0..len).map(|_| element(&mut rng, mode)).collect();
        c.check(gpu, &kernel, &small)?;
        c.small_grid = true;
        c.check(gpu, &kernel, &small)?;
    }
    Ok(())
}

fn empty_write(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let c = Case {
        mode: Mode::Fp8Bf16,
        h: 2,
        d: 16,
        n: 0,
        ts: 32,
        hs: 16,
        in_off: 0,
        slots: 4,
        p: 4,
        ss: 32,
        chs: 16,
        out_off: 0,
        loc: vec![],
        k: vec![0; 64],
        v: vec![0; 64],
        k_scale: None,
        v_scale: None,
        scale_as_tensor: false,
        small_grid: false,
    };
    let out = c.gpu(gpu, &kernel).or_fail("launch")?;
    if kernel.launches() != 0 || !out.err.is_clean() || out.k_cache.iter().any(|&b| b != POISON8) {
        return Err(format!(
            "n = 0 launched {} kernel(s) or wrote",
            kernel.launches()
        ));
    }
    Ok(())
}

/// Paged cache views (NHD, HND, padded pages; 16-byte and 1-element
/// paths; bf16 copy and both FP8 writes): the paged kernel == the paged
/// reference, caches poisoned, error word included (bad slots mixed in).
fn paged_layouts(gpu: &Arc<Gpu>) -> Result<(), String> {
    use fp8_kv::reference::{fused_fp8_set_kv_buffer_paged, set_kv_buffer_paged, HostPagedCache};
    use fp8_kv::PagedKvWriteArgs;
    let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
    let s = gpu.stream();
    let scales = KvScales::from_values(KvCacheDtype::Fp8E4m3, Some(0.5), Some(2.0));
    // (pages, P, Hkv, D, layout 0 = NHD / 1 = HND / 2 = padded NHD, odd input offset)
    let cases = [
        (5usize, 16usize, 2usize, 64usize, 0u8, false),
        (5, 16, 2, 64, 1, false),
        (7, 4, 3, 128, 2, false),
        (3, 1, 1, 64, 1, false),
        (4, 8, 2, 24, 1, true),
    ];
    let mut seed = 0x1234_5678u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (ci, &(pages, p, hkv, d, layout, odd)) in cases.iter().enumerate() {
        let pad = if layout == 2 { 32 } else { 0 };
        // [pages, Hkv, P, D] index order.
        let strides: [usize; 4] = match layout {
            1 => [hkv * p * d, p * d, d, 1],
            _ => [p * hkv * d + pad, d, hkv * d, 1],
        };
        let len = (pages - 1) * strides[0] + (hkv - 1) * strides[1] + (p - 1) * strides[2] + d;
        let slots = pages * p;
        let n = 2 * slots / 3 + 1;
        // Distinct slots (a batch never writes one slot twice; with a
        // repeated slot the order of the two writes is unspecified): the
        // first n of a random permutation.
        let mut perm: Vec<i64> = (0..slots as i64).collect();
        for i in (1..slots).rev() {
            perm.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let mut loc: Vec<i64> = perm[..n].to_vec();
        loc[0] = slots as i64; // outside the pool
        if n > 2 {
            loc[2] = -1;
        }
        let off = usize::from(odd);
        let rows: Vec<u16> = (0..off + n * hkv * d)
            .map(|_| bf(((next() % 2001) as f32 - 1000.0) / 250.0))
            .collect();
        let (k_in, v_in) = (
            upload(gpu, &rows).or_fail("htod")?,
            upload(gpu, &rows).or_fail("htod")?,
        );
        let d_loc = upload(gpu, &loc).or_fail("htod")?;
        let w = HostWrite {
            cache_loc: &loc,
            num_kv_heads: hkv,
            head_dim: d,
            k: HostRows {
                data: &rows[off..],
                token_stride: hkv * d,
                head_stride: d,
            },
            v: HostRows {
                data: &rows[off..],
                token_stride: hkv * d,
                head_stride: d,
            },
        };
        for mode in [Mode::Copy, Mode::Fp8Bf16, Mode::Fp8F16] {
            fn host<C>(
                data: &mut [C],
                pages: usize,
                p: usize,
                strides: [usize; 4],
            ) -> HostPagedCache<'_, C> {
                HostPagedCache {
                    data,
                    num_pages: pages,
                    page_size: p,
                    page_stride: strides[0],
                    head_stride: strides[1],
                    token_stride: strides[2],
                }
            }
            let mut errors = DeviceErrors::new(gpu).or_fail("alloc")?;
            let shape = [pages, hkv, p, d];
            fn view<'a>(
                t: &'a CudaSlice<u16>,
                off: usize,
                n: usize,
                hkv: usize,
                d: usize,
            ) -> Result<Strided<'a, u16, 3>, KernelError> {
                Strided::new(
                    "k",
                    t.slice(off..off + n * hkv * d),
                    [n, hkv, d],
                    [hkv * d, d, 1],
                )
            }
            let cl = Strided::of("cache_loc", &d_loc, [n]).or_fail("view")?;
            let (got_k, got_v, want_k, want_v, want_err) = if mode == Mode::Copy {
                let (mut wk, mut wv) = (vec![POISON16; len], vec![POISON16; len]);
                let e = set_kv_buffer_paged(
                    &w,
                    &mut host(&mut wk, pages, p, strides),
                    &mut host(&mut wv, pages, p, strides),
                );
                let mut kc = upload(gpu, &vec![POISON16; len]).or_fail("htod")?;
                let mut vc = upload(gpu, &vec![POISON16; len]).or_fail("htod")?;
                let mut args = PagedKvWriteArgs {
                    k: view(&k_in, off, n, hkv, d).or_fail("view")?,
                    v: view(&v_in, off, n, hkv, d).or_fail("view")?,
                    cache_loc: cl,
                    k_cache: StridedMut::new("k_cache", kc.slice_mut(0..len), shape, strides)
                        .or_fail("view")?,
                    v_cache: StridedMut::new("v_cache", vc.slice_mut(0..len), shape, strides)
                        .or_fail("view")?,
                };
                kernel
                    .set_kv_buffer_paged(&mut args, &mut errors)
                    .or_fail("launch")?;
                let gk: Vec<u8> = s
                    .clone_dtoh(&kc)
                    .or_fail("dtoh")?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                let gv: Vec<u8> = s
                    .clone_dtoh(&vc)
                    .or_fail("dtoh")?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                let b = |v: Vec<u16>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                (gk, gv, b(wk), b(wv), e)
            } else {
                let dt = if mode == Mode::Fp8F16 {
                    KvDtype::F16
                } else {
                    KvDtype::Bf16
                };
                let (mut wk, mut wv) = (vec![POISON8; len], vec![POISON8; len]);
                let e = fused_fp8_set_kv_buffer_paged(
                    &w,
                    dt,
                    &scales,
                    &mut host(&mut wk, pages, p, strides),
                    &mut host(&mut wv, pages, p, strides),
                );
                let mut kc = upload(gpu, &vec![POISON8; len]).or_fail("htod")?;
                let mut vc = upload(gpu, &vec![POISON8; len]).or_fail("htod")?;
                let mut args = PagedKvWriteArgs {
                    k: view(&k_in, off, n, hkv, d).or_fail("view")?,
                    v: view(&v_in, off, n, hkv, d).or_fail("view")?,
                    cache_loc: cl,
                    k_cache: StridedMut::new("k_cache", kc.slice_mut(0..len), shape, strides)
                        .or_fail("view")?,
                    v_cache: StridedMut::new("v_cache", vc.slice_mut(0..len), shape, strides)
                        .or_fail("view")?,
                };
                kernel
                    .fused_fp8_set_kv_buffer_paged(&mut args, dt, &scales, &mut errors)
                    .or_fail("launch")?;
                (
                    s.clone_dtoh(&kc).or_fail("dtoh")?,
                    s.clone_dtoh(&vc).or_fail("dtoh")?,
                    wk,
                    wv,
                    e,
                )
            };
            let got_err = errors.read().or_fail("errors")?;
            if got_k != want_k || got_v != want_v || got_err != want_err || want_err.is_clean() {
                return Err(format!(
                    "case {ci} {mode:?}: caches or errors differ ({got_err:?} vs {want_err:?})"
                ));
            }
        }
    }
    Ok(())
}

fn main() {
    let trials = vec![
        gpu_trial("paged_views_nhd_hnd_padded_match_reference", paged_layouts),
        gpu_trial("gpu_matches_reference_proptest", |gpu| {
            let kernel = KvWriteKernel::new(gpu).or_fail("load")?;
            let small = KvWriteKernel::new(gpu).or_fail("load")?.with_sm_count(1);
            let mut runner = TestRunner::new(Config {
                cases: GPU_CASES,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&case(), |c| {
                    c.check(gpu, &kernel, &small).map_err(TestCaseError::fail)
                })
                .map_err(|e| e.to_string())?;
            println!(
                "gpu_matches_reference_proptest: {GPU_CASES} cases, {} launches ({} SMs), {} launches (grid planned for 1 SM)",
                kernel.launches(),
                kernel.sm_count(),
                small.launches()
            );
            Ok(())
        }),
        gpu_trial("issue_example_one_token_loc13_scale2", |gpu| {
            issue_example(gpu)
        }),
        gpu_trial("issue_example_reciprocal_not_division", |gpu| {
            reciprocal_example(gpu)
        }),
        gpu_trial("all_256_codes_saturation_and_nan", all_codes),
        gpu_trial("pool_over_2_pow_31_elements_fp8_last_slot", |gpu| {
            large_pool(gpu, true)
        }),
        gpu_trial("pool_over_2_pow_31_elements_bf16_last_slot", |gpu| {
            large_pool(gpu, false)
        }),
        gpu_trial("bad_arguments_are_errors_before_launch", |gpu| {
            bad_arguments(gpu)
        }),
        gpu_trial("empty_write_no_launch", empty_write),
        gpu_trial("many_tokens_grid_stride_both_grids", many_tokens),
    ];
    run_trials(trials)
}

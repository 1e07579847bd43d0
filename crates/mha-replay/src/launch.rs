//! Typed launcher of `mha_replay_gen_qkv` (`kernels/mha_replay_gen.cu`):
//! one launch writes a layer's Q, K and V rows of a pass on the device,
//! bit-identical to [`Generator::element`](crate::gen::Generator::element)
//! rounded to bf16 — the host never builds them, yet the checker can
//! regenerate any row.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{grid_dim, to_i32, to_i64, Gpu, KernelError, Result, Strided, StridedMut};

use crate::gen::ModelId;

/// The embedded PTX of the generator (`cargo xtask ptx-build`).
pub const PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "mha_replay_gen",
    ptx: include_str!("../ptx/mha_replay_gen.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/mha_replay_gen.sm_90.cubin"),
        stamp: include_str!("../ptx/mha_replay_gen.sm_90.cubin.stamp"),
    }),
};

/// The C header generated from [`GenParams`] (`cargo xtask abi`; the kernel
/// includes it, a CPU test checks it is current).
pub const ABI: kernel_rt::abi::Header = kernel_rt::abi::Header {
    path: "kernels/mha_replay_abi.cuh",
    rust_crate: "mha_replay",
    flag_sets: &[],
    structs: &[GenParams::ABI],
};

/// Kernel entry point names used by the launcher (pinned by a CPU test).
pub const KERNEL_NAMES: &[&str] = &["mha_replay_gen_qkv"];

/// Threads per block.
pub const BLOCK_THREADS: u32 = 256;
/// Elements one thread writes (one 16-byte store); `head_dim` must be a
/// multiple of it.
pub const ELEMS_PER_THREAD: usize = 8;
/// Most blocks of one launch (grid-stride beyond): 132 SMs × 16.
const MAX_BLOCKS: usize = 132 * 16;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/mha_replay_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GenParams {
        /// `u16*` `[rows, Hq, D]` bf16 bits.
        pub q: u64 = "u64",
        /// `u16*` `[rows, Hkv, D]` bf16 bits.
        pub k: u64 = "u64",
        /// `u16*` `[rows, Hkv, D]` bf16 bits.
        pub v: u64 = "u64",
        /// `const u64*` `[rows]`: trace request id of each row.
        pub row_req: u64 = "u64",
        /// `const u64*` `[rows]`: token position of each row.
        pub row_pos: u64 = "u64",
        /// `--seed`.
        pub seed: u64 = "u64",
        /// [`ModelId`] as `u64` (0 target, 1 draft).
        pub model: u64 = "u64",
        /// Layer id.
        pub layer: u64 = "u64",
        /// Q salt (the pass's sequence number); K/V use 0.
        pub salt: u64 = "u64",
        /// Rows.
        pub rows: i64 = "i64",
        /// `Hq`.
        pub num_q_heads: i32 = "i32",
        /// `Hkv`.
        pub num_kv_heads: i32 = "i32",
        /// `D`, a multiple of [`ELEMS_PER_THREAD`].
        pub head_dim: i32 = "i32",
        /// Global index of local Q head 0 (a tensor-parallel rank's first
        /// query head; 0 unsharded): the hash keys on the global head.
        pub q_head_offset: i32 = "i32",
        /// Global index of local K/V head 0 (as `q_head_offset`).
        pub kv_head_offset: i32 = "i32",
        /// Padding, 0.
        pub reserved: i32 = "i32",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/mha_replay_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for GenParams {}

/// What the generated activations are keyed by (besides row and head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenKey {
    /// `--seed`.
    pub seed: u64,
    /// Target or draft model.
    pub model: ModelId,
    /// Layer id.
    pub layer: usize,
    /// Q salt (pass sequence number).
    pub salt: u64,
    /// Global index of the first Q head generated (a tensor-parallel
    /// rank's [`mha_backend::HeadShard::q_head_offset`]; 0 unsharded).
    pub q_head_offset: usize,
    /// Global index of the first K/V head generated (as `q_head_offset`).
    pub kv_head_offset: usize,
}

/// Arguments of one launch (all device buffers on the launcher's GPU,
/// contiguous).
#[derive(Debug)]
pub struct GenArgs<'a> {
    /// `[rows, Hq, D]` output.
    pub q: StridedMut<'a, u16, 3>,
    /// `[rows, Hkv, D]` output.
    pub k: StridedMut<'a, u16, 3>,
    /// `[rows, Hkv, D]` output.
    pub v: StridedMut<'a, u16, 3>,
    /// `[rows]` request id per row.
    pub row_req: Strided<'a, u64, 1>,
    /// `[rows]` position per row.
    pub row_pos: Strided<'a, u64, 1>,
    /// Activation key.
    pub key: GenKey,
}

/// Launch geometry for `rows` rows of `heads = Hq + 2·Hkv` heads of `D`
/// elements: [`BLOCK_THREADS`] threads, one thread per
/// [`ELEMS_PER_THREAD`] elements, at most 132 × 16 blocks (grid-stride).
///
/// # Errors
/// [`KernelError::Unsupported`] when the thread count overflows.
pub fn launch_config(rows: usize, heads: usize, head_dim: usize) -> Result<LaunchConfig> {
    let threads = rows
        .checked_mul(heads)
        .and_then(|x| x.checked_mul(head_dim / ELEMS_PER_THREAD))
        .ok_or_else(|| KernelError::unsupported("rows", "thread count overflows"))?;
    let blocks = threads
        .div_ceil(BLOCK_THREADS as usize)
        .clamp(1, MAX_BLOCKS);
    Ok(LaunchConfig {
        grid_dim: (grid_dim("rows", blocks, i32::MAX as u32)?, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Validates `args` and returns the parameters (pointers zero: filled at
/// launch). Every rejection happens here, before any launch.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::Stride`] /
/// [`KernelError::Unsupported`] naming the argument.
pub fn validate(args: &GenArgs<'_>) -> Result<GenParams> {
    let [rows, hq, d] = args.q.shape();
    let [krows, hkv, kd] = args.k.shape();
    if krows != rows || kd != d {
        return Err(KernelError::shape(
            "k",
            format!("[rows={rows}, Hkv, D={d}]"),
            format!("{:?}", args.k.shape()),
        ));
    }
    if args.v.shape() != args.k.shape() {
        return Err(KernelError::shape(
            "v",
            format!("{:?} (as k)", args.k.shape()),
            format!("{:?}", args.v.shape()),
        ));
    }
    if d == 0 || d % ELEMS_PER_THREAD != 0 {
        return Err(KernelError::unsupported(
            "head_dim",
            format!("{d} is not a positive multiple of {ELEMS_PER_THREAD}"),
        ));
    }
    if hq == 0 || hkv == 0 {
        return Err(KernelError::unsupported("heads", "Hq and Hkv must be ≥ 1"));
    }
    args.q.require_contiguous()?;
    args.k.require_contiguous()?;
    args.v.require_contiguous()?;
    args.row_req.require_vector(rows, "rows")?;
    args.row_pos.require_vector(rows, "rows")?;
    Ok(GenParams {
        seed: args.key.seed,
        model: args.key.model as u64,
        layer: args.key.layer as u64,
        salt: args.key.salt,
        rows: to_i64("rows", rows)?,
        num_q_heads: to_i32("num_q_heads", hq)?,
        num_kv_heads: to_i32("num_kv_heads", hkv)?,
        head_dim: to_i32("head_dim", d)?,
        q_head_offset: to_i32("q_head_offset", args.key.q_head_offset)?,
        kv_head_offset: to_i32("kv_head_offset", args.key.kv_head_offset)?,
        ..Default::default()
    })
}

/// The generator launcher: `mha_replay_gen_qkv` resolved once at
/// construction; launches are stream-ordered on the GPU's stream (no host
/// sync, no allocation).
#[derive(Debug)]
pub struct GenKernel {
    kernel: Launcher,
}

impl GenKernel {
    /// Loads `mha_replay_gen_qkv` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, KERNEL_NAMES)?,
        })
    }

    /// Launches issued so far.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// Writes Q, K and V of `args.q.shape()[0]` rows in one launch; zero
    /// rows launch nothing. Asynchronous.
    ///
    /// # Errors
    /// As [`validate`]; [`KernelError::Unsupported`] for an output not
    /// 16-byte aligned; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut GenArgs<'_>) -> Result<()> {
        let mut p = validate(args)?;
        if p.rows == 0 {
            return Ok(());
        }
        let stream = self.kernel.gpu().stream();
        p.q = args.q.device_ptr_mut(stream);
        p.k = args.k.device_ptr_mut(stream);
        p.v = args.v.device_ptr_mut(stream);
        p.row_req = args.row_req.device_ptr(stream);
        p.row_pos = args.row_pos.device_ptr(stream);
        for (name, ptr) in [("q", p.q), ("k", p.k), ("v", p.v)] {
            if ptr % 16 != 0 {
                return Err(KernelError::unsupported(
                    name,
                    "device pointer must be 16-byte aligned",
                ));
            }
        }
        let heads = (p.num_q_heads + 2 * p.num_kv_heads) as usize;
        let cfg = launch_config(p.rows as usize, heads, p.head_dim as usize)?;
        // SAFETY: `validate` checked that q/k/v are contiguous `[rows, H, D]`
        // views inside their buffers and row_req/row_pos hold `rows`
        // elements; the kernel only indexes inside those shapes (rows <
        // p.rows, head < H, d < D) and stores 16 bytes at 16-byte aligned
        // addresses (checked above, D a multiple of 8); the params layout is
        // pinned by a CPU test.
        unsafe { self.kernel.launch(stream, 0, cfg, &p) }?;
        Ok(())
    }
}

/// What one launch writes, computed on the host in the kernel's thread
/// order: `(q, k, v)` bf16 bits for rows `(req, pos)`. The definition is
/// still [`Generator::element`](crate::gen::Generator::element); this only
/// mirrors the kernel's index mapping (tests compare both).
pub fn reference(
    gen: &crate::gen::Generator,
    key: GenKey,
    rows: &[(u64, u64)],
    num_q_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> (Vec<u16>, Vec<u16>, Vec<u16>) {
    use crate::gen::Act;
    let mut q = vec![0u16; rows.len() * num_q_heads * head_dim];
    let mut k = vec![0u16; rows.len() * num_kv_heads * head_dim];
    let mut v = vec![0u16; rows.len() * num_kv_heads * head_dim];
    let slots = num_q_heads + 2 * num_kv_heads;
    let chunks = head_dim / ELEMS_PER_THREAD;
    for t in 0..rows.len() * slots * chunks {
        let c = t % chunks;
        let s = (t / chunks) % slots;
        let row = t / (chunks * slots);
        let (act, head, salt, out, heads, first) = if s < num_q_heads {
            (Act::Q, s, key.salt, &mut q, num_q_heads, key.q_head_offset)
        } else if s < num_q_heads + num_kv_heads {
            (
                Act::K,
                s - num_q_heads,
                0,
                &mut k,
                num_kv_heads,
                key.kv_head_offset,
            )
        } else {
            (
                Act::V,
                s - num_q_heads - num_kv_heads,
                0,
                &mut v,
                num_kv_heads,
                key.kv_head_offset,
            )
        };
        let (req, pos) = rows[row];
        for i in 0..ELEMS_PER_THREAD {
            let d = c * ELEMS_PER_THREAD + i;
            let x = gen.element(
                act,
                key.model,
                key.layer,
                req as usize,
                pos as usize,
                salt,
                first + head,
                d,
            );
            out[(row * heads + head) * head_dim + d] = half::bf16::from_f32(x).to_bits();
        }
    }
    (q, k, v)
}

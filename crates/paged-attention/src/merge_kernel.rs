//! The merge-states kernel: combines `k` partial attention states of the
//! same rows on the device (split KV across launches, decode context
//! parallelism after an all-gather, ring prefill), NaN-safe where a part
//! saw no key, the sinks joined once after the merge. The f64 definition
//! and the sink rule are [`crate::merge`]; the kernel is
//! `kernels/merge_states.cu`.
//!
//! Per (row, head), `M = max_i LSE_i`, `w_i = exp(LSE_i − M)` (0 for a part
//! with `LSE_i = −inf`, whose `O_i` is never read):
//!
//! ```text
//! O   = Σ_i w_i·O_i / Σ_i w_i,     LSE = M + ln Σ_i w_i
//! with sinks σ_h:  LSE' = ln(e^LSE + e^σ_h),  O' = O·e^(LSE − LSE')
//! ```
//!
//! Every part `−inf`: `O = 0`, `LSE = −inf`; a NaN `LSE_i`: the row is NaN.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{to_i32, to_i64, Gpu, KernelError, Result, Strided, StridedMut};

use crate::launch::stride_err;

use crate::HalfDtype;

/// The embedded PTX of the merge-states kernel (`cargo xtask ptx-build`).
pub const MERGE_PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "merge_states",
    ptx: include_str!("../ptx/merge_states.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/merge_states.sm_90.cubin"),
        stamp: include_str!("../ptx/merge_states.sm_90.cubin.stamp"),
    }),
};

/// Threads per CTA (four (row, head) pairs, one warp each).
pub const MERGE_THREADS: u32 = 128;

/// Largest number of parts one launch merges.
pub const MERGE_MAX_PARTS: usize = 4096;

kernel_rt::abi_struct! {
    /// Parameters of the merge-states kernel, defined for C in the generated
    /// `kernels/paged_attention_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct MergeStatesParams {
        /// `const u16*` part 0's `O` `[rows, H, D]`.
        pub o_parts: u64 = "const u16*",
        /// `const f32*` part 0's `LSE` `[rows, H]`.
        pub lse_parts: u64 = "const float*",
        /// `u16*` merged `O` `[rows, H, D]`.
        pub out: u64 = "u16*",
        /// `f32*` merged `LSE` `[rows, H]`, or 0.
        pub lse_out: u64 = "float*",
        /// `const f32*` `[H]` sink logits, or 0.
        pub sinks: u64 = "const float*",
        /// Elements between parts of `O`.
        pub o_part_stride: i64 = "i64",
        /// Elements between rows of a part's `O`.
        pub o_stride_tok: i64 = "i64",
        /// Elements between heads of a part's `O`.
        pub o_stride_head: i64 = "i64",
        /// Elements between parts of `LSE`.
        pub lse_part_stride: i64 = "i64",
        /// Elements between rows of a part's `LSE` (heads contiguous).
        pub lse_stride_tok: i64 = "i64",
        /// Elements between rows of the output.
        pub out_stride_tok: i64 = "i64",
        /// Elements between heads of the output.
        pub out_stride_head: i64 = "i64",
        /// Elements between rows of the merged `LSE` (heads contiguous).
        pub lse_out_stride_tok: i64 = "i64",
        /// Parts `k ≥ 1`.
        pub parts: i32 = "i32",
        /// Rows.
        pub rows: i32 = "i32",
        /// Heads `H`.
        pub num_heads: i32 = "i32",
        /// `D` (even).
        pub head_dim: i32 = "i32",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer fields; the C
// struct is generated from it (`kernels/paged_attention_abi.cuh`, whose
// static_asserts check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for MergeStatesParams {}

/// One merge: `k` partial states of `rows × H` (row, head) pairs.
#[derive(Debug)]
pub struct MergeStatesArgs<'a> {
    /// `[k, rows, H, D]` partial outputs (16-bit bits of `dtype`, already
    /// scaled by `bmm2`); last dim contiguous, every other stride even, base
    /// 4-byte aligned.
    pub o_parts: Strided<'a, u16, 4>,
    /// `[k, rows, H]` f32 natural-log log-sum-exp of each part; last dim
    /// contiguous. `−inf` marks a part that saw no key (its `O` unread).
    pub lse_parts: Strided<'a, f32, 3>,
    /// Dtype of `o_parts` and `out`.
    pub dtype: HalfDtype,
    /// `[rows, H, D]` merged output, same layout rules as `o_parts`.
    pub out: StridedMut<'a, u16, 3>,
    /// `[rows, H]` f32 merged log-sum-exp (after the sinks), last dim
    /// contiguous; `None` = not written.
    pub lse_out: Option<StridedMut<'a, f32, 2>>,
    /// `[H]` f32 sink logits (natural log, never scaled), joined once after
    /// the merge; contiguous.
    pub sinks: Option<Strided<'a, f32, 1>>,
}

/// Checks `args` and builds the kernel params (pointers 0) and the grid.
///
/// # Errors
/// [`KernelError::Shape`] when the shapes disagree; [`KernelError::Stride`]
/// for a non-contiguous last dim or an odd stride; [`KernelError::Unsupported`]
/// for `k = 0`, more than [`MERGE_MAX_PARTS`] parts, an odd `D` or sizes
/// past i32 (strides past i64).
pub fn merge_plan(args: &MergeStatesArgs<'_>) -> Result<(MergeStatesParams, LaunchConfig)> {
    let [k, rows, h, d] = args.o_parts.shape();
    if k == 0 || k > MERGE_MAX_PARTS {
        return Err(KernelError::unsupported(
            "o_parts",
            format!("{k} parts; 1..={MERGE_MAX_PARTS} are merged in one launch"),
        ));
    }
    if d % 2 != 0 {
        return Err(KernelError::unsupported(
            "o_parts",
            format!("head_dim {d} must be even"),
        ));
    }
    let shape_err =
        |arg: &'static str, want: String, got: String| Err(KernelError::shape(arg, want, got));
    if args.lse_parts.shape() != [k, rows, h] {
        return shape_err(
            "lse_parts",
            format!("[{k}, {rows}, {h}] (parts, rows, heads of o_parts)"),
            format!("{:?}", args.lse_parts.shape()),
        );
    }
    if args.out.shape() != [rows, h, d] {
        return shape_err(
            "out",
            format!("[{rows}, {h}, {d}]"),
            format!("{:?}", args.out.shape()),
        );
    }
    if let Some(l) = &args.lse_out {
        if l.shape() != [rows, h] {
            return shape_err(
                "lse_out",
                format!("[{rows}, {h}]"),
                format!("{:?}", l.shape()),
            );
        }
        l.require_last_contiguous()?;
    }
    if let Some(s) = &args.sinks {
        s.require_vector(h, "one sink per head")?;
    }
    args.o_parts.require_last_contiguous()?;
    args.lse_parts.require_last_contiguous()?;
    args.out.require_last_contiguous()?;
    let so = args.o_parts.strides();
    let sout = args.out.strides();
    for (arg, s) in [("o_parts", &so[..3]), ("out", &sout[..2])] {
        if s.iter().any(|x| x % 2 != 0) {
            return Err(stride_err(
                arg,
                format!("strides {s:?} must be even (u32 pairs)"),
            ));
        }
    }
    let sl = args.lse_parts.strides();
    let p = MergeStatesParams {
        o_part_stride: to_i64("o_parts", so[0])?,
        o_stride_tok: to_i64("o_parts", so[1])?,
        o_stride_head: to_i64("o_parts", so[2])?,
        lse_part_stride: to_i64("lse_parts", sl[0])?,
        lse_stride_tok: to_i64("lse_parts", sl[1])?,
        out_stride_tok: to_i64("out", sout[0])?,
        out_stride_head: to_i64("out", sout[1])?,
        lse_out_stride_tok: args
            .lse_out
            .as_ref()
            .map_or(Ok(0), |l| to_i64("lse_out", l.strides()[0]))?,
        parts: to_i32("o_parts", k)?,
        rows: to_i32("o_parts", rows)?,
        num_heads: to_i32("o_parts", h)?,
        head_dim: to_i32("o_parts", d)?,
        ..MergeStatesParams::default()
    };
    let pairs = rows
        .checked_mul(h)
        .ok_or_else(|| KernelError::unsupported("o_parts", "rows × heads overflows"))?;
    let per_cta = (MERGE_THREADS / 32) as usize;
    let blocks = u32::try_from(pairs.div_ceil(per_cta))
        .map_err(|_| KernelError::unsupported("o_parts", format!("{pairs} (row, head) pairs")))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (MERGE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    Ok((p, cfg))
}

/// Entry point of the merge-states kernel for `dtype`.
pub fn merge_entry_name(dtype: HalfDtype) -> String {
    format!("paged_attention_merge_states_{}", dtype.name())
}

/// The merge-states launcher: both entries resolved at construction;
/// launches are stream-ordered and graph-capturable (no host sync,
/// allocation or copy).
#[derive(Debug)]
pub struct MergeStatesKernel {
    /// Entries: 0 = bf16, 1 = f16 ([`merge_entry_name`]).
    kernel: Launcher,
}

impl MergeStatesKernel {
    /// Loads the kernel on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the module does not load; driver errors.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(
                gpu,
                &MERGE_PTX,
                &[
                    &merge_entry_name(HalfDtype::Bf16),
                    &merge_entry_name(HalfDtype::F16),
                ],
            )?,
        })
    }

    /// Kernel launches issued so far.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// Merges `args` on the GPU's own stream (module docs); `rows = 0`
    /// launches nothing. Asynchronous.
    ///
    /// # Errors
    /// As [`merge_plan`]; [`KernelError::Stride`] for a base address that is
    /// not 4-byte aligned; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut MergeStatesArgs<'_>) -> Result<()> {
        self.launch_on(self.kernel.gpu().stream(), args)
    }

    /// [`MergeStatesKernel::launch`] on `stream`.
    ///
    /// # Errors
    /// As [`MergeStatesKernel::launch`]; [`KernelError::Unsupported`] when
    /// the stream belongs to another context.
    pub fn launch_on(&self, stream: &CudaStream, args: &mut MergeStatesArgs<'_>) -> Result<()> {
        self.kernel.gpu().require_stream(stream)?;
        let (mut p, cfg) = merge_plan(args)?;
        if p.rows == 0 || p.num_heads == 0 {
            return Ok(());
        }
        p.o_parts = args.o_parts.device_ptr(stream);
        p.lse_parts = args.lse_parts.device_ptr(stream);
        p.out = args.out.device_ptr_mut(stream);
        if let Some(l) = &mut args.lse_out {
            p.lse_out = l.device_ptr_mut(stream);
        }
        if let Some(s) = &args.sinks {
            p.sinks = s.device_ptr(stream);
        }
        for (arg, ptr) in [("o_parts", p.o_parts), ("out", p.out)] {
            if ptr % 4 != 0 {
                return Err(stride_err(
                    arg,
                    format!("base address {ptr:#x} is not 4-byte aligned"),
                ));
            }
        }
        let entry = match args.dtype {
            HalfDtype::Bf16 => 0,
            HalfDtype::F16 => 1,
        };
        // SAFETY: `merge_plan` checked every shape and stride against the
        // views (their constructors bound every index inside the shape), the
        // alignment is checked above, and the kernel reads and writes only
        // indices inside those shapes; the params layout is pinned by the
        // generated header.
        unsafe { self.kernel.launch(stream, entry, cfg, &p) }?;
        Ok(())
    }
}

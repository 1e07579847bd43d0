//! Kernel launches: [`Launcher`], the part every kernel family's launcher
//! shares, and [`launch_params`], a one-params launch with the attribute
//! `cudarc`'s launch builder does not take: programmatic dependent launch
//! (PDL) on sm_90.
//!
//! PDL (CUDA 11.8+, compute capability 9.0): a kernel launched with the
//! attribute `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` may
//! start while the previous kernel of its stream is still running, once every
//! CTA of that kernel has executed `griddepcontrol.launch_dependents` or
//! exited. The dependent kernel's threads must execute `griddepcontrol.wait`
//! before they read anything the previous kernel writes (or write anything it
//! reads): the wait returns when the previous grid has completed and its
//! memory operations are visible. A kernel that waits before its first global
//! memory access is therefore correct with or without the attribute; what
//! the attribute buys is the launch and the CTAs' set-up overlapping the
//! previous kernel's tail. Stream capture keeps the relation as a
//! programmatic edge of the graph (driver 12.3+).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, CudaStream, DeviceRepr, LaunchConfig};

use crate::{Gpu, PtxModule, Result};

/// Launches `func` on `stream` with one by-value kernel parameter `params`
/// (the params-struct convention of every mha-kit kernel), as a programmatic
/// dependent launch when `pdl` is set (see the module docs), else as a plain
/// `cuLaunchKernelEx` launch, equivalent to `cudarc`'s launch builder with
/// one argument.
///
/// # Safety
/// As `cudarc`'s `LaunchArgs::launch`: `params` must be the kernel's exact
/// parameter layout, every device address in it valid for what the kernel
/// reads and writes, and `config` within the kernel's limits. With `pdl`,
/// the kernel must execute `griddepcontrol.wait` before touching memory that
/// earlier work on the stream writes or reads.
///
/// # Errors
/// [`crate::KernelError::Driver`] when the context cannot be bound or the
/// launch fails.
pub unsafe fn launch_params<T: DeviceRepr>(
    stream: &CudaStream,
    func: &CudaFunction,
    config: LaunchConfig,
    params: &T,
    pdl: bool,
) -> Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: the attribute value is a plain C union; zero is a valid
    // bit pattern for every member, then one int member is set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: config.grid_dim.0,
        gridDimY: config.grid_dim.1,
        gridDimZ: config.grid_dim.2,
        blockDimX: config.block_dim.0,
        blockDimY: config.block_dim.1,
        blockDimZ: config.block_dim.2,
        sharedMemBytes: config.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(pdl),
    };
    let mut args = [std::ptr::from_ref(params).cast_mut().cast::<c_void>()];
    // SAFETY: `cfg` and `args` outlive the call; the caller vouches for the
    // parameter layout and the addresses in it (see # Safety).
    unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            func.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()?;
    }
    Ok(())
}

/// What every kernel family's launcher shares: the GPU handle, the family's
/// entry points (resolved once, at construction, through the GPU's module
/// and function cache, [`Gpu::function`]) and the count of launches issued.
/// A family's launcher keeps only its validation and its plan (params
/// struct, launch configuration, which entry), then calls
/// [`Launcher::launch`].
#[derive(Debug)]
pub struct Launcher {
    gpu: Arc<Gpu>,
    entries: Vec<CudaFunction>,
    launches: AtomicU64,
}

impl Launcher {
    /// Resolves `entries` of `module` on `gpu` (index `i` of `entries` is
    /// entry `i` of [`Launcher::launch`]).
    ///
    /// # Errors
    /// [`crate::KernelError::Load`] when the module or an entry does not load.
    pub fn new(gpu: &Arc<Gpu>, module: &PtxModule, entries: &[&str]) -> Result<Self> {
        Ok(Self {
            gpu: gpu.clone(),
            entries: entries
                .iter()
                .map(|e| gpu.function(module, e))
                .collect::<Result<_>>()?,
            launches: AtomicU64::new(0),
        })
    }

    /// The GPU the entries were loaded on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Kernel launches issued so far through [`Launcher::launch`] (a
    /// launch captured into a CUDA graph counts once, at capture).
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Launches entry `entry` with one by-value params struct on `stream`
    /// (a plain launch, [`launch_params`] without PDL) and counts it.
    ///
    /// # Safety
    /// As [`launch_params`]: `params` is the entry's exact parameter layout,
    /// every device address in it valid for what the kernel reads and
    /// writes (the family's validation shows this), `config` within the
    /// entry's limits.
    ///
    /// # Errors
    /// [`crate::KernelError::Unsupported`] when `stream` belongs to another
    /// context than the GPU's; [`crate::KernelError::Driver`] when the
    /// launch fails.
    ///
    /// # Panics
    /// When `entry` is not an index of the entries given to [`Launcher::new`]
    /// (a bug of the family's launcher, not an input error).
    pub unsafe fn launch<T: DeviceRepr>(
        &self,
        stream: &CudaStream,
        entry: usize,
        config: LaunchConfig,
        params: &T,
    ) -> Result<()> {
        self.gpu.require_stream(stream)?;
        // SAFETY: the caller's contract (# Safety) is launch_params' own.
        unsafe { launch_params(stream, &self.entries[entry], config, params, false) }?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

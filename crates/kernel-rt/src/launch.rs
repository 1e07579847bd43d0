//! Kernel launches with launch attributes that `cudarc`'s launch builder does
//! not take: programmatic dependent launch (PDL) on sm_90.
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

use cudarc::driver::{sys, CudaFunction, CudaStream, DeviceRepr, LaunchConfig};

use crate::Result;

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

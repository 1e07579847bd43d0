//! Kernel launches: [`Launcher`], the part every kernel family's launcher
//! shares (entries loaded once with their attributes, the stream check, the
//! launch, the count), and [`launch_args`], a launch of by-value parameters
//! with the attribute `cudarc`'s launch builder does not take: programmatic
//! dependent launch (PDL) on sm_90.
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

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, CudaStream, DeviceRepr, LaunchConfig};

use crate::{Gpu, PtxModule, Result};

/// A by-value kernel parameter: a params struct or a tensor map, passed to
/// the driver as the address of its bytes ([`DeviceRepr`] types: plain data
/// with the kernel's layout).
pub trait KernelArg {
    /// The address of the parameter's bytes, for `cuLaunchKernelEx`.
    fn arg_ptr(&self) -> *mut c_void;
}

impl<T: DeviceRepr> KernelArg for T {
    fn arg_ptr(&self) -> *mut c_void {
        std::ptr::from_ref(self).cast_mut().cast::<c_void>()
    }
}

/// Most by-value parameters [`launch_args`] passes.
pub const MAX_KERNEL_ARGS: usize = 8;

/// Launches `func` on `stream` with by-value kernel parameters `params`, in
/// the kernel's parameter order (one params struct for every mha-kit
/// kernel; the sm_90a context kernel's struct and four tensor maps), as a
/// programmatic dependent launch when `pdl` is set (see the module docs),
/// else as a plain `cuLaunchKernelEx` launch, equivalent to `cudarc`'s
/// launch builder with those arguments.
///
/// # Safety
/// As `cudarc`'s `LaunchArgs::launch`: `params` must be the kernel's exact
/// parameter layout, every device address in them valid for what the
/// kernel reads and writes, and `config` within the kernel's limits. With
/// `pdl`, the kernel must execute `griddepcontrol.wait` before touching
/// memory that earlier work on the stream writes or reads.
///
/// # Errors
/// [`crate::KernelError::Driver`] when the context cannot be bound or the
/// launch fails; [`crate::KernelError::Unsupported`] for more than
/// [`MAX_KERNEL_ARGS`] parameters.
pub unsafe fn launch_args(
    stream: &CudaStream,
    func: &CudaFunction,
    config: LaunchConfig,
    params: &[&dyn KernelArg],
    pdl: bool,
) -> Result<()> {
    // SAFETY: the caller's contract (# Safety) is launch_clustered's own
    // with clusters of one CTA.
    unsafe { launch_clustered(stream, func, config, params, pdl, 1) }
}

/// [`launch_args`] with the grid's CTAs in thread-block clusters of
/// `cluster_x` × 1 × 1 (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`, sm_90:
/// the CTAs of a cluster run at once on one GPC and may read each other's
/// shared memory); `cluster_x` = 1 is a launch without the attribute.
/// Captured into CUDA graphs like any launch.
///
/// # Safety
/// As [`launch_args`]; `config.grid_dim.0` must be a multiple of
/// `cluster_x`.
///
/// # Errors
/// As [`launch_args`]; [`crate::KernelError::Driver`] when the driver
/// refuses the cluster (more than 8 CTAs, a grid that is not a multiple,
/// a device before sm_90).
pub unsafe fn launch_clustered(
    stream: &CudaStream,
    func: &CudaFunction,
    config: LaunchConfig,
    params: &[&dyn KernelArg],
    pdl: bool,
    cluster_x: u32,
) -> Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: the attribute value is a plain C union; zero is a valid
    // bit pattern for every member, then the member of its id is set.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0usize;
    if pdl {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if cluster_x > 1 {
        attrs[n] = cluster_attr(cluster_x);
        n += 1;
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: config.grid_dim.0,
        gridDimY: config.grid_dim.1,
        gridDimZ: config.grid_dim.2,
        blockDimX: config.block_dim.0,
        blockDimY: config.block_dim.1,
        blockDimZ: config.block_dim.2,
        sharedMemBytes: config.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: n as u32,
    };
    // No allocation per launch: the kernels take one to five parameters.
    let mut args = [std::ptr::null_mut::<c_void>(); MAX_KERNEL_ARGS];
    if params.len() > MAX_KERNEL_ARGS {
        return Err(crate::KernelError::unsupported(
            "params",
            format!(
                "{} kernel parameters (at most {MAX_KERNEL_ARGS})",
                params.len()
            ),
        ));
    }
    for (a, p) in args.iter_mut().zip(params) {
        *a = p.arg_ptr();
    }
    // SAFETY: `cfg`, `args` and the parameters they point to outlive the
    // call (the driver copies the parameter bytes at launch); the caller
    // vouches for the parameter layout and the addresses in it.
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

/// The launch attribute of clusters of `cluster_x` × 1 × 1 CTAs
/// (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`).
fn cluster_attr(cluster_x: u32) -> sys::CUlaunchAttribute {
    // SAFETY: the attribute value is a plain C union; zero is a valid bit
    // pattern for every member, then the cluster dimension is set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster_x;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}

/// How [`Launcher::load`] prepares an entry: its dynamic shared memory
/// limit (bytes; `None` keeps the driver's 48 KiB default) and its
/// preferred shared-memory carveout (percent of the unified L1; `None`
/// keeps the driver's choice).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryAttrs {
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub max_dynamic_smem: Option<usize>,
    /// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`.
    pub carveout_percent: Option<i32>,
}

impl EntryAttrs {
    /// `smem` bytes of dynamic shared memory, the whole carveout for it.
    pub fn smem_max_carveout(smem: usize) -> Self {
        Self {
            max_dynamic_smem: Some(smem),
            carveout_percent: Some(100),
        }
    }

    /// `smem` bytes of dynamic shared memory, the driver's carveout.
    pub fn smem(smem: usize) -> Self {
        Self {
            max_dynamic_smem: Some(smem),
            carveout_percent: None,
        }
    }
}

/// What every kernel family's launcher shares: the GPU handle, the family's
/// entry points (resolved once, through the GPU's module and function cache,
/// [`Gpu::function`], with their launch attributes set) and the count of
/// launches issued. A family's launcher keeps only its validation and its
/// plan (params struct, launch configuration, which entry), then calls
/// [`Launcher::launch`] (or [`Launcher::launch_with`]). Entries are
/// addressed by index: the order given to [`Launcher::new`], or the index
/// [`Launcher::load`] returns ([`Launcher::index`] finds one by name).
#[derive(Debug)]
pub struct Launcher {
    gpu: Arc<Gpu>,
    entries: Vec<CudaFunction>,
    names: HashMap<String, usize>,
    launches: AtomicU64,
}

impl Launcher {
    /// Resolves `entries` of `module` on `gpu` (index `i` of `entries` is
    /// entry `i` of [`Launcher::launch`]), with the driver's default
    /// attributes.
    ///
    /// # Errors
    /// [`crate::KernelError::Load`] when the module or an entry does not load.
    pub fn new(gpu: &Arc<Gpu>, module: &PtxModule, entries: &[&str]) -> Result<Self> {
        let mut l = Self::empty(gpu);
        for e in entries {
            l.load(module, e, EntryAttrs::default())?;
        }
        Ok(l)
    }

    /// A launcher with no entries yet ([`Launcher::load`] adds them).
    pub fn empty(gpu: &Arc<Gpu>) -> Self {
        Self {
            gpu: gpu.clone(),
            entries: Vec::new(),
            names: HashMap::new(),
            launches: AtomicU64::new(0),
        }
    }

    /// Resolves entry `name` of `module`, sets `attrs`, and returns its
    /// index (the existing index when `name` is already loaded; its
    /// attributes are set again).
    ///
    /// # Errors
    /// [`crate::KernelError::Load`] when the module or the entry does not
    /// load; [`crate::KernelError::Driver`] when an attribute is refused.
    pub fn load(&mut self, module: &PtxModule, name: &str, attrs: EntryAttrs) -> Result<usize> {
        let f = self.gpu.function(module, name)?;
        if let Some(smem) = attrs.max_dynamic_smem {
            let smem = i32::try_from(smem).unwrap_or(i32::MAX);
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem,
            )?;
        }
        if let Some(c) = attrs.carveout_percent {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                c,
            )?;
        }
        if let Some(&i) = self.names.get(name) {
            self.entries[i] = f;
            return Ok(i);
        }
        self.entries.push(f);
        self.names.insert(name.to_string(), self.entries.len() - 1);
        Ok(self.entries.len() - 1)
    }

    /// The index of a loaded entry.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.get(name).copied()
    }

    /// Whether entry `name` is loaded.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
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
    /// (a plain launch, [`launch_args`] without PDL) and counts it.
    ///
    /// # Safety
    /// As [`launch_args`]: `params` is the entry's exact parameter layout,
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
        // SAFETY: the caller's contract (# Safety) is launch_with's own.
        unsafe { self.launch_with(stream, entry, config, &[params], false) }
    }

    /// [`Launcher::launch`] with several by-value parameters (in the
    /// kernel's order) and, with `pdl`, as a programmatic dependent launch.
    ///
    /// # Safety
    /// As [`launch_args`]: the parameters are the entry's exact layout,
    /// every device address in them valid; with `pdl`, the entry waits
    /// (`griddepcontrol.wait`) before touching memory earlier work writes.
    ///
    /// # Errors
    /// As [`Launcher::launch`].
    ///
    /// # Panics
    /// As [`Launcher::launch`].
    pub unsafe fn launch_with(
        &self,
        stream: &CudaStream,
        entry: usize,
        config: LaunchConfig,
        params: &[&dyn KernelArg],
        pdl: bool,
    ) -> Result<()> {
        // SAFETY: the caller's contract (# Safety) is launch_clustered's own.
        unsafe { self.launch_clustered(stream, entry, config, params, pdl, 1) }
    }

    /// How many clusters of `cluster_x` CTAs of `block` threads and `smem`
    /// bytes of dynamic shared memory entry `entry` can have on the GPU at
    /// once (`cuOccupancyMaxActiveClusters`; 0 when none fits).
    ///
    /// # Errors
    /// [`crate::KernelError::Driver`] when the driver refuses the query
    /// (a device before sm_90, a cluster larger than the entry allows).
    ///
    /// # Panics
    /// As [`Launcher::launch`].
    pub fn max_active_clusters(
        &self,
        entry: usize,
        block: u32,
        smem: u32,
        cluster_x: u32,
    ) -> Result<usize> {
        self.gpu.context().bind_to_thread()?;
        let mut attr = cluster_attr(cluster_x);
        let cfg = sys::CUlaunchConfig {
            gridDimX: cluster_x,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: std::ptr::null_mut(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `cfg` and `attr` outlive the call; the function handle is
        // a loaded entry of this context.
        unsafe {
            sys::cuOccupancyMaxActiveClusters(&mut n, self.entries[entry].cu_function(), &cfg)
                .result()?;
        }
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// [`Launcher::launch_with`] in thread-block clusters of `cluster_x`
    /// CTAs along x ([`launch_clustered`]).
    ///
    /// # Safety
    /// As [`launch_clustered`].
    ///
    /// # Errors
    /// As [`launch_clustered`]; [`crate::KernelError::Unsupported`] when
    /// `stream` belongs to another context.
    ///
    /// # Panics
    /// As [`Launcher::launch`].
    pub unsafe fn launch_clustered(
        &self,
        stream: &CudaStream,
        entry: usize,
        config: LaunchConfig,
        params: &[&dyn KernelArg],
        pdl: bool,
        cluster_x: u32,
    ) -> Result<()> {
        self.gpu.require_stream(stream)?;
        // SAFETY: the caller's contract (# Safety) is launch_clustered's own.
        unsafe { launch_clustered(stream, &self.entries[entry], config, params, pdl, cluster_x) }?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

//! GPU detection, the context + stream handle and the per-context module cache
//! (embedded cubins on compute capability 9.0, PTX elsewhere).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use crate::{KernelError, Result};

/// Environment variable that picks the device ordinal (default 0).
pub const DEVICE_ENV: &str = "MHA_KIT_DEVICE";

/// Environment variable that picks how [`Gpu`] loads modules
/// ([`ModuleLoad`]): `auto` (default) or `ptx`.
pub const MODULE_LOAD_ENV: &str = "MHA_KIT_MODULE_LOAD";

/// Real GPU architecture of an embedded [`Cubin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CubinArch {
    /// `sm_90`, assembled from `compute_90` PTX.
    Sm90,
    /// `sm_90a`, assembled from `compute_90a` PTX (wgmma, setmaxnreg):
    /// arch-specific code, it runs on compute capability 9.0 only.
    Sm90a,
}

impl CubinArch {
    /// The `ptxas -arch` name: `sm_90` or `sm_90a`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sm90 => "sm_90",
            Self::Sm90a => "sm_90a",
        }
    }

    /// The compute capability (major, minor) the code is built for: 9.0 for
    /// both.
    pub const fn compute_capability(self) -> (i32, i32) {
        (9, 0)
    }

    /// Whether [`Gpu`] loads this code on a device of compute capability
    /// `cc` (major, minor): only on the capability it was built for, so any
    /// other device JIT-compiles the PTX instead.
    pub fn runs_on(self, cc: (i32, i32)) -> bool {
        cc == self.compute_capability()
    }
}

/// Machine code of a [`PtxModule`] for one architecture, assembled by the
/// pinned `ptxas` from the module's PTX (`cargo xtask ptx-build` writes
/// `ptx/<module>.<sm>.cubin` and its `.stamp`; embedded with
/// `include_bytes!` / `include_str!`).
#[derive(Debug, Clone, Copy)]
pub struct Cubin {
    /// The architecture the code is for.
    pub arch: CubinArch,
    /// The cubin (an ELF image), as `ptxas` wrote it.
    pub image: &'static [u8],
    /// The stamp line `ptx-build` wrote beside it: the sha256 of the PTX it
    /// was assembled from and of the image, the `ptxas` version and the
    /// architecture ([`crate::ptxhash::check_cubin`] checks it).
    pub stamp: &'static str,
}

/// A kernel module embedded in a kernel crate: the `include_str!` of its
/// committed `ptx/<family>.ptx`, and optionally the machine code `ptxas`
/// made of it. [`Gpu::function`] loads the cubin on a device it runs on
/// (no JIT compilation) and the PTX otherwise.
#[derive(Debug, Clone, Copy)]
pub struct PtxModule {
    /// Module name, the kernel family (e.g. `page_table`).
    pub name: &'static str,
    /// PTX text, as written by `cargo xtask ptx-build`.
    pub ptx: &'static str,
    /// Machine code for compute capability 9.0, assembled from `ptx`.
    pub cubin: Option<Cubin>,
}

impl PtxModule {
    /// Whether `entry` is declared as a kernel entry point (`.entry`) in the PTX.
    /// Used by CPU tests that pin every launcher's kernel names.
    pub fn has_entry(&self, entry: &str) -> bool {
        self.entries().any(|e| e == entry)
    }

    /// The kernel entry points (`.entry`) declared in the PTX, in file order.
    pub fn entries(&self) -> impl Iterator<Item = &'static str> {
        self.ptx.lines().filter_map(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix(".visible .entry ")
                .or_else(|| line.strip_prefix(".entry "))?;
            let end = rest
                .find(|c: char| c == '(' || c.is_whitespace())
                .unwrap_or(rest.len());
            Some(&rest[..end]).filter(|name| !name.is_empty())
        })
    }
}

/// Where the code of a module loaded by [`Gpu`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleSource {
    /// The embedded cubin for this architecture (no JIT compilation).
    Cubin(CubinArch),
    /// The PTX, JIT-compiled by the driver (or taken from its JIT cache).
    Ptx,
}

/// How [`Gpu`] loads modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModuleLoad {
    /// The embedded cubin when the device's compute capability is the one
    /// it was built for, and the PTX when there is none, it does not match,
    /// or the driver rejects it.
    #[default]
    Auto,
    /// Always the PTX (JIT-compiled by the driver): for measuring start-up
    /// and testing the fallback.
    Ptx,
}

impl ModuleLoad {
    /// The choice named by `MHA_KIT_MODULE_LOAD` (`auto`, `ptx`; unset or
    /// empty: `auto`).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for any other value.
    pub fn from_env() -> Result<Self> {
        match std::env::var(MODULE_LOAD_ENV) {
            Err(_) => Ok(Self::Auto),
            Ok(v) => Self::parse(&v),
        }
    }

    /// Parses a `MHA_KIT_MODULE_LOAD` value: `auto` or empty, `ptx`
    /// (surrounding whitespace ignored).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for any other value.
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim() {
            "" | "auto" => Ok(Self::Auto),
            "ptx" => Ok(Self::Ptx),
            other => Err(KernelError::unsupported(
                MODULE_LOAD_ENV,
                format!("`{other}` is not one of auto, ptx"),
            )),
        }
    }
}

/// Whether a GPU can be used, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuStatus {
    /// libcuda loaded and the driver reports this many devices (> 0).
    Available {
        /// Number of CUDA devices.
        devices: usize,
    },
    /// No usable GPU, with the reason.
    Missing(String),
}

impl GpuStatus {
    /// Devices the driver reports; 0 when no GPU is usable.
    pub fn devices(&self) -> usize {
        match self {
            Self::Available { devices } => *devices,
            Self::Missing(_) => 0,
        }
    }
}

/// Detects a GPU without ever panicking: cudarc panics when libcuda is missing,
/// so its presence is checked first. The answer is computed once per process.
pub fn gpu_status() -> &'static GpuStatus {
    static STATUS: OnceLock<GpuStatus> = OnceLock::new();
    STATUS.get_or_init(|| {
        // SAFETY: only tries to dlopen libcuda by name; no symbol is called.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        if !present {
            return GpuStatus::Missing("libcuda (the NVIDIA driver library) not found".into());
        }
        match std::panic::catch_unwind(CudaContext::device_count) {
            Ok(Ok(n)) if n > 0 => GpuStatus::Available {
                devices: n as usize,
            },
            Ok(Ok(_)) => GpuStatus::Missing("the CUDA driver reports no device".into()),
            Ok(Err(e)) => GpuStatus::Missing(format!("the CUDA driver failed to initialise: {e}")),
            Err(_) => GpuStatus::Missing("the CUDA driver library could not be used".into()),
        }
    })
}

/// `true` when [`gpu_status`] is [`GpuStatus::Available`].
pub fn gpu_available() -> bool {
    matches!(gpu_status(), GpuStatus::Available { .. })
}

/// One device: its primary context, one stream for all work, and the cache of
/// loaded modules and functions.
///
/// Modules load lazily: a kernel family's module on the first
/// [`Gpu::function`] call that names it (launchers do that at construction),
/// from its embedded cubin when the device runs it ([`ModuleLoad::Auto`]),
/// else from its PTX.
///
/// All launches of mha-kit go to [`Gpu::stream`] and are stream-ordered; the
/// context's cross-stream event tracking is switched off so that every launch
/// is a plain kernel node under CUDA-graph capture.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Compute capability (major, minor), `None` when the driver did not say.
    cc: Option<(i32, i32)>,
    module_load: ModuleLoad,
    modules: Mutex<HashMap<&'static str, (Arc<CudaModule>, ModuleSource)>>,
    functions: Mutex<HashMap<(&'static str, String), CudaFunction>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens device `ordinal` and creates a non-blocking stream on it;
    /// modules load as `MHA_KIT_MODULE_LOAD` says ([`ModuleLoad::from_env`]).
    ///
    /// # Errors
    /// [`KernelError::NoGpu`] when no driver or no such device exists;
    /// [`KernelError::Driver`] when the driver fails;
    /// [`KernelError::Unsupported`] for a bad `MHA_KIT_MODULE_LOAD`.
    pub fn new(ordinal: usize) -> Result<Arc<Self>> {
        Self::with_module_load(ordinal, ModuleLoad::from_env()?)
    }

    /// As [`Gpu::new`], with modules loaded as `module_load` says (the
    /// environment is not read).
    ///
    /// # Errors
    /// As [`Gpu::new`].
    pub fn with_module_load(ordinal: usize, module_load: ModuleLoad) -> Result<Arc<Self>> {
        match gpu_status() {
            GpuStatus::Missing(why) => return Err(KernelError::NoGpu(why.clone())),
            GpuStatus::Available { devices } if ordinal >= *devices => {
                return Err(KernelError::NoGpu(format!(
                    "device ordinal {ordinal} requested, the driver reports {devices} device(s)"
                )))
            }
            GpuStatus::Available { .. } => {}
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: mha-kit orders all work on one stream per context; no buffer
        // is shared with another stream, so cross-stream events are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let cc = ctx.compute_capability().ok();
        Ok(Arc::new(Self {
            ctx,
            stream,
            cc,
            module_load,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }))
    }

    /// Opens the device named by `MHA_KIT_DEVICE` (default 0).
    ///
    /// # Errors
    /// As [`Gpu::new`]; [`KernelError::Unsupported`] when the variable is not a number.
    pub fn from_env() -> Result<Arc<Self>> {
        Self::new(env_ordinal()?)
    }

    /// The shared handle of the default device, opened once per process.
    ///
    /// # Errors
    /// As [`Gpu::from_env`]; the error is re-reported on every call.
    pub fn shared() -> Result<Arc<Self>> {
        static SHARED: OnceLock<std::result::Result<Arc<Gpu>, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                env_ordinal()
                    .and_then(Gpu::shared_on)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(KernelError::NoGpu)
    }

    /// The shared handle of device `ordinal`, opened once per process: every
    /// caller on that device (a tensor-parallel rank's backend and the
    /// engine feeding it) gets the same context, stream and module cache,
    /// so their launches are ordered on one stream. [`Gpu::shared`] is this
    /// handle for the default device.
    ///
    /// # Errors
    /// As [`Gpu::new`] (not cached: a later call tries again).
    pub fn shared_on(ordinal: usize) -> Result<Arc<Self>> {
        static HANDLES: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
        let mut handles = lock(HANDLES.get_or_init(Mutex::default));
        if let Some(g) = handles.get(&ordinal) {
            return Ok(Arc::clone(g));
        }
        let g = Gpu::new(ordinal)?;
        handles.insert(ordinal, Arc::clone(&g));
        Ok(g)
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch of this handle goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Device name and compute capability, e.g. `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        let name = self.ctx.name().unwrap_or_else(|_| "unknown device".into());
        match self.ctx.compute_capability() {
            Ok((major, minor)) => format!("{name} (sm_{major}{minor})"),
            Err(_) => name,
        }
    }

    /// The device's compute capability (major, minor), `None` when the
    /// driver did not report it (then no cubin is loaded).
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        self.cc
    }

    /// How this handle loads modules.
    pub fn module_load(&self) -> ModuleLoad {
        self.module_load
    }

    /// Where the module named `name` was loaded from, `None` when it is not
    /// loaded (yet) on this handle.
    pub fn module_source(&self, name: &str) -> Option<ModuleSource> {
        lock(&self.modules).get(name).map(|(_, src)| *src)
    }

    /// Wraps a stream that another library created in this device's
    /// context (e.g. torch's current stream, `torch.cuda.current_stream()
    /// .cuda_stream`), so that launchers can issue work on it with their
    /// `launch_on` methods: the engine's stream order, and its CUDA-graph
    /// capture, then cover mha-kit's kernels. The wrapper never destroys the
    /// stream. The null handle (the legacy default stream) and `2` (the
    /// per-thread default stream) are accepted as they are.
    ///
    /// Other handles are checked with `cuStreamGetCtx`: a stream of another
    /// context (another device, or a non-primary context) is an error, never
    /// a launch into the wrong context. Torch and mha-kit both use the
    /// device's primary context.
    ///
    /// # Safety
    /// `cu_stream` must be a live stream handle (or 0 / 2) and stay alive as
    /// long as the returned wrapper, or work launched through it, is in use.
    /// Ordering between that stream and [`Gpu::stream`] is the caller's: a
    /// buffer written on one and read on the other needs an event or a sync.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] when the stream belongs to another
    /// context; [`KernelError::Driver`] when the driver rejects the handle.
    pub unsafe fn borrowed_stream(&self, cu_stream: u64) -> Result<Arc<CudaStream>> {
        let raw = cu_stream as usize as cudarc::driver::sys::CUstream;
        if cu_stream > 2 {
            self.ctx.bind_to_thread()?;
            let mut owner: cudarc::driver::sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `raw` is a live stream handle (the caller's contract);
            // the driver writes one context handle into `owner`.
            unsafe { cudarc::driver::sys::cuStreamGetCtx(raw, &mut owner) }.result()?;
            if owner != self.ctx.cu_ctx() {
                return Err(KernelError::unsupported(
                    "stream",
                    format!(
                        "stream {cu_stream:#x} belongs to another CUDA context than device {}'s \
                         primary context",
                        self.ctx.ordinal()
                    ),
                ));
            }
        }
        // SAFETY: the handle is live and of this context (checked above, or
        // one of the two default-stream handles valid in every context); the
        // caller keeps it alive and orders it against other streams.
        Ok(unsafe { self.ctx.wrap_borrowed_stream(raw) })
    }

    /// Fails unless `stream` belongs to this handle's context: what every
    /// `launch_on` checks before it launches.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming `stream`.
    pub fn require_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() == self.ctx.cu_ctx() {
            Ok(())
        } else {
            Err(KernelError::unsupported(
                "stream",
                format!(
                    "the stream belongs to device {}, the launcher to device {}",
                    stream.context().ordinal(),
                    self.ctx.ordinal()
                ),
            ))
        }
    }

    /// Whether `stream` is capturing a CUDA graph now (`cuStreamIsCapturing`).
    ///
    /// # Errors
    /// [`KernelError::Driver`] when the driver rejects the stream.
    pub fn is_capturing(&self, stream: &CudaStream) -> Result<bool> {
        let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `stream` wraps a live handle (cudarc's invariant) and the
        // driver writes one status value.
        unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
            .result()?;
        Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Blocks the host until all work on [`Gpu::stream`] is done.
    ///
    /// # Errors
    /// [`KernelError::Driver`] when a kernel faulted.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// Loads (once) and returns kernel `entry` of `module`. Later calls are a
    /// hash lookup; launchers resolve their functions at construction.
    ///
    /// The module loads on the first call that names it: its cubin when
    /// [`ModuleLoad::Auto`] and the device's compute capability is the
    /// cubin's ([`CubinArch::runs_on`]), else its PTX (JIT-compiled by the
    /// driver); a cubin the driver rejects falls back to the PTX.
    /// [`Gpu::module_source`] tells which one loaded.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the module does not load (the PTX failed,
    /// after the cubin when one was tried) or lacks the entry.
    pub fn function(&self, module: &PtxModule, entry: &str) -> Result<CudaFunction> {
        let key = (module.name, entry.to_string());
        if let Some(f) = lock(&self.functions).get(&key) {
            return Ok(f.clone());
        }
        let load_err = |source, cubin| KernelError::Load {
            module: module.name,
            function: entry.to_string(),
            source,
            cubin,
        };
        let m = {
            let mut modules = lock(&self.modules);
            match modules.get(module.name) {
                Some((m, _)) => m.clone(),
                None => {
                    let (m, src) = self
                        .load_module(module)
                        .map_err(|(ptx, cubin)| load_err(ptx, cubin))?;
                    modules.insert(module.name, (m.clone(), src));
                    m
                }
            }
        };
        let f = m.load_function(entry).map_err(|e| load_err(e, None))?;
        lock(&self.functions).insert(key, f.clone());
        Ok(f)
    }

    /// Loads `module`: the cubin when it runs here, else (or when the driver
    /// rejects it) the PTX. The error is the PTX's, with the cubin's when one
    /// was tried.
    fn load_module(
        &self,
        module: &PtxModule,
    ) -> std::result::Result<(Arc<CudaModule>, ModuleSource), (DriverError, Option<DriverError>)>
    {
        let mut cubin_err = None;
        let cubin = module.cubin.filter(|c| {
            self.module_load == ModuleLoad::Auto && self.cc.is_some_and(|cc| c.arch.runs_on(cc))
        });
        if let Some(c) = cubin {
            // cudarc hands the bytes to cuModuleLoadData; the copy is a fresh
            // heap block (16-byte aligned by the system allocator), which the
            // driver reads as an ELF image and no longer needs afterwards.
            match self.ctx.load_module(Ptx::from_binary(c.image.to_vec())) {
                Ok(m) => return Ok((m, ModuleSource::Cubin(c.arch))),
                Err(e) => cubin_err = Some(e),
            }
        }
        self.ctx
            .load_module(Ptx::from_src(module.ptx))
            .map(|m| (m, ModuleSource::Ptx))
            .map_err(|e| (e, cubin_err))
    }
}

/// The device ordinal named by `MHA_KIT_DEVICE` (default 0).
fn env_ordinal() -> Result<usize> {
    match std::env::var(DEVICE_ENV) {
        Ok(v) => v.trim().parse::<usize>().map_err(|_| {
            KernelError::unsupported(DEVICE_ENV, format!("`{v}` is not a device ordinal"))
        }),
        Err(_) => Ok(0),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubins_run_only_on_compute_capability_9_0() {
        for arch in [CubinArch::Sm90, CubinArch::Sm90a] {
            assert!(arch.runs_on((9, 0)));
            for cc in [(8, 0), (8, 9), (10, 0), (12, 0), (9, 1)] {
                assert!(!arch.runs_on(cc), "{arch:?} on {cc:?}");
            }
        }
        assert_eq!(CubinArch::Sm90.name(), "sm_90");
        assert_eq!(CubinArch::Sm90a.name(), "sm_90a");
    }

    #[test]
    fn module_load_values() {
        assert_eq!(ModuleLoad::parse("").unwrap(), ModuleLoad::Auto);
        assert_eq!(ModuleLoad::parse(" auto ").unwrap(), ModuleLoad::Auto);
        assert_eq!(ModuleLoad::parse("ptx").unwrap(), ModuleLoad::Ptx);
        let e = ModuleLoad::parse("cubin").unwrap_err().to_string();
        assert!(e.contains(MODULE_LOAD_ENV) && e.contains("cubin"), "{e}");
    }

    #[test]
    fn entries_lists_kernel_names_in_order() {
        let m = PtxModule {
            name: "t",
            ptx: ".version 8.4\n.visible .entry a_b(\n.param .u64 x\n)\n.func helper()\n.entry c\n(\n",
            cubin: None,
        };
        assert_eq!(m.entries().collect::<Vec<_>>(), ["a_b", "c"]);
        assert!(m.has_entry("a_b") && m.has_entry("c"));
        assert!(!m.has_entry("a") && !m.has_entry("helper"));
    }
}

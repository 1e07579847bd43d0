//! GPU detection, the context + stream handle and the per-context PTX module cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::{KernelError, Result};

/// Environment variable that picks the device ordinal (default 0).
pub const DEVICE_ENV: &str = "MHA_KIT_DEVICE";

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
/// made of it.
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
/// All launches of mha-kit go to [`Gpu::stream`] and are stream-ordered; the
/// context's cross-stream event tracking is switched off so that every launch
/// is a plain kernel node under CUDA-graph capture.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
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
    /// Opens device `ordinal` and creates a non-blocking stream on it.
    ///
    /// # Errors
    /// [`KernelError::NoGpu`] when no driver or no such device exists;
    /// [`KernelError::Driver`] when the driver fails.
    pub fn new(ordinal: usize) -> Result<Arc<Self>> {
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
        Ok(Arc::new(Self {
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }))
    }

    /// Opens the device named by `MHA_KIT_DEVICE` (default 0).
    ///
    /// # Errors
    /// As [`Gpu::new`]; [`KernelError::Unsupported`] when the variable is not a number.
    pub fn from_env() -> Result<Arc<Self>> {
        let ordinal = match std::env::var(DEVICE_ENV) {
            Ok(v) => v.trim().parse::<usize>().map_err(|_| {
                KernelError::unsupported(DEVICE_ENV, format!("`{v}` is not a device ordinal"))
            })?,
            Err(_) => 0,
        };
        Self::new(ordinal)
    }

    /// The shared handle of the default device, opened once per process.
    ///
    /// # Errors
    /// As [`Gpu::from_env`]; the error is re-reported on every call.
    pub fn shared() -> Result<Arc<Self>> {
        static SHARED: OnceLock<std::result::Result<Arc<Gpu>, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Gpu::from_env().map_err(|e| e.to_string()))
            .clone()
            .map_err(KernelError::NoGpu)
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
    /// # Errors
    /// [`KernelError::Load`] when the module does not load or lacks the entry.
    pub fn function(&self, module: &PtxModule, entry: &str) -> Result<CudaFunction> {
        let key = (module.name, entry.to_string());
        if let Some(f) = lock(&self.functions).get(&key) {
            return Ok(f.clone());
        }
        let load_err = |source| KernelError::Load {
            module: module.name,
            function: entry.to_string(),
            source,
        };
        let m = {
            let mut modules = lock(&self.modules);
            match modules.get(module.name) {
                Some(m) => m.clone(),
                None => {
                    let m = self
                        .ctx
                        .load_module(Ptx::from_src(module.ptx))
                        .map_err(load_err)?;
                    modules.insert(module.name, m.clone());
                    m
                }
            }
        };
        let f = m.load_function(entry).map_err(load_err)?;
        lock(&self.functions).insert(key, f.clone());
        Ok(f)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

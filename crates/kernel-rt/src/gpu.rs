//! GPU detection, the context + stream handle and the per-context PTX module cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::{KernelError, Result};

/// Environment variable that picks the device ordinal (default 0).
pub const DEVICE_ENV: &str = "MHA_KIT_DEVICE";

/// A PTX module embedded in a kernel crate (`include_str!` of its committed
/// `ptx/<family>.ptx`).
#[derive(Debug, Clone, Copy)]
pub struct PtxModule {
    /// Module name, the kernel family (e.g. `page_table`).
    pub name: &'static str,
    /// PTX text, as written by `cargo xtask ptx-build`.
    pub ptx: &'static str,
}

impl PtxModule {
    /// Whether `entry` is declared as a kernel entry point (`.entry`) in the PTX.
    /// Used by CPU tests that pin every launcher's kernel names.
    pub fn has_entry(&self, entry: &str) -> bool {
        self.ptx.lines().any(|line| {
            let line = line.trim_start();
            line.strip_prefix(".visible .entry ")
                .or_else(|| line.strip_prefix(".entry "))
                .is_some_and(|rest| {
                    rest.strip_prefix(entry)
                        .is_some_and(|tail| tail.starts_with('(') || tail.trim().is_empty())
                })
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

//! The one error type of mha-kit's kernel crates.

use cudarc::driver::DriverError;

/// Every failure a launcher or a runtime call can report.
///
/// Bad input is reported before any launch; a launcher never panics on user
/// input and never launches on arguments it rejected.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No usable GPU: libcuda is missing, the driver reports no device, or the
    /// requested ordinal does not exist.
    #[error("no GPU available: {0}")]
    NoGpu(String),

    /// A tensor argument has the wrong shape.
    #[error("shape mismatch for `{arg}`: expected {expected}, got {actual}")]
    Shape {
        /// Argument name, as in the launcher's docs.
        arg: &'static str,
        /// What was expected, e.g. `[bs=4]`.
        expected: String,
        /// What was given.
        actual: String,
    },

    /// A tensor argument has the wrong element type.
    #[error("dtype mismatch for `{arg}`: expected {expected}, got {actual}")]
    Dtype {
        /// Argument name.
        arg: &'static str,
        /// Expected dtype, e.g. `i32`.
        expected: &'static str,
        /// Given dtype.
        actual: &'static str,
    },

    /// A strided view's strides are not valid for its use (e.g. last dim not
    /// contiguous, or a stride that would make rows overlap).
    #[error("invalid strides for `{arg}`: {detail}")]
    Stride {
        /// Argument name.
        arg: &'static str,
        /// What is wrong.
        detail: String,
    },

    /// A buffer is too small for the view or the work asked of it.
    #[error("capacity too small for `{arg}`: need {needed} elements, buffer holds {available}")]
    Capacity {
        /// Argument name.
        arg: &'static str,
        /// Elements needed.
        needed: usize,
        /// Elements available.
        available: usize,
    },

    /// A scalar argument has a value the kernel does not support.
    #[error("unsupported value for `{arg}`: {detail}")]
    Unsupported {
        /// Argument name.
        arg: &'static str,
        /// Why the value is rejected.
        detail: String,
    },

    /// A kernel module or one of its entry points could not be loaded: the
    /// PTX (the fallback) failed, after the embedded cubin when one was tried.
    #[error("cannot load kernel `{function}` from module `{module}`: {source}{}", cubin_note(.cubin))]
    Load {
        /// Module name.
        module: &'static str,
        /// Entry point name.
        function: String,
        /// Driver error of the PTX load, or of the entry lookup.
        source: DriverError,
        /// Driver error of the cubin load, when a cubin was tried first.
        cubin: Option<DriverError>,
    },

    /// Any other CUDA driver failure.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),

    /// A collective-communication failure (NCCL: the library is missing,
    /// a communicator could not be created, or a collective failed).
    #[error("collective communication (NCCL): {0}")]
    Collective(String),
}

impl KernelError {
    /// Shorthand for [`KernelError::Shape`].
    pub fn shape(
        arg: &'static str,
        expected: impl Into<String>,
        actual: impl Into<String>,
    ) -> Self {
        Self::Shape {
            arg,
            expected: expected.into(),
            actual: actual.into(),
        }
    }

    /// Shorthand for [`KernelError::Unsupported`].
    pub fn unsupported(arg: &'static str, detail: impl Into<String>) -> Self {
        Self::Unsupported {
            arg,
            detail: detail.into(),
        }
    }
}

fn cubin_note(cubin: &Option<DriverError>) -> String {
    match cubin {
        Some(e) => format!(" (the cubin failed first: {e})"),
        None => String::new(),
    }
}

/// Result alias used by every launcher.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

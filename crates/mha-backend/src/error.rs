//! The backend's one error type (DESIGN.md D15: every unsupported value is
//! a typed error before any work is done).

use kernel_rt::KernelError;
use swa_pool::SwaError;

/// Errors of `mha-backend`. Every fallible operation checks its whole input
/// first: on error nothing (pools, caches, current metadata) has changed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A configuration value that cannot describe a model / pool.
    #[error("invalid backend configuration: `{field}`: {detail}")]
    Config {
        /// The offending field (as named in [`crate::BackendConfig`]).
        field: &'static str,
        /// Why it is rejected.
        detail: String,
    },
    /// Speculative `topk > 1` (EAGLE draft trees): only linear draft chains
    /// are supported (DESIGN.md D14, SEMANTICS.md §backend.9).
    #[error("speculative topk = {0} is not supported: only topk <= 1 (linear draft chains) is (DESIGN.md D14)")]
    TopkUnsupported(usize),
    /// A device string that is not `auto`, `cpu` or `cuda:N`.
    #[error("invalid device `{0}`: expected auto, cpu or cuda:N")]
    InvalidDevice(String),
    /// A forward batch whose fields are inconsistent or unsupported.
    #[error("invalid forward batch: `{field}`: {detail}")]
    Batch {
        /// The offending [`crate::ForwardBatch`] field.
        field: &'static str,
        /// Why it is rejected.
        detail: String,
    },
    /// Not enough free KV pages: nothing was allocated (never an overwrite).
    #[error("{pool} KV pool exhausted: {needed} page(s) needed, {free} free")]
    Exhausted {
        /// `"full"` or `"swa"`.
        pool: &'static str,
        /// Pages the call needed.
        needed: usize,
        /// Pages free.
        free: usize,
    },
    /// Every request row of the request-to-token pool is in use.
    #[error("request-to-token pool exhausted: all {rows} request rows are in use")]
    NoFreeRequestRow {
        /// Usable rows (row 0 is reserved).
        rows: usize,
    },
    /// A request row that is not allocated (or is the reserved row 0).
    #[error("request row {0} is not an allocated request")]
    UnknownRequest(usize),
    /// A request would grow past the context length.
    #[error("request row {req} would hold {len} tokens, more than context_len = {context_len}")]
    ContextOverflow {
        /// Request row.
        req: usize,
        /// Tokens it would hold.
        len: usize,
        /// The configured context length.
        context_len: usize,
    },
    /// A layer id outside the configured layers.
    #[error("layer {layer} out of range: the backend has {num_layers} layer(s)")]
    UnknownLayer {
        /// The layer asked for.
        layer: usize,
        /// Configured layers.
        num_layers: usize,
    },
    /// `forward` without matching forward metadata (call
    /// `init_forward_metadata` with the same batch first).
    #[error("no forward metadata for this batch: {0}")]
    Metadata(String),
    /// A CUDA-graph operation that cannot run: graphs on the CPU executor,
    /// no graph state, a mode without graph metadata (EXTEND, MIXED, …,
    /// SEMANTICS.md §backend.9), no captured bucket for a batch, or a bucket shape
    /// that does not fit. Never a silent fallback to eager.
    #[error("CUDA graph: {0}")]
    GraphUnsupported(String),
    /// A kernel-level validation or driver error.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// An error of the hybrid SWA pool.
    #[error(transparent)]
    Swa(#[from] SwaError),
}

/// Result alias of this crate.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

pub(crate) fn config_err(field: &'static str, detail: impl Into<String>) -> BackendError {
    BackendError::Config {
        field,
        detail: detail.into(),
    }
}

pub(crate) fn batch_err(field: &'static str, detail: impl Into<String>) -> BackendError {
    BackendError::Batch {
        field,
        detail: detail.into(),
    }
}

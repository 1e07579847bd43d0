//! The replay's one error type: every failure names what to fix (a file and
//! line, a flag) and never panics.

use mha_backend::BackendError;

/// Errors of `mha-replay`.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Malformed trace input, at `file:line`.
    #[error("{file}:{line}: {detail}")]
    Trace {
        /// The trace file (or the embedded trace's name).
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// The trace file cannot be read.
    #[error("cannot read trace file {file}: {detail}")]
    TraceIo {
        /// The path given to `--trace`.
        file: String,
        /// The OS error.
        detail: String,
    },
    /// An impossible configuration, naming the command-line flag.
    #[error("invalid {flag}: {detail}")]
    Flag {
        /// The flag, e.g. `--page-size`.
        flag: &'static str,
        /// Why it is rejected.
        detail: String,
    },
    /// The backend rejected a call.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// An output file (`--json`, `--plot`) cannot be written.
    #[error("cannot write {what} to {path}: {detail}")]
    Output {
        /// `JSON report` or `plot`.
        what: &'static str,
        /// The path.
        path: String,
        /// The cause.
        detail: String,
    },
    /// A broken internal invariant of the replay (a bug, reported, not a panic).
    #[error("internal replay error: {0}")]
    Internal(String),
}

/// Result alias of this crate.
pub type Result<T, E = ReplayError> = std::result::Result<T, E>;

/// A [`ReplayError::Flag`].
pub fn flag_err(flag: &'static str, detail: impl Into<String>) -> ReplayError {
    ReplayError::Flag {
        flag,
        detail: detail.into(),
    }
}

//! Errors of the package: every rejection names the public argument, with
//! its shape, strides and dtype when it is a tensor; device failures are
//! kept apart. Converted to Python exceptions in `lib.rs`
//! (`mha_kit.InvalidArgument`, a `ValueError`; `mha_kit.DeviceError`, a
//! `RuntimeError`).

use kernel_rt::KernelError;

use crate::desc::Tensor;

/// Bad input: the argument, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    /// Public argument name (`query`, `block_tables`, …).
    pub arg: String,
    /// What is wrong, with the tensor's description when it is one.
    pub detail: String,
}

impl ArgError {
    /// An error about argument `arg`.
    pub fn new(arg: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            arg: arg.into(),
            detail: detail.into(),
        }
    }

    /// An error about tensor `t` (its shape, strides, dtype and device are
    /// part of the message).
    pub fn about(t: &Tensor, detail: impl Into<String>) -> Self {
        Self {
            arg: t.arg.to_string(),
            detail: format!("{} ({t})", detail.into()),
        }
    }
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "argument `{}`: {}", self.arg, self.detail)
    }
}

impl std::error::Error for ArgError {}

/// Every failure of a call.
#[derive(Debug)]
pub enum CallError {
    /// Bad input (raised as `mha_kit.InvalidArgument`, a `ValueError`).
    Arg(ArgError),
    /// No GPU, a module that does not load, a driver failure (raised as
    /// `mha_kit.DeviceError`, a `RuntimeError`).
    Device(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Arg(e) => e.fmt(f),
            Self::Device(s) => f.write_str(s),
        }
    }
}

impl From<ArgError> for CallError {
    fn from(e: ArgError) -> Self {
        Self::Arg(e)
    }
}

/// Result of a call.
pub type CallResult<T> = Result<T, CallError>;

/// A launcher's [`KernelError`], with the launcher's argument names turned
/// into the public ones (`names`: `(launcher, public)` pairs) and the
/// matching tensor's description appended.
pub fn from_kernel(e: KernelError, names: &[(&str, &str)], tensors: &[&Tensor]) -> CallError {
    let arg = match &e {
        KernelError::Shape { arg, .. }
        | KernelError::Dtype { arg, .. }
        | KernelError::Stride { arg, .. }
        | KernelError::Capacity { arg, .. }
        | KernelError::Unsupported { arg, .. } => *arg,
        KernelError::NoGpu(_)
        | KernelError::Load { .. }
        | KernelError::Driver(_)
        | KernelError::Collective(_) => return CallError::Device(e.to_string()),
    };
    let public = names
        .iter()
        .find(|(l, _)| *l == arg)
        .map_or(arg, |(_, p)| *p);
    match tensors.iter().find(|t| t.arg == public) {
        Some(t) => CallError::Arg(ArgError::about(t, e.to_string())),
        None => CallError::Arg(ArgError::new(public, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desc::Tensor;

    #[test]
    fn kernel_errors_get_public_names_and_shapes() {
        let q = Tensor::from_raw(
            "query",
            (0, "bf16".into(), vec![3, 8, 100], vec![800, 100, 1], 0),
        )
        .unwrap();
        let e = from_kernel(
            KernelError::unsupported("q", "head_dim 100"),
            &[("q", "query")],
            &[&q],
        );
        let s = e.to_string();
        assert!(
            s.starts_with("argument `query`")
                && s.contains("[3, 8, 100]")
                && s.contains("bfloat16"),
            "{s}"
        );
        let d = from_kernel(KernelError::NoGpu("none".into()), &[], &[]);
        assert!(matches!(d, CallError::Device(_)));
    }
}

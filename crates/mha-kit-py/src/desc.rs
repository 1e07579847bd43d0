//! Tensor descriptions as the Python layer hands them over, and the checks
//! every function shares (dtype, rank, device, contiguity).
//!
//! Python describes each tensor (torch tensor or numpy array) as a tuple
//! `(data_ptr, dtype, shape, strides, device)`: the address of element
//! `[0, …, 0]`, a dtype name (`bf16`, `f16`, `f32`, `i32`, `i64`, `u8`,
//! `e4m3`), the extents, the strides **in elements** and the device (`-1`
//! host memory, `n ≥ 0` CUDA device `n`). Nothing is copied: the GPU path
//! wraps the address as a [`kernel_rt::ExternalBuffer`], the CPU path reads
//! and writes the host memory in place.
//!
//! The dtype travels as its code ([`Dtype::from_code`], a small int, what the Python
//! layer sends: no string conversion per call) or, equally accepted, its
//! name; the description arrives as a [`Desc`], read straight out of the
//! tuples (one type check per tuple, items by index) rather than through
//! PyO3's generic sequence conversion. A tensor object in place of a tuple
//! is read through the DLPack exchange API ([`crate::exchange`]).

use pyo3::types::{PyAnyMethods, PyTuple, PyTupleMethods};
use pyo3::{Borrowed, FromPyObject, PyAny, PyErr};

use crate::error::ArgError;

/// Element type of a described tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
    /// IEEE binary32.
    F32,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Unsigned byte (a KV cache of raw e4m3 bytes, as SGLang stores it).
    U8,
    /// `float8_e4m3fn`.
    E4m3,
}

impl Dtype {
    /// Parses the Python layer's dtype name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "bf16" => Self::Bf16,
            "f16" => Self::F16,
            "f32" => Self::F32,
            "i32" => Self::I32,
            "i64" => Self::I64,
            "u8" => Self::U8,
            "e4m3" => Self::E4m3,
            _ => return None,
        })
    }

    /// The dtype of code `c` (the Python layer's `_tensor.CODES` order).
    pub fn from_code(c: u64) -> Option<Self> {
        Some(match c {
            0 => Self::Bf16,
            1 => Self::F16,
            2 => Self::F32,
            3 => Self::I32,
            4 => Self::I64,
            5 => Self::U8,
            6 => Self::E4m3,
            _ => return None,
        })
    }

    /// The code of [`Self::from_code`].
    pub fn code(self) -> u64 {
        match self {
            Self::Bf16 => 0,
            Self::F16 => 1,
            Self::F32 => 2,
            Self::I32 => 3,
            Self::I64 => 4,
            Self::U8 => 5,
            Self::E4m3 => 6,
        }
    }

    /// The torch name (what error messages say).
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::E4m3 => "float8_e4m3fn",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Bf16 | Self::F16 => 2,
            Self::F32 | Self::I32 => 4,
            Self::I64 => 8,
            Self::U8 | Self::E4m3 => 1,
        }
    }
}

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Host memory (the CPU path).
    Cpu,
    /// CUDA device ordinal.
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A description with the dtype by name (the Rust tests' form; Python sends
/// dtype codes, [`Dtype::from_code`], which [`Desc`] reads as well).
pub type RawTensor = (u64, String, Vec<usize>, Vec<i64>, i64);

/// A description as PyO3 hands it over: [`RawTensor`]'s fields, the dtype
/// already resolved (`Err` keeps an unknown code or name for the message);
/// [`Tensor::from_desc`] checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desc {
    /// Address of element `[0, …, 0]`.
    pub ptr: u64,
    /// The dtype, or what was sent instead.
    pub dtype: Result<Dtype, String>,
    /// Extents.
    pub shape: Vec<usize>,
    /// Strides in elements, as sent.
    pub strides: Vec<i64>,
    /// `-1` host, `n ≥ 0` CUDA device `n`.
    pub device: i64,
}

impl From<RawTensor> for Desc {
    fn from((ptr, dtype, shape, strides, device): RawTensor) -> Self {
        Self {
            ptr,
            dtype: Dtype::parse(&dtype).ok_or(dtype),
            shape,
            strides,
            device,
        }
    }
}

fn ints<'py, T: for<'a> FromPyObject<'a, 'py, Error = PyErr>>(
    t: &pyo3::Bound<'py, PyAny>,
) -> Result<Vec<T>, PyErr> {
    match t.cast::<PyTuple>() {
        // A tuple (torch.Size is one): items by index.
        Ok(t) => t.iter_borrowed().map(|x| x.extract::<T>()).collect(),
        Err(_) => t.extract(),
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Desc {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self, PyErr> {
        let Ok(t) = obj.cast::<PyTuple>() else {
            // A tensor object itself: the DLPack exchange fast path.
            return crate::exchange::desc(obj);
        };
        if t.len() != 5 {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "a tensor description has 5 items (data_ptr, dtype, shape, strides, device), \
                 got {}",
                t.len()
            )));
        }
        let dt = t.get_borrowed_item(1)?;
        let dtype = match dt.extract::<u64>() {
            Ok(c) => Dtype::from_code(c).ok_or_else(|| c.to_string()),
            Err(_) => {
                let name: String = dt.extract()?;
                Dtype::parse(&name).ok_or(name)
            }
        };
        Ok(Self {
            ptr: t.get_borrowed_item(0)?.extract()?,
            dtype,
            shape: ints(&t.get_item(2)?)?,
            strides: ints(&t.get_item(3)?)?,
            device: t.get_borrowed_item(4)?.extract()?,
        })
    }
}

/// A described tensor: address, dtype, shape and element strides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// The argument name of the public function (for error messages).
    pub arg: &'static str,
    /// Address of element `[0, …, 0]`.
    pub ptr: u64,
    /// Element type.
    pub dtype: Dtype,
    /// Extents.
    pub shape: Vec<usize>,
    /// Strides in elements (never negative).
    pub strides: Vec<usize>,
    /// Where it lives.
    pub device: Device,
}

impl std::fmt::Display for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}`: shape {:?}, strides {:?}, dtype {}, device {}",
            self.arg,
            self.shape,
            self.strides,
            self.dtype.name(),
            self.device
        )
    }
}

impl Tensor {
    /// Parses a raw description.
    ///
    /// # Errors
    /// [`ArgError`] for an unknown dtype, a rank mismatch of shape and
    /// strides, or a negative stride.
    pub fn from_raw(arg: &'static str, raw: RawTensor) -> Result<Self, ArgError> {
        Self::from_desc(arg, raw.into())
    }

    /// Checks a description ([`Tensor::from_raw`]'s rules).
    ///
    /// # Errors
    /// As [`Tensor::from_raw`].
    pub fn from_desc(arg: &'static str, d: Desc) -> Result<Self, ArgError> {
        let Desc {
            ptr,
            dtype,
            shape,
            strides,
            device,
        } = d;
        let dt = dtype.map_err(|d| ArgError::new(arg, format!("unsupported dtype `{d}`")))?;
        if shape.len() != strides.len() {
            return Err(ArgError::new(
                arg,
                format!("shape {shape:?} and strides {strides:?} differ in rank"),
            ));
        }
        let strides = strides
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ArgError::new(arg, format!("negative strides {strides:?}")))?;
        let device = usize::try_from(device).map_or(Device::Cpu, Device::Cuda);
        Ok(Self {
            arg,
            ptr,
            dtype: dt,
            shape,
            strides,
            device,
        })
    }

    /// Parses an optional raw description.
    ///
    /// # Errors
    /// As [`Tensor::from_raw`].
    pub fn opt(arg: &'static str, raw: Option<Desc>) -> Result<Option<Self>, ArgError> {
        raw.map(|r| Self::from_desc(arg, r)).transpose()
    }

    /// Elements (product of the shape).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements the view spans from its first element (0 when empty).
    ///
    /// # Errors
    /// [`ArgError`] on overflow.
    pub fn span(&self) -> Result<usize, ArgError> {
        kernel_rt::span_elems(&self.shape, &self.strides)
            .ok_or_else(|| self.err("shape and strides overflow the address space"))
    }

    /// An error about this tensor (its shape, strides and dtype appended).
    pub fn err(&self, detail: impl Into<String>) -> ArgError {
        ArgError::about(self, detail)
    }

    /// Fails unless the dtype is one of `allowed`.
    ///
    /// # Errors
    /// [`ArgError`] naming the tensor and the allowed dtypes.
    pub fn require_dtype(&self, allowed: &[Dtype]) -> Result<(), ArgError> {
        if allowed.contains(&self.dtype) {
            return Ok(());
        }
        let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
        Err(self.err(format!("dtype must be {}", names.join(" or "))))
    }

    /// Fails unless the rank is `n`.
    ///
    /// # Errors
    /// [`ArgError`] naming the tensor and the expected layout.
    pub fn require_rank(&self, n: usize, layout: &str) -> Result<(), ArgError> {
        if self.shape.len() == n {
            Ok(())
        } else {
            Err(self.err(format!("expected {n} dims {layout}")))
        }
    }

    /// Fails unless the shape is exactly `want` (`what` spells it out).
    ///
    /// # Errors
    /// [`ArgError`].
    pub fn require_shape(&self, want: &[usize], what: &str) -> Result<(), ArgError> {
        if self.shape == want {
            Ok(())
        } else {
            Err(self.err(format!("expected shape {what} = {want:?}")))
        }
    }

    /// Fails unless the last dim is contiguous (any stride for extent ≤ 1;
    /// an empty tensor passes).
    ///
    /// # Errors
    /// [`ArgError`].
    pub fn require_last_contiguous(&self) -> Result<(), ArgError> {
        if self.numel() == 0 {
            return Ok(());
        }
        match (self.shape.last(), self.strides.last()) {
            (Some(&n), Some(&s)) if n > 1 && s != 1 => {
                Err(self.err("the last dim must be contiguous (stride 1)"))
            }
            _ => Ok(()),
        }
    }

    /// Fails unless the tensor is row-major contiguous (dims of extent ≤ 1
    /// may carry any stride; an empty tensor passes).
    ///
    /// # Errors
    /// [`ArgError`].
    pub fn require_contiguous(&self) -> Result<(), ArgError> {
        if self.numel() == 0 {
            return Ok(());
        }
        let mut want = 1usize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n > 1 && s != want {
                return Err(self.err("must be contiguous"));
            }
            want = want.saturating_mul(n);
        }
        Ok(())
    }

    /// The same memory seen with dims permuted (`perm[i]` = source dim of dim `i`).
    pub fn permuted(&self, perm: &[usize]) -> Self {
        Self {
            shape: perm.iter().map(|&i| self.shape[i]).collect(),
            strides: perm.iter().map(|&i| self.strides[i]).collect(),
            ..self.clone()
        }
    }

    /// The shape as a fixed-size array (after [`Tensor::require_rank`]).
    pub fn dims<const N: usize>(&self) -> [usize; N] {
        let mut a = [0usize; N];
        a.copy_from_slice(&self.shape[..N]);
        a
    }

    /// The strides as a fixed-size array (after [`Tensor::require_rank`]).
    pub fn stride_dims<const N: usize>(&self) -> [usize; N] {
        let mut a = [0usize; N];
        a.copy_from_slice(&self.strides[..N]);
        a
    }
}

/// The device all `tensors` live on.
///
/// # Errors
/// [`ArgError`] naming the first tensor on another device.
pub fn common_device(tensors: &[&Tensor]) -> Result<Device, ArgError> {
    let first = tensors
        .first()
        .ok_or_else(|| ArgError::new("tensors", "no tensor given"))?;
    for t in tensors {
        if t.device != first.device {
            return Err(t.err(format!(
                "is on {}, `{}` on {}: every tensor must be on one device",
                t.device, first.arg, first.device
            )));
        }
    }
    Ok(first.device)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: Vec<usize>, strides: Vec<i64>) -> Tensor {
        Tensor::from_raw("x", (0, "f16".into(), shape, strides, -1)).unwrap()
    }

    #[test]
    fn parses_and_rejects() {
        assert!(Tensor::from_raw("x", (0, "f64".into(), vec![1], vec![1], -1)).is_err());
        assert!(Tensor::from_raw("x", (0, "f16".into(), vec![1, 2], vec![1], -1)).is_err());
        let e = Tensor::from_raw("x", (0, "f16".into(), vec![2], vec![-1], -1)).unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
        let c = Tensor::from_raw("x", (0, "i32".into(), vec![2], vec![1], 3)).unwrap();
        assert_eq!(c.device, Device::Cuda(3));
        for code in 0..7 {
            let d = Dtype::from_code(code).unwrap();
            assert_eq!(Dtype::parse(&format!("{d:?}").to_lowercase()), Some(d));
        }
        assert_eq!(Dtype::from_code(7), None);
    }

    #[test]
    fn contiguity_and_permutation() {
        assert!(t(vec![2, 3], vec![3, 1]).require_contiguous().is_ok());
        assert!(t(vec![2, 3], vec![4, 1]).require_contiguous().is_err());
        assert!(t(vec![1, 3], vec![99, 1]).require_contiguous().is_ok());
        assert!(t(vec![2, 3], vec![4, 2]).require_last_contiguous().is_err());
        let nhd = t(vec![5, 16, 2, 64], vec![2048, 128, 64, 1]);
        let hnd = nhd.permuted(&[0, 2, 1, 3]);
        assert_eq!(hnd.shape, vec![5, 2, 16, 64]);
        assert_eq!(hnd.strides, vec![2048, 64, 128, 1]);
        assert_eq!(hnd.span().unwrap(), 5 * 2048);
    }

    #[test]
    fn errors_name_the_tensor_shape_and_dtype() {
        let e = t(vec![2, 3], vec![3, 1])
            .require_dtype(&[Dtype::Bf16])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`x`") && e.contains("[2, 3]") && e.contains("float16"),
            "{e}"
        );
    }
}

//! Tensors read through the DLPack C exchange API (DLPack ≥ 1.2): a
//! framework publishes, on its tensor class, a table of C functions; one
//! of them fills a `DLTensor` (data, device, dtype, shape, strides) from a
//! Python tensor object without any Python-level call, and another returns
//! the framework's current stream of a device. torch (≥ 2.10) publishes it
//! as `torch.Tensor.__dlpack_c_exchange_api__`, a capsule named
//! `dlpack_exchange_api` (earlier builds and tvm-ffi's add-on: an `int`
//! address in `__c_dlpack_exchange_api__`).
//!
//! Why (issue 15): a decode call describes seven tensors; each Python-side
//! description reads six attributes through the interpreter (about 1 µs a
//! tensor with torch), while the C function takes tens of nanoseconds. The
//! Python layer registers the table once ([`register`]); [`crate::desc::Desc`]
//! then accepts an exact instance of the registered class wherever it takes
//! a description tuple ([`desc`]). Subclasses (FakeTensor, FunctionalTensor), numpy
//! arrays and any tensor the C function refuses are reported as
//! [`NotExchangeable`] and described by the Python layer instead, so the
//! fast path changes no result and no error message's meaning.
//!
//! The layout below is DLPack's `dlpack.h` (1.2+): `DLTensor`,
//! `DLPackExchangeAPIHeader { version, prev_api }` and `DLPackExchangeAPI
//! { header, managed_tensor_allocator, managed_tensor_from_py_object_no_sync,
//! managed_tensor_to_py_object_no_sync, dltensor_from_py_object_no_sync,
//! current_work_stream }`; only the last two are called.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::{ffi, Borrowed};

use crate::desc::{Desc, Dtype};

// An `Exception`, not a `TypeError`: PyO3 rewraps argument-extraction
// `TypeError`s, and the Python layer catches exactly this class.
pyo3::create_exception!(
    _native,
    NotExchangeable,
    pyo3::exceptions::PyException,
    "A tensor argument that the DLPack exchange fast path cannot read (the Python layer then describes it)."
);

/// DLPack device types used here.
const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_CUDA_MANAGED: i32 = 13;

/// DLPack dtype codes used here.
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;
const KDL_FLOAT8_E4M3FN: u8 = 10;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
#[derive(Debug)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct ApiHeader {
    version: DlVersion,
    prev_api: *const ApiHeader,
}

type DlTensorFromPy = unsafe extern "C" fn(py_object: *mut c_void, out: *mut DlTensor) -> c_int;
type CurrentWorkStream =
    unsafe extern "C" fn(device_type: i32, device_id: i32, out: *mut *mut c_void) -> c_int;

#[repr(C)]
struct ExchangeApi {
    header: ApiHeader,
    managed_tensor_allocator: *const c_void,
    managed_tensor_from_py_object_no_sync: *const c_void,
    managed_tensor_to_py_object_no_sync: *const c_void,
    dltensor_from_py_object_no_sync: Option<DlTensorFromPy>,
    current_work_stream: Option<CurrentWorkStream>,
}

/// The registered class and its two functions.
struct Registered {
    /// The exact tensor class (`torch.Tensor`), kept alive by `_class`.
    class: *mut ffi::PyTypeObject,
    _class: Py<PyAny>,
    from_py: DlTensorFromPy,
    stream: Option<CurrentWorkStream>,
}

// SAFETY: the class pointer is only compared (with the GIL held) and the
// function pointers are the framework's thread-safe C entry points; the
// table they come from lives as long as the framework's module.
unsafe impl Send for Registered {}
// SAFETY: as for `Send`: nothing here is mutated after registration.
unsafe impl Sync for Registered {}

static API: OnceLock<Registered> = OnceLock::new();

/// The table's address from `api` (a capsule named `dlpack_exchange_api`
/// or an `int`).
fn table_address(api: &Bound<'_, PyAny>) -> PyResult<*const ExchangeApi> {
    if let Ok(addr) = api.extract::<usize>() {
        return Ok(addr as *const ExchangeApi);
    }
    const NAME: &CStr = c"dlpack_exchange_api";
    // SAFETY: `api` is a live object; PyCapsule_GetPointer checks the type
    // and the name and sets a Python error (returning null) otherwise.
    let p = unsafe { ffi::PyCapsule_GetPointer(api.as_ptr(), NAME.as_ptr()) };
    if p.is_null() {
        return Err(PyErr::take(api.py()).unwrap_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err("not a dlpack_exchange_api capsule")
        }));
    }
    Ok(p as *const ExchangeApi)
}

/// Registers `class`'s exchange table `api` (first registration wins);
/// returns whether the fast path is on. A table of another major version
/// or without `dltensor_from_py_object_no_sync` leaves it off.
///
/// # Errors
/// `TypeError` when `api` is neither an address nor the named capsule.
#[pyfunction]
pub fn register_exchange_api(class: &Bound<'_, PyAny>, api: &Bound<'_, PyAny>) -> PyResult<bool> {
    if API.get().is_some() {
        return Ok(true);
    }
    let table = table_address(api)?;
    if table.is_null() {
        return Ok(false);
    }
    // SAFETY: the framework guarantees the table outlives its module and
    // starts with the versioned header; a major version other than 1 is
    // not read further.
    let (major, from_py, stream) = unsafe {
        let t = &*table;
        (
            t.header.version.major,
            t.dltensor_from_py_object_no_sync,
            t.current_work_stream,
        )
    };
    let (1, Some(from_py)) = (major, from_py) else {
        return Ok(false);
    };
    if class.cast::<pyo3::types::PyType>().is_err() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "register_exchange_api: the first argument must be the tensor class",
        ));
    }
    let _ = API.set(Registered {
        class: class.as_ptr().cast(),
        _class: class.clone().unbind(),
        from_py,
        stream,
    });
    Ok(true)
}

/// Whether the fast path is on (tests).
#[pyfunction]
pub fn exchange_api_registered() -> bool {
    API.get().is_some()
}

/// torch's current stream of CUDA device `device` through the table, if it
/// offers one.
///
/// # Errors
/// The framework's error when the call fails.
pub fn current_stream(py: Python<'_>, device: i64) -> PyResult<Option<u64>> {
    let Some(f) = API.get().and_then(|r| r.stream) else {
        return Ok(None);
    };
    let mut out: *mut c_void = std::ptr::null_mut();
    let dev = i32::try_from(device).unwrap_or(-1);
    // SAFETY: a C entry point of the registered framework, called with the
    // GIL held and a valid out pointer.
    let rc = unsafe { f(KDL_CUDA, dev, &mut out) };
    if rc != 0 {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            crate::DeviceError::new_err(format!("current_work_stream failed ({rc})"))
        }));
    }
    Ok(Some(out as u64))
}

fn dtype(t: &DlDataType) -> Result<Dtype, String> {
    Ok(match (t.code, t.bits, t.lanes) {
        (KDL_BFLOAT, 16, 1) => Dtype::Bf16,
        (KDL_FLOAT, 16, 1) => Dtype::F16,
        (KDL_FLOAT, 32, 1) => Dtype::F32,
        (KDL_INT, 32, 1) => Dtype::I32,
        (KDL_INT, 64, 1) => Dtype::I64,
        (KDL_UINT, 8, 1) => Dtype::U8,
        (KDL_FLOAT8_E4M3FN, 8, 1) => Dtype::E4m3,
        (KDL_FLOAT, 64, 1) => return Err("float64".into()),
        (c, b, l) => return Err(format!("DLPack code {c}, {b} bits, {l} lanes")),
    })
}

/// `obj` read through the registered table.
///
/// # Errors
/// [`NotExchangeable`] when nothing is registered, `obj` is not an exact
/// instance of the registered class, the framework's function refuses it
/// (its error cleared) or gives a device this module does not take.
pub fn desc(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Desc> {
    let Some(r) = API.get() else {
        return Err(NotExchangeable::new_err("no exchange API registered"));
    };
    // SAFETY: `obj` is a live object; Py_TYPE reads its type pointer.
    if unsafe { ffi::Py_TYPE(obj.as_ptr()) } != r.class {
        return Err(NotExchangeable::new_err(
            "not an instance of the registered class",
        ));
    }
    let mut t = DlTensor {
        data: std::ptr::null_mut(),
        device: DlDevice {
            device_type: 0,
            device_id: 0,
        },
        ndim: 0,
        dtype: DlDataType {
            code: 0,
            bits: 0,
            lanes: 0,
        },
        shape: std::ptr::null(),
        strides: std::ptr::null(),
        byte_offset: 0,
    };
    // SAFETY: the framework's C entry point for exact instances of its
    // class, called with the GIL held and a valid out pointer.
    let rc = unsafe { (r.from_py)(obj.as_ptr().cast(), &mut t) };
    if rc != 0 {
        let why = PyErr::take(obj.py())
            .map(|e| e.to_string())
            .unwrap_or_default();
        return Err(NotExchangeable::new_err(why));
    }
    let n = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: on success the DLTensor's shape (and strides, when not null)
    // point at `ndim` int64 values owned by the tensor, which `obj` keeps
    // alive; they are copied out before returning.
    let (shape, strides) = unsafe {
        let shape: &[i64] = if n == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(t.shape, n)
        };
        let strides: Vec<i64> = if t.strides.is_null() || n == 0 {
            let mut s = vec![1i64; n];
            for i in (0..n.saturating_sub(1)).rev() {
                s[i] = s[i + 1] * shape[i + 1];
            }
            s
        } else {
            std::slice::from_raw_parts(t.strides, n).to_vec()
        };
        (shape.to_vec(), strides)
    };
    let device = match t.device.device_type {
        KDL_CUDA | KDL_CUDA_MANAGED => i64::from(t.device.device_id),
        KDL_CPU | KDL_CUDA_HOST => -1,
        other => {
            return Err(NotExchangeable::new_err(format!(
                "DLPack device type {other}"
            )))
        }
    };
    let shape: Option<Vec<usize>> = shape.iter().map(|&x| usize::try_from(x).ok()).collect();
    let Some(shape) = shape else {
        return Err(NotExchangeable::new_err("negative extent"));
    };
    Ok(Desc {
        ptr: (t.data as u64).wrapping_add(t.byte_offset),
        dtype: dtype(&t.dtype),
        shape,
        strides,
        device,
    })
}

/// Test only: `obj` as the exchange path reads it, in the Python layer's
/// description form `(data_ptr, dtype code, shape, strides, device)` (an
/// unknown dtype as its name).
///
/// # Errors
/// As [`desc`].
#[pyfunction]
pub fn _exchange_describe(obj: &Bound<'_, PyAny>) -> PyResult<crate::desc::RawTensor> {
    let d = desc(obj.as_borrowed())?;
    let dtype = match d.dtype {
        Ok(t) => t.code().to_string(),
        Err(name) => name,
    };
    Ok((d.ptr, dtype, d.shape, d.strides, d.device))
}

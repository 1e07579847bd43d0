//! Tensor maps for the Hopper tensor-memory accelerator (TMA): the driver's
//! `cuTensorMapEncodeTiled`, behind a safe wrapper, for 16-bit tensors of up
//! to 5 dimensions loaded as boxes into shared memory with the 128-byte
//! swizzle (the layout `wgmma` operand descriptors read).
//!
//! A kernel takes the encoded map by value as a `const __grid_constant__`
//! parameter (128 bytes, 64-byte aligned) and issues
//! `cp.async.bulk.tensor` copies with box coordinates; boxes that reach
//! outside the tensor are zero-filled. Only compute capability 9.0+ devices
//! run such copies; encoding itself needs only the driver library.

use cudarc::driver::sys;
use cudarc::driver::DeviceRepr;

use crate::{KernelError, Result};

/// An encoded tensor map (the driver's opaque `CUtensorMap`), passed by
/// value as a kernel argument.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorMap {
    opaque: [u64; 16],
}

// SAFETY: plain 128-byte value with the size and alignment of `CUtensorMap`,
// copied into the kernel's parameter buffer as it is.
unsafe impl DeviceRepr for TensorMap {}

/// A tiled 16-bit tensor: `dims[0]` is the contiguous (fastest) dimension;
/// `strides_bytes[i]` is the byte stride of `dims[i + 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiled16<const R: usize> {
    /// Element count of each dimension, innermost first (each `1..=2^32`).
    pub dims: [u64; R],
    /// Byte stride of dimensions `1..R` (each a multiple of 16, `< 2^40`).
    pub strides_bytes: [u64; R],
    /// Box (elements copied per dimension, each `1..=256`); `box_dims[0] ·
    /// 2` bytes must be 128 (one swizzle row).
    pub box_dims: [u32; R],
}

impl<const R: usize> Tiled16<R> {
    /// Why the driver would reject this layout, or `None` when it is
    /// acceptable (the documented limits of `cuTensorMapEncodeTiled`, checked
    /// on the host so that a caller can fall back without a driver call).
    pub fn rejection(&self) -> Option<String> {
        if !(2..=5).contains(&R) {
            return Some(format!("rank {R} (2..=5)"));
        }
        if self.box_dims[0] != 64 {
            return Some("inner box must be 64 elements (128 bytes)".into());
        }
        for i in 0..R {
            if self.dims[i] == 0 || self.dims[i] > 1 << 32 {
                return Some(format!("dim {i} = {} (1..=2^32)", self.dims[i]));
            }
            if !(1..=256).contains(&self.box_dims[i]) {
                return Some(format!("box dim {i} = {} (1..=256)", self.box_dims[i]));
            }
        }
        for (i, &s) in self.strides_bytes[..R - 1].iter().enumerate() {
            if s % 16 != 0 || s >= 1 << 40 || s == 0 {
                return Some(format!(
                    "stride {} = {s} bytes (a multiple of 16 in 16..2^40)",
                    i + 1
                ));
            }
        }
        None
    }

    /// Encodes the map for a tensor at device address `ptr` (16-byte
    /// aligned), bf16 or f16 elements (`f16` picks the element type; the
    /// copy moves bits either way), 128-byte swizzle, zero fill out of
    /// bounds.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for a layout [`Tiled16::rejection`]
    /// names or a misaligned `ptr`; [`KernelError::Driver`] when the driver
    /// refuses the map.
    pub fn encode(&self, ptr: u64, f16: bool) -> Result<TensorMap> {
        if let Some(why) = self.rejection() {
            return Err(KernelError::unsupported("tensor map", why));
        }
        if ptr % 16 != 0 {
            return Err(KernelError::unsupported(
                "tensor map",
                format!("base {ptr:#x} not 16-byte aligned"),
            ));
        }
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let elem = [1u32; R];
        let dtype = if f16 {
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        } else {
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        };
        // SAFETY: every pointer argument points to an array of R (strides:
        // R - 1 read) live elements or to `map`, which the driver writes;
        // the address is only recorded in the map, never dereferenced here.
        let res = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                R as u32,
                ptr as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides_bytes.as_ptr(),
                self.box_dims.as_ptr(),
                elem.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        res.result()?;
        Ok(TensorMap { opaque: map.opaque })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Tiled16<4> {
        Tiled16 {
            dims: [128, 16, 8, 1000],
            strides_bytes: [256, 4096, 32768, 0],
            box_dims: [64, 16, 1, 1],
        }
    }

    #[test]
    fn accepts_a_paged_kv_layout() {
        assert_eq!(t().rejection(), None);
    }

    #[test]
    fn rejects_what_the_driver_rejects() {
        let mut a = t();
        a.strides_bytes[1] = 4104;
        assert!(a.rejection().unwrap().contains("stride 2"));
        let mut b = t();
        b.box_dims[1] = 512;
        assert!(b.rejection().unwrap().contains("box dim 1"));
        let mut c = t();
        c.box_dims[0] = 32;
        assert!(c.rejection().is_some());
        let mut d = t();
        d.dims[3] = 0;
        assert!(d.rejection().is_some());
        let mut e = t();
        e.strides_bytes[0] = 0;
        assert!(e.rejection().is_some());
    }

    #[test]
    fn map_is_the_drivers_size_and_alignment() {
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::align_of::<TensorMap>(), 64);
        assert_eq!(
            std::mem::size_of::<TensorMap>(),
            std::mem::size_of::<sys::CUtensorMap>()
        );
    }
}

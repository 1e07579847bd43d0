//! Strided views of device buffers, validated on the host so that a kernel
//! indexing inside `shape` can never leave the buffer.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

use crate::{KernelError, Result};

/// Checks that every index inside `shape` maps, through `strides` (in
/// elements), into a buffer of `len` elements. Returns the number of
/// elements the view spans ([`crate::span_elems`]; 0 when a dim is empty).
/// Every strided view of the workspace (device or host) is checked by it.
///
/// # Errors
/// [`KernelError::Capacity`] when an index falls outside the buffer,
/// [`KernelError::Stride`] when the offsets overflow `usize` (both naming `arg`).
pub fn check_view_bounds<const N: usize>(
    arg: &'static str,
    len: usize,
    shape: &[usize; N],
    strides: &[usize; N],
) -> Result<usize> {
    let needed = crate::span_elems(shape, strides).ok_or_else(|| KernelError::Stride {
        arg,
        detail: format!("shape {shape:?} with strides {strides:?} overflows usize"),
    })?;
    if needed > len {
        return Err(KernelError::Capacity {
            arg,
            needed,
            available: len,
        });
    }
    Ok(needed)
}

/// Checks that no two indices inside `shape` share an element (an output view
/// must not alias itself). Dims of size 1 are ignored, whatever their stride.
fn check_no_overlap<const N: usize>(
    arg: &'static str,
    shape: &[usize; N],
    strides: &[usize; N],
) -> Result<()> {
    let mut dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (s, n))
        .collect();
    dims.sort_unstable();
    let mut extent = 0usize; // max offset reachable by the inner dims
    for (s, n) in dims {
        if s <= extent {
            return Err(KernelError::Stride {
                arg,
                detail: format!(
                    "output view with shape {shape:?} and strides {strides:?} overlaps itself"
                ),
            });
        }
        extent += (n - 1) * s;
    }
    Ok(())
}

fn last_contiguous<const N: usize>(
    arg: &'static str,
    shape: &[usize; N],
    strides: &[usize; N],
) -> Result<()> {
    match (shape.last(), strides.last()) {
        (Some(&n), Some(&s)) if n > 1 && s != 1 => Err(KernelError::Stride {
            arg,
            detail: format!("last dim must be contiguous (stride 1), got strides {strides:?}"),
        }),
        _ => Ok(()),
    }
}

fn contiguous<const N: usize>(
    arg: &'static str,
    shape: &[usize; N],
    strides: &[usize; N],
) -> Result<()> {
    let want = row_major(shape);
    let ok = (0..N).all(|d| shape[d] <= 1 || strides[d] == want[d]);
    if ok {
        Ok(())
    } else {
        Err(KernelError::Stride {
            arg,
            detail: format!(
                "must be contiguous (strides {want:?} for shape {shape:?}), got strides {strides:?}"
            ),
        })
    }
}

/// Element strides of a contiguous row-major `[shape]` (last dim stride 1;
/// saturating, so an overflowing shape is caught by the bounds check).
pub fn row_major<const N: usize>(shape: &[usize; N]) -> [usize; N] {
    let mut strides = [1usize; N];
    for d in (0..N.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1]);
    }
    strides
}

/// A read-only strided view `[shape]` (strides in elements) of a device buffer.
///
/// Construction checks that every index inside `shape` lies in the buffer, so
/// a kernel that stays inside `shape` never reads out of bounds.
#[derive(Debug)]
pub struct Strided<'a, T, const N: usize> {
    arg: &'static str,
    data: CudaView<'a, T>,
    shape: [usize; N],
    strides: [usize; N],
}

impl<T, const N: usize> Clone for Strided<'_, T, N> {
    /// The same view of the same buffer (no device work).
    fn clone(&self) -> Self {
        Self {
            arg: self.arg,
            data: self.data.slice(..),
            shape: self.shape,
            strides: self.strides,
        }
    }
}

impl<'a, T, const N: usize> Strided<'a, T, N> {
    /// A view with explicit strides (in elements).
    ///
    /// # Errors
    /// [`KernelError::Capacity`] when an index inside `shape` falls outside
    /// `data`; [`KernelError::Stride`] on arithmetic overflow.
    pub fn new(
        arg: &'static str,
        data: CudaView<'a, T>,
        shape: [usize; N],
        strides: [usize; N],
    ) -> Result<Self> {
        check_view_bounds(arg, data.len(), &shape, &strides)?;
        Ok(Self {
            arg,
            data,
            shape,
            strides,
        })
    }

    /// A row-major contiguous view of `shape`.
    ///
    /// # Errors
    /// As [`Strided::new`].
    pub fn contiguous(arg: &'static str, data: CudaView<'a, T>, shape: [usize; N]) -> Result<Self> {
        Self::new(arg, data, shape, row_major(&shape))
    }

    /// A row-major contiguous view of a whole slice.
    ///
    /// # Errors
    /// As [`Strided::new`].
    pub fn of(arg: &'static str, data: &'a CudaSlice<T>, shape: [usize; N]) -> Result<Self> {
        Self::contiguous(arg, data.as_view(), shape)
    }

    /// Extents `[d0, d1, ...]`.
    pub fn shape(&self) -> [usize; N] {
        self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> [usize; N] {
        self.strides
    }

    /// The argument name given at construction (used in error messages).
    pub fn arg(&self) -> &'static str {
        self.arg
    }

    /// Fails unless the last dim is contiguous (stride 1; any stride when its
    /// extent is ≤ 1).
    ///
    /// # Errors
    /// [`KernelError::Stride`] naming the argument.
    pub fn require_last_contiguous(&self) -> Result<()> {
        last_contiguous(self.arg, &self.shape, &self.strides)
    }

    /// Fails unless the view is row-major contiguous (dims of extent ≤ 1 may
    /// carry any stride).
    ///
    /// # Errors
    /// [`KernelError::Stride`] naming the argument.
    pub fn require_contiguous(&self) -> Result<()> {
        contiguous(self.arg, &self.shape, &self.strides)
    }

    /// Device address of element `[0, 0, ...]`, for a kernel params struct.
    pub fn device_ptr(&self, stream: &CudaStream) -> u64 {
        // Event tracking is off on mha-kit contexts (see `Gpu`), so the
        // returned guard does nothing and may be dropped at once.
        let (ptr, _guard) = self.data.device_ptr(stream);
        ptr
    }
}

impl<T> Strided<'_, T, 1> {
    /// Fails unless this is a contiguous vector of `len` elements; `what`
    /// names the length in the message (e.g. `bs`).
    ///
    /// # Errors
    /// [`KernelError::Shape`] or [`KernelError::Stride`] naming the argument.
    pub fn require_vector(&self, len: usize, what: &str) -> Result<()> {
        if self.shape[0] != len {
            return Err(KernelError::shape(
                self.arg,
                format!("[{what}={len}]"),
                format!("{:?}", self.shape),
            ));
        }
        self.require_contiguous()
    }
}

/// A writable strided view `[shape]` of a device buffer; construction also
/// checks that the view does not alias itself.
#[derive(Debug)]
pub struct StridedMut<'a, T, const N: usize> {
    arg: &'static str,
    data: CudaViewMut<'a, T>,
    shape: [usize; N],
    strides: [usize; N],
}

impl<'a, T, const N: usize> StridedMut<'a, T, N> {
    /// The same writable view, borrowed from this one for a shorter lifetime
    /// (e.g. to pass it on to another call's arguments; no device work).
    pub fn reborrow(&mut self) -> StridedMut<'_, T, N> {
        StridedMut {
            arg: self.arg,
            data: self.data.slice_mut(..),
            shape: self.shape,
            strides: self.strides,
        }
    }

    /// A writable view with explicit strides (in elements).
    ///
    /// # Errors
    /// As [`Strided::new`], plus [`KernelError::Stride`] when two indices
    /// would share an element.
    pub fn new(
        arg: &'static str,
        data: CudaViewMut<'a, T>,
        shape: [usize; N],
        strides: [usize; N],
    ) -> Result<Self> {
        check_view_bounds(arg, data.len(), &shape, &strides)?;
        check_no_overlap(arg, &shape, &strides)?;
        Ok(Self {
            arg,
            data,
            shape,
            strides,
        })
    }

    /// A row-major contiguous writable view of `shape`.
    ///
    /// # Errors
    /// As [`StridedMut::new`].
    pub fn contiguous(
        arg: &'static str,
        data: CudaViewMut<'a, T>,
        shape: [usize; N],
    ) -> Result<Self> {
        Self::new(arg, data, shape, row_major(&shape))
    }

    /// A row-major contiguous writable view of a whole slice.
    ///
    /// # Errors
    /// As [`StridedMut::new`].
    pub fn of(arg: &'static str, data: &'a mut CudaSlice<T>, shape: [usize; N]) -> Result<Self> {
        Self::contiguous(arg, data.as_view_mut(), shape)
    }

    /// Extents `[d0, d1, ...]`.
    pub fn shape(&self) -> [usize; N] {
        self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> [usize; N] {
        self.strides
    }

    /// The argument name given at construction (used in error messages).
    pub fn arg(&self) -> &'static str {
        self.arg
    }

    /// Fails unless the last dim is contiguous (stride 1; any stride when its
    /// extent is ≤ 1).
    ///
    /// # Errors
    /// [`KernelError::Stride`] naming the argument.
    pub fn require_last_contiguous(&self) -> Result<()> {
        last_contiguous(self.arg, &self.shape, &self.strides)
    }

    /// Fails unless the view is row-major contiguous (dims of extent ≤ 1 may
    /// carry any stride).
    ///
    /// # Errors
    /// [`KernelError::Stride`] naming the argument.
    pub fn require_contiguous(&self) -> Result<()> {
        contiguous(self.arg, &self.shape, &self.strides)
    }

    /// Device address of element `[0, 0, ...]`, for a kernel params struct.
    pub fn device_ptr_mut(&mut self, stream: &CudaStream) -> u64 {
        let (ptr, _guard) = self.data.device_ptr_mut(stream);
        ptr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_accept_exact_fit_and_reject_one_past() {
        assert_eq!(check_view_bounds("t", 12, &[3, 4], &[4, 1]).unwrap(), 12);
        assert!(matches!(
            check_view_bounds("t", 11, &[3, 4], &[4, 1]),
            Err(KernelError::Capacity {
                needed: 12,
                available: 11,
                ..
            })
        ));
        // Padded rows: row stride 6 on a [3, 4] view needs 2*6 + 3 + 1 elements.
        assert_eq!(check_view_bounds("t", 16, &[3, 4], &[6, 1]).unwrap(), 16);
        assert!(check_view_bounds("t", 15, &[3, 4], &[6, 1]).is_err());
    }

    #[test]
    fn empty_views_need_nothing() {
        assert_eq!(check_view_bounds("t", 0, &[0, 4], &[4, 1]).unwrap(), 0);
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        assert!(matches!(
            check_view_bounds("t", 10, &[usize::MAX, 2], &[usize::MAX, 1]),
            Err(KernelError::Stride { .. })
        ));
    }

    #[test]
    fn overlapping_outputs_are_rejected_size_one_dims_ignored() {
        assert!(check_no_overlap("t", &[3, 4], &[4, 1]).is_ok());
        assert!(check_no_overlap("t", &[3, 4], &[3, 1]).is_err());
        assert!(check_no_overlap("t", &[3, 4], &[0, 1]).is_err());
        // A size-1 dim may carry any stride (1 KV head, any head stride).
        assert!(check_no_overlap("t", &[5, 1, 4], &[4, 0, 1]).is_ok());
        assert!(check_no_overlap("t", &[5, 1, 4], &[4, 2, 1]).is_ok());
    }

    #[test]
    fn contiguity_checks_ignore_size_one_dims() {
        assert!(last_contiguous("t", &[3, 4], &[4, 1]).is_ok());
        assert!(last_contiguous("t", &[3, 4], &[8, 2]).is_err());
        assert!(last_contiguous("t", &[3, 1], &[8, 5]).is_ok());
        assert!(contiguous("t", &[3, 4], &[4, 1]).is_ok());
        assert!(contiguous("t", &[3, 4], &[5, 1]).is_err());
        assert!(contiguous("t", &[1, 4], &[99, 1]).is_ok());
        assert!(contiguous("t", &[5], &[1]).is_ok());
        assert!(contiguous("t", &[5], &[2]).is_err());
    }

    #[test]
    fn row_major_strides() {
        assert_eq!(row_major(&[2, 3, 4]), [12, 4, 1]);
        assert_eq!(row_major(&[7]), [1]);
    }
}

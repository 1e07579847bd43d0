//! Device memory owned by someone else (an engine's torch tensors), seen
//! through the same [`Strided`](crate::Strided) / [`StridedMut`](crate::StridedMut)
//! views as mha-kit's own buffers, so that every launcher runs on it
//! unchanged: no copy, no allocation, and the memory is never freed here.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

use crate::{KernelError, Result};

/// `len` elements of `T` at a device address that another library owns
/// (a torch tensor's `data_ptr()`), wrapped as a cudarc slice that is never
/// freed: dropping an `ExternalBuffer` leaves the memory alone.
///
/// The views it lends ([`ExternalBuffer::view`], [`ExternalBuffer::view_mut`])
/// go into `Strided::new` / `StridedMut::new`, which check every index of
/// the view's shape against `len`: give the exact span the owner
/// guarantees (for a tensor, `1 + Σ (shape[d] − 1) · stride[d]` elements
/// from its `data_ptr()`; [`span_elems`]).
#[derive(Debug)]
pub struct ExternalBuffer<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
}

impl<T> ExternalBuffer<T> {
    /// Wraps `len` elements at `ptr` on `stream`'s context (the stream only
    /// names the context: mha-kit contexts keep no events, so no work is
    /// issued on it). `ptr == 0` is allowed only with `len == 0`.
    ///
    /// # Safety
    /// `ptr .. ptr + len · size_of::<T>()` must be device memory of
    /// `stream`'s context (or memory it can access, e.g. managed memory),
    /// valid for reads — and for writes when a mutable view is taken — for
    /// as long as the buffer, its views, and the work launched on them are in
    /// use; the owner must not free it before that work is done.
    ///
    /// # Errors
    /// [`KernelError::Stride`] when `ptr` is not aligned for `T`, or is 0
    /// for a non-empty buffer.
    pub unsafe fn new(
        arg: &'static str,
        stream: &Arc<CudaStream>,
        ptr: u64,
        len: usize,
    ) -> Result<Self> {
        let align = std::mem::align_of::<T>() as u64;
        if (ptr == 0 && len > 0) || ptr % align != 0 {
            return Err(KernelError::Stride {
                arg,
                detail: format!("device address {ptr:#x} is null or not {align}-byte aligned"),
            });
        }
        // SAFETY: the caller guarantees the range is live device memory of
        // this context; the slice is never dropped as a `CudaSlice` (which
        // would free it): `Drop` below leaks it back to its owner.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(Self {
            slice: ManuallyDrop::new(slice),
        })
    }

    /// Elements wrapped.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// A read-only view of the whole buffer, for [`crate::Strided::new`].
    pub fn view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }

    /// A writable view of the whole buffer, for [`crate::StridedMut::new`].
    pub fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }
}

impl<T> Drop for ExternalBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is not used after this point.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Hands the address back without freeing it (drops only cudarc's
        // bookkeeping: the stream handle and the absent events).
        let _ = slice.leak();
    }
}

// SAFETY: the wrapped slice is `Send + Sync` (cudarc); the buffer adds no
// interior state.
unsafe impl<T> Send for ExternalBuffer<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for ExternalBuffer<T> {}

/// Elements a strided view spans from its first element: `1 + Σ (shape[d]
/// − 1) · strides[d]`, 0 when a dim is empty; `None` on overflow.
pub fn span_elems(shape: &[usize], strides: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().zip(strides).try_fold(1usize, |acc, (&n, &s)| {
        (n - 1).checked_mul(s).and_then(|t| acc.checked_add(t))
    })
}

#[cfg(test)]
mod tests {
    use super::span_elems;

    #[test]
    fn span_of_strided_views() {
        assert_eq!(span_elems(&[3, 4], &[4, 1]), Some(12));
        assert_eq!(span_elems(&[3, 4], &[6, 1]), Some(16));
        assert_eq!(span_elems(&[2, 0, 5], &[9, 9, 1]), Some(0));
        // NHD pool seen as HND: [pages, Hkv, P, D] strides (P·Hkv·D, D, Hkv·D, 1).
        let (p, h, d) = (16, 2, 64);
        assert_eq!(
            span_elems(&[5, h, p, d], &[p * h * d, d, h * d, 1]),
            Some(5 * p * h * d)
        );
        assert_eq!(span_elems(&[usize::MAX, 2], &[2, 1]), None);
        assert_eq!(span_elems(&[], &[]), Some(1));
    }
}

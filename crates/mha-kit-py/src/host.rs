//! Host memory access for the CPU path: the described tensors are read and
//! written in place, through their strides.

use crate::desc::{Device, Tensor};
use crate::error::ArgError;

/// The elements a host tensor spans, as a slice.
///
/// # Safety
/// `t` must describe live host memory of its dtype (the Python layer passes
/// the address of an array it holds for the whole call), spanning
/// [`Tensor::span`] elements of `T` (`size_of::<T>() == t.dtype.size()`),
/// not written through another reference while the slice lives.
///
/// # Errors
/// [`ArgError`] when the tensor is not host memory or the address is null
/// or misaligned.
pub unsafe fn slice<'a, T>(t: &Tensor) -> Result<&'a [T], ArgError> {
    debug_assert_eq!(std::mem::size_of::<T>(), t.dtype.size());
    let span = t.span()?;
    if t.device != Device::Cpu {
        return Err(t.err("the CPU path reads host memory only"));
    }
    if span == 0 {
        return Ok(&[]);
    }
    if t.ptr == 0 || t.ptr as usize % std::mem::align_of::<T>() != 0 {
        return Err(t.err(format!("address {:#x} is null or misaligned", t.ptr)));
    }
    // SAFETY: the caller's contract: `span` live, aligned elements of `T`.
    Ok(unsafe { std::slice::from_raw_parts(t.ptr as usize as *const T, span) })
}

/// Copies the tensor's elements into a row-major vector.
///
/// # Safety
/// As [`slice`].
///
/// # Errors
/// As [`slice`].
pub unsafe fn gather<T: Copy>(t: &Tensor) -> Result<Vec<T>, ArgError> {
    // SAFETY: forwarded contract.
    let src = unsafe { slice::<T>(t)? };
    let mut out = Vec::with_capacity(t.numel());
    for_each_offset(&t.shape, &t.strides, |off| out.push(src[off]));
    Ok(out)
}

/// Writes row-major `data` into the tensor's elements through its strides.
///
/// # Safety
/// `t` must describe live, writable host memory of its dtype that no other
/// reference reads or writes during the call (as [`slice`]).
///
/// # Errors
/// As [`slice`]; [`ArgError`] when `data` has another length.
pub unsafe fn scatter<T: Copy>(t: &Tensor, data: &[T]) -> Result<(), ArgError> {
    // Checks (span, device, alignment) as for a read.
    // SAFETY: forwarded contract; the slice is dropped before the writes.
    let span = unsafe { slice::<T>(t)? }.len();
    if data.len() != t.numel() {
        return Err(t.err(format!(
            "internal: {} values for {} elements",
            data.len(),
            t.numel()
        )));
    }
    if span == 0 {
        return Ok(());
    }
    let base = t.ptr as usize as *mut T;
    let mut i = 0;
    for_each_offset(&t.shape, &t.strides, |off| {
        // SAFETY: `off < span` (every index inside the shape), the memory is
        // writable and unaliased (the caller's contract).
        unsafe { base.add(off).write(data[i]) };
        i += 1;
    });
    Ok(())
}

/// Calls `f` with the element offset of every index of `shape`, row-major.
fn for_each_offset(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(idx.iter().zip(strides).map(|(&i, &s)| i * s).sum());
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_follow_strides() {
        // A [2, 3] view with row stride 4 of an 8-element buffer.
        let mut buf: Vec<i32> = (0..8).collect();
        let t = Tensor::from_raw(
            "x",
            (
                buf.as_mut_ptr() as u64,
                "i32".into(),
                vec![2, 3],
                vec![4, 1],
                -1,
            ),
        )
        .unwrap();
        // SAFETY: `buf` is live and spans the view.
        let g = unsafe { gather::<i32>(&t) }.unwrap();
        assert_eq!(g, vec![0, 1, 2, 4, 5, 6]);
        // SAFETY: as above, nothing else touches `buf` meanwhile.
        unsafe { scatter::<i32>(&t, &[9, 9, 9, 8, 8, 8]) }.unwrap();
        assert_eq!(buf, vec![9, 9, 9, 3, 8, 8, 8, 7]);
        let scalar =
            Tensor::from_raw("s", (buf.as_ptr() as u64, "i32".into(), vec![], vec![], -1)).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { gather::<i32>(&scalar) }.unwrap(), vec![9]);
    }
}

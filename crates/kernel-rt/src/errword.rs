//! The device error word: how kernels report bad device data the host could
//! not check without a sync (an index out of range, a row too long).
//!
//! Layout (mirrored by `include/mha_kit/common.cuh`): two `u32`s,
//! `[count, flags]`. Each skipped or clamped event adds 1 to `count` (atomic,
//! saturating in practice at `u32::MAX` only after 4 G events) and ORs a
//! family-defined bit into `flags`, so the host sees how many and which kinds.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtrMut};

use crate::{Gpu, Result};

/// Number of `u32` words in the device error word.
pub const ERROR_WORD_LEN: usize = 2;

/// What a read of the device error word returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorReport {
    /// Number of events (entries skipped, rows clamped) since the last reset.
    pub count: u32,
    /// OR of the kernel family's flag bits for those events.
    pub flags: u32,
}

impl ErrorReport {
    /// No event was recorded.
    pub fn is_clean(&self) -> bool {
        self.count == 0 && self.flags == 0
    }

    /// Adds `other`'s events: counts add (saturating at `u32::MAX`), flags
    /// are OR-ed. Used to total the words of several launches or families.
    pub fn merge(&mut self, other: ErrorReport) {
        self.count = self.count.saturating_add(other.count);
        self.flags |= other.flags;
    }
}

/// A device-resident error word `[count, flags]` (u32), zeroed at creation.
#[derive(Debug)]
pub struct DeviceErrors {
    gpu: Arc<Gpu>,
    word: CudaSlice<u32>,
}

impl DeviceErrors {
    /// Allocates a zeroed error word on `gpu`'s stream.
    ///
    /// # Errors
    /// [`crate::KernelError::Driver`] on allocation failure.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        let word = gpu.stream().alloc_zeros::<u32>(ERROR_WORD_LEN)?;
        Ok(Self {
            gpu: gpu.clone(),
            word,
        })
    }

    /// Device address, for a kernel params struct.
    pub fn device_ptr(&mut self) -> u64 {
        let (ptr, _guard) = self.word.device_ptr_mut(self.gpu.stream());
        ptr
    }

    /// Reads the word. This synchronises the stream: call it off the hot path.
    ///
    /// # Errors
    /// [`crate::KernelError::Driver`] when the copy (or an earlier kernel) fails.
    pub fn read(&self) -> Result<ErrorReport> {
        let v = self.gpu.stream().clone_dtoh(&self.word)?;
        Ok(ErrorReport {
            count: v[0],
            flags: v[1],
        })
    }

    /// Zeroes the word (stream-ordered, graph-capturable memset).
    ///
    /// # Errors
    /// [`crate::KernelError::Driver`] on failure.
    pub fn reset(&mut self) -> Result<()> {
        self.gpu.stream().memset_zeros(&mut self.word)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorReport;

    #[test]
    fn merge_adds_counts_saturating_and_ors_flags() {
        let mut a = ErrorReport {
            count: 3,
            flags: 0b0101,
        };
        a.merge(ErrorReport {
            count: 4,
            flags: 0b0011,
        });
        assert_eq!(
            a,
            ErrorReport {
                count: 7,
                flags: 0b0111
            }
        );
        a.merge(ErrorReport {
            count: u32::MAX,
            flags: 0,
        });
        assert_eq!(a.count, u32::MAX);
        assert!(!a.is_clean());
    }
}

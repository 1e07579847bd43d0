//! Decode context parallelism over NCCL (issue 17): the multi-GPU form of
//! the split / merge path that [`crate::cp`] defines and that mha-backend
//! simulates on one GPU.
//!
//! `N` ranks, one GPU each (a process or a thread per rank), share one
//! NCCL communicator. Every request's KV is dealt by page interleave
//! ([`crate::cp`]): page-table entry `e` lives on rank `e mod N`. Each rank
//! is handed the **global** page table, whose entries it owns hold page ids
//! of its own pool (the other entries are never read, whatever they hold),
//! and the global `cache_seqlens`. [`DcpRank::decode`] then
//!
//! 1. launches the decode kernel with [`DecodeArgs::interleave`] = this rank
//!    into the rank's partial output `O_r` `[T, Hq, D]` and natural-log row
//!    LSE `[T, Hq]` (causal limits and windows in global positions, no
//!    sinks);
//! 2. all-gathers the `N` states over NCCL into `[N, T, Hq, D]` and
//!    `[N, T, Hq]` (rank-major, the merge kernel's layout);
//! 3. merges them with [`MergeStatesKernel`], the sinks joined once, into
//!    the caller's output (and LSE when asked),
//!
//! all on the rank's stream, in order, with no host synchronisation. Every
//! rank ends with the same merged output, equal to the unsplit decode
//! within the attention tolerance (the definition: [`crate::cp::simulate`]).
//!
//! [`DcpComm`] is the membership alone (communicator, rank, the all-gather
//! of the states) for callers that own their buffers and launch the decode
//! and merge kernels themselves: mha-backend's CUDA executor
//! (`MhaBackend::attach_decode_comm`) and mha-replay's `--dcp-gpus spread`.
//!
//! Rows of requests the kernel skips (bad `cu_seqlens_q`, counted in the
//! error word) are unspecified in the merged output, where the unsplit
//! launch leaves them untouched: their partial rows are whatever the rank
//! buffers held.
//!
//! NCCL is loaded at run time (`libnccl.so` on the loader's path, e.g.
//! `nvidia/nccl/lib` of a torch install); [`nccl_available`] says whether it
//! loads, and every entry point returns [`KernelError::Collective`] instead
//! of failing when it does not. A communicator takes one GPU per rank: NCCL
//! refuses two ranks on one device.

use std::sync::{Arc, Mutex, PoisonError, TryLockError};

use cudarc::nccl::safe::{Comm, Id};
use kernel_rt::cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kernel_rt::{DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut};

use crate::reference::Interleave;
use crate::{DecodeArgs, KvCache, MergeStatesArgs, MergeStatesKernel, PagedAttentionKernel};

/// `true` when the NCCL library loads (nothing else is called).
pub fn nccl_available() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn collective(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Collective(format!("{what}: {e:?}"))
}

/// An NCCL failure with its result code and NCCL's text for it (and, where
/// set, the thread's last error, e.g. why a communicator was refused).
fn nccl_error(what: &str, e: cudarc::nccl::result::NcclError) -> KernelError {
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: NCCL returns NUL-terminated static / thread-local strings.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: plain queries of NCCL's error strings; a null comm asks for
    // the calling thread's last error.
    let (code, last) = unsafe {
        (
            text(cudarc::nccl::sys::ncclGetErrorString(e.0)),
            text(cudarc::nccl::sys::ncclGetLastError(std::ptr::null_mut())),
        )
    };
    KernelError::Collective(
        format!("{what}: {:?} ({code}) {last}", e.0)
            .trim_end()
            .to_string(),
    )
}

fn require_nccl() -> Result<()> {
    if nccl_available() {
        Ok(())
    } else {
        Err(KernelError::Collective(
            "libnccl not found (put the directory holding libnccl.so on LD_LIBRARY_PATH)".into(),
        ))
    }
}

/// A communicator's identity, made once (by rank 0) and handed to every
/// rank: the 128 bytes of NCCL's unique id.
#[derive(Debug, Clone, Copy)]
pub struct DcpId([std::ffi::c_char; 128]);

impl DcpId {
    /// A new id (`ncclGetUniqueId`; rank 0 makes it and sends the bytes).
    ///
    /// # Errors
    /// [`KernelError::Collective`] when NCCL is missing or fails.
    pub fn new() -> Result<Self> {
        require_nccl()?;
        let id = Id::new().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
        Ok(Self(*id.internal()))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn bytes(&self) -> [u8; 128] {
        self.0.map(|c| c as u8)
    }

    /// The id received from rank 0.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        Self(bytes.map(|b| b as std::ffi::c_char))
    }
}

/// One rank's membership of a communicator on one GPU: what an engine's
/// backend needs to run its own decode launches and all-gather their
/// partial states (mha-backend's CUDA executor holds one; [`DcpRank`] is
/// the stand-alone form with its own buffers and merge launcher).
///
/// Every collective runs on the stream of the GPU the rank joined on (its
/// [`Gpu::stream`]), in the order the caller issues them; every rank of the
/// group must issue the same collectives, with the same sizes, in the same
/// order. A captured CUDA graph may hold them (NCCL ≥ 2.9).
#[derive(Debug)]
pub struct DcpComm {
    gpu: Arc<Gpu>,
    comm: Mutex<CommCell>,
    /// Why the membership was aborted ([`DcpComm::abort`]).
    why: Mutex<Option<String>>,
    rank: usize,
    ranks: usize,
}

/// A communicator that may move between threads (`None` once aborted).
#[derive(Debug)]
struct CommCell(Option<Comm>);

// SAFETY: NCCL allows a communicator to be used from any thread, one thread
// at a time; `DcpComm` only reaches it through its `Mutex`, which gives
// exactly that (cudarc's `Comm` holds a raw handle and so is not `Send`).
unsafe impl Send for CommCell {}

impl DcpComm {
    /// Joins the communicator `id` as rank `rank` of `ranks` on `gpu` (its
    /// stream carries every collective of this rank). Blocks until all
    /// `ranks` ranks have joined, so ranks join from separate threads or
    /// processes. One rank (`ranks = 1`) forms a group of one: the
    /// all-gather is then a copy.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for `ranks = 0` or `rank ≥ ranks`;
    /// [`KernelError::Collective`] when NCCL is missing or refuses (two
    /// ranks on one device).
    pub fn new(gpu: &Arc<Gpu>, rank: usize, ranks: usize, id: DcpId) -> Result<Self> {
        if ranks == 0 || rank >= ranks {
            return Err(KernelError::unsupported(
                "rank",
                format!("rank {rank} of {ranks} ranks"),
            ));
        }
        require_nccl()?;
        // NCCL reads the calling thread's current device.
        gpu.context().bind_to_thread()?;
        let comm = Comm::from_rank(Arc::clone(gpu.stream()), rank, ranks, Id::uninit(id.0))
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        Ok(Self {
            gpu: Arc::clone(gpu),
            comm: Mutex::new(CommCell(Some(comm))),
            why: Mutex::new(None),
            rank,
            ranks,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks of the group (`N`).
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The rank's device (its stream carries the collectives).
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// All-gathers the 16-bit states `send` (`n` elements) of every rank
    /// into `recv[r·n .. (r + 1)·n]`, rank-major, and the f32 row LSE
    /// `send_lse` (`m` elements) into `recv_lse[r·m .. (r + 1)·m]`, on the
    /// rank's stream. The 16-bit values travel as bytes (an all-gather
    /// copies; it never reads them).
    ///
    /// # Errors
    /// [`KernelError::Capacity`] when a receive view is shorter than `N`
    /// times its send view; [`KernelError::Collective`] when NCCL fails.
    pub fn all_gather_states(
        &self,
        send: &CudaView<'_, u16>,
        recv: &mut CudaViewMut<'_, u16>,
        send_lse: &CudaView<'_, f32>,
        recv_lse: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let n = self.ranks();
        let (n_o, n_l) = (send.len(), send_lse.len());
        for (arg, needed, available) in [
            ("all-gather outputs", n * n_o, recv.len()),
            ("all-gather LSE", n * n_l, recv_lse.len()),
        ] {
            if available < needed {
                return Err(KernelError::Capacity {
                    arg,
                    needed,
                    available,
                });
            }
        }
        self.ensure_live()?;
        if n_o == 0 && n_l == 0 {
            return Ok(());
        }
        // SAFETY: u16 → u8 views of the same memory, twice the length
        // (bounds checked above; `transmute` checks them again).
        let (send_b, mut recv_b) = unsafe {
            (
                send.transmute::<u8>(2 * n_o)
                    .ok_or_else(|| collective("send view", n_o))?,
                recv.transmute_mut::<u8>(2 * n * n_o)
                    .ok_or_else(|| collective("gather view", n * n_o))?,
            )
        };
        let cell = self
            .comm
            .lock()
            .map_err(|_| collective("communicator", "poisoned by a panic"))?;
        let Some(comm) = &cell.0 else {
            return Err(collective("communicator", "aborted"));
        };
        comm.all_gather(&send_b, &mut recv_b)
            .map_err(|e| nccl_error("ncclAllGather (outputs)", e))?;
        comm.all_gather(send_lse, &mut recv_lse.slice_mut(0..n * n_l))
            .map_err(|e| nccl_error("ncclAllGather (LSE)", e))?;
        Ok(())
    }

    /// Aborts this rank's membership (`ncclCommAbort`): the rank's
    /// collectives still in flight on its stream end without waiting for
    /// the other ranks, so a thread blocked on that stream (a
    /// synchronisation after an all-gather whose peer rank failed) is
    /// released. Callable from any thread while the rank's own thread is
    /// blocked on its stream; a later call keeps the first `why`.
    ///
    /// From the call on, every collective of this rank fails with
    /// [`KernelError::Collective`] naming `why`, and a CUDA graph that
    /// captured this rank's collectives must not be replayed (mha-backend
    /// checks [`DcpComm::aborted`] first). What the aborted collectives
    /// left in their receive buffers is unspecified.
    ///
    /// The communicator is taken out of use once no thread is inside one
    /// of its NCCL calls (a host-side call that waits for peers, e.g. a
    /// first collective connecting lazily, holds it; mha-replay connects
    /// at join with `NCCL_RUNTIME_CONNECT=0` so that none does).
    ///
    /// **Blocking.** Where the group's ranks share a process, NCCL frees
    /// their communicators at the last of their aborts, and that call
    /// waits until every CUDA graph that captured one of the group's
    /// collectives has been destroyed (NCCL's teardown counts their
    /// references). So the thread that aborts last must not itself own
    /// such a graph (drop the backends whose graphs captured collectives
    /// first), and the threads that own them must get to drop them: the
    /// ranks' own threads, once released, fail at their next collective or
    /// graph replay and drop their backends as they return. A one-rank
    /// group's graphs hold no such reference.
    ///
    /// # Errors
    /// [`KernelError::Collective`] when NCCL's abort fails or a thread
    /// stayed inside an NCCL call of this rank for `ABORT_WAIT` (10 s); the
    /// rank counts as aborted all the same.
    pub fn abort(&self, why: &str) -> Result<()> {
        self.why
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| why.to_string());
        let start = std::time::Instant::now();
        let mut cell = loop {
            match self.comm.try_lock() {
                Ok(c) => break c,
                // A panic inside an NCCL call left a valid cell.
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) if start.elapsed() < ABORT_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(collective(
                        "ncclCommAbort",
                        "a thread stayed inside an NCCL call of this rank",
                    ))
                }
            }
        };
        let Some(comm) = cell.0.take() else {
            return Ok(());
        };
        // Out of the cell, no other thread can reach it: release the lock
        // before the abort, which may block (below), so that a thread
        // waiting for the lock sees the cell empty and fails at once.
        drop(cell);
        // Dropping cudarc's `Comm` calls `ncclCommAbort` (and panics when
        // it fails): that panic becomes the error.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm)))
            .map_err(|_| collective("ncclCommAbort", "failed"))
    }

    /// `Ok` while the membership is usable.
    ///
    /// # Errors
    /// [`KernelError::Collective`] naming the reason once it was aborted
    /// ([`DcpComm::abort`]).
    pub fn ensure_live(&self) -> Result<()> {
        match self.aborted() {
            Some(why) => Err(KernelError::Collective(format!(
                "communicator aborted: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Why this rank's membership was aborted ([`DcpComm::abort`]), or
    /// `None` while it is usable.
    pub fn aborted(&self) -> Option<String> {
        self.why
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// How long [`DcpComm::abort`] waits for a thread inside an NCCL call of
/// the rank.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One rank of a decode context-parallel group: its communicator, the merge
/// launcher and the rank buffers (module docs).
#[derive(Debug)]
pub struct DcpRank {
    comm: DcpComm,
    merge: MergeStatesKernel,
    /// `[T, Hq, D]` this rank's partial output (16-bit bits).
    send_o: CudaSlice<u16>,
    /// `[T, Hq]` its row LSE.
    send_lse: CudaSlice<f32>,
    /// `[N, T, Hq, D]` every rank's partial output after the all-gather.
    all_o: CudaSlice<u16>,
    /// `[N, T, Hq]` every rank's row LSE.
    all_lse: CudaSlice<f32>,
}

impl DcpRank {
    /// Joins the communicator `id` as rank `rank` of `ranks` on `gpu` (its
    /// stream carries every launch and collective of this rank). Blocks
    /// until all `ranks` ranks have joined, so ranks join from separate
    /// threads or processes.
    ///
    /// # Errors
    /// As [`DcpComm::new`]; module load failures of the merge kernel.
    pub fn new(gpu: &Arc<Gpu>, rank: usize, ranks: usize, id: DcpId) -> Result<Self> {
        // The merge kernel loads first: a rank that fails after joining
        // would leave the others waiting in their collectives.
        let merge = MergeStatesKernel::new(gpu)?;
        let comm = DcpComm::new(gpu, rank, ranks, id)?;
        let s = gpu.stream();
        Ok(Self {
            comm,
            merge,
            send_o: s.alloc_zeros(1)?,
            send_lse: s.alloc_zeros(1)?,
            all_o: s.alloc_zeros(1)?,
            all_lse: s.alloc_zeros(1)?,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks of the group (`N`).
    pub fn ranks(&self) -> usize {
        self.comm.ranks()
    }

    /// The rank's device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.comm.gpu()
    }

    /// The rank's membership (to [`DcpComm::abort`] it from another thread
    /// when a peer rank fails).
    pub fn comm(&self) -> &DcpComm {
        &self.comm
    }

    /// Sizes the rank buffers for `rows` query rows of `hq` heads of `d`
    /// dims (they only grow). Call it before capturing [`DcpRank::decode`]
    /// in a CUDA graph: a capture must not reallocate what it records.
    ///
    /// # Errors
    /// Allocation failures.
    pub fn reserve(&mut self, rows: usize, hq: usize, d: usize) -> Result<()> {
        let n = self.ranks();
        let (o, l) = (rows * hq * d, rows * hq);
        let s = Arc::clone(self.comm.gpu().stream());
        if self.send_o.len() < o {
            self.send_o = s.alloc_zeros(o)?;
            self.all_o = s.alloc_zeros(n * o)?;
        }
        if self.send_lse.len() < l {
            self.send_lse = s.alloc_zeros(l)?;
            self.all_lse = s.alloc_zeros(n * l)?;
        }
        Ok(())
    }

    /// One context-parallel decode / verify call (module docs): `args` as
    /// for [`PagedAttentionKernel::launch`], with `kv` this rank's pools,
    /// `page_table` the global table (this rank's entries `e ≡ rank mod N`
    /// hold ids of its pools), `cache_seqlens` the global lengths, `out`
    /// `[T, Hq, D]` the merged output, `lse` (optional) the merged row LSE
    /// and `sinks` joined once after the merge. `kernel` must run on this
    /// rank's GPU. Asynchronous on the rank's stream; every rank of the
    /// group must make the same call (same shapes) in the same order.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] when `args.interleave` is set (the rank
    /// sets it) or the shape needs the CUDA-core kernel; the launcher's and
    /// the merge kernel's argument errors; [`KernelError::Collective`] when
    /// an all-gather fails.
    pub fn decode(
        &mut self,
        kernel: &PagedAttentionKernel,
        args: DecodeArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        let DecodeArgs {
            q,
            q_dtype,
            out,
            kv,
            page_table,
            cache_seqlens,
            layout,
            max_seq_len,
            bmm1_scale,
            bmm2_scale,
            window_left,
            sinks,
            interleave,
            skip_softmax,
            skipped_slices,
            split,
            lse,
            workspace,
            unit_order,
        } = args;
        if interleave.is_some() {
            return Err(KernelError::unsupported(
                "interleave",
                "set by DcpRank::decode (leave it None)",
            ));
        }
        let [rows, hq, d] = out.shape();
        let block = match &kv {
            KvCache::Half { k, .. } => k.shape()[2],
            KvCache::E4m3 { k, .. } => k.shape()[2],
        };
        self.reserve(rows, hq, d)?;
        let (n, rank) = (self.ranks(), self.rank());
        let (n_o, n_l) = (rows * hq * d, rows * hq);
        let stream = Arc::clone(self.comm.gpu().stream());
        {
            let mut local = DecodeArgs {
                q,
                q_dtype,
                out: StridedMut::contiguous("out", self.send_o.slice_mut(0..n_o), [rows, hq, d])?,
                kv,
                page_table,
                cache_seqlens,
                layout,
                max_seq_len,
                bmm1_scale,
                bmm2_scale,
                window_left,
                sinks: None,
                interleave: Some(Interleave {
                    rank,
                    ranks: n,
                    block,
                }),
                skip_softmax,
                skipped_slices,
                split,
                lse: Some(StridedMut::contiguous(
                    "lse",
                    self.send_lse.slice_mut(0..n_l),
                    [rows, hq],
                )?),
                workspace,
                unit_order,
            };
            kernel.launch_on(&stream, &mut local, errors)?;
        }
        if rows == 0 {
            return Ok(());
        }
        // Rank-major [N, T, Hq, D] and [N, T, Hq].
        self.comm.all_gather_states(
            &self.send_o.slice(0..n_o),
            &mut self.all_o.slice_mut(0..n * n_o),
            &self.send_lse.slice(0..n_l),
            &mut self.all_lse.slice_mut(0..n * n_l),
        )?;
        let mut merge = MergeStatesArgs {
            o_parts: Strided::contiguous(
                "o_parts",
                self.all_o.slice(0..n * n_o),
                [n, rows, hq, d],
            )?,
            lse_parts: Strided::contiguous(
                "lse_parts",
                self.all_lse.slice(0..n * n_l),
                [n, rows, hq],
            )?,
            dtype: q_dtype,
            out,
            lse_out: lse,
            sinks,
        };
        self.merge.launch_on(&stream, &mut merge)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nccl_every_entry_is_a_typed_error() {
        // On a host without libnccl (CI) the id is a Collective error, never
        // a panic; where NCCL loads, an id is made.
        match DcpId::new() {
            Ok(id) => {
                assert!(nccl_available());
                assert_eq!(DcpId::from_bytes(id.bytes()).bytes(), id.bytes());
            }
            Err(e) => {
                assert!(!nccl_available());
                assert!(matches!(e, KernelError::Collective(_)), "{e}");
                assert!(e.to_string().contains("LD_LIBRARY_PATH"), "{e}");
            }
        }
    }

    #[test]
    fn id_bytes_round_trip() {
        let mut b = [0u8; 128];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 37 % 256) as u8;
        }
        assert_eq!(DcpId::from_bytes(b).bytes(), b);
    }
}

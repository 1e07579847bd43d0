//! The continuous-batching scheduler (time compressed: every request is
//! queued at the start in arrival order, nothing sleeps).
//!
//! - **Admission**: strictly in arrival order (head of line waits), while a
//!   request row is free (`--max-batch`) and the KV pool can hold the
//!   request's whole life: `need = ceil((P + G − 1 + N) / page_size)` pages
//!   (`P` prompt, `G` output tokens, `N` speculative tokens in flight, 0
//!   without speculation) are reserved, so a running request never meets an
//!   exhausted pool. Pages are allocated as tokens arrive and all freed when
//!   the request finishes.
//! - **Prefill** in chunks: up to `--prefill-chunk` prompt tokens per step,
//!   taken from the prefilling requests in admission order. The last chunk
//!   produces the request's first output token.
//! - **Decode**: every running request whose prompt is done generates one
//!   token per step (its KV length grows by one), or, with speculation, up
//!   to `N` per verify step.
//!
//! The scheduler decides; the KV pools it drives are the backend's
//! ([`KvPools`]), so "pages freed on finish" is checked against the real
//! page allocator.

use std::collections::VecDeque;

use crate::error::{flag_err, ReplayError, Result};
use crate::trace::TraceRequest;

/// The pool operations the scheduler drives (the backend's pools; with
/// speculation the target's and the draft's, mirrored).
pub trait KvPools {
    /// Takes a request row.
    ///
    /// # Errors
    /// Backend errors.
    fn alloc_request(&mut self) -> Result<usize>;
    /// Appends tokens to rows, returns their slots in order.
    ///
    /// # Errors
    /// Backend errors (exhaustion cannot happen under the reservation).
    fn alloc_tokens(&mut self, grow: &[(usize, usize)]) -> Result<Vec<i64>>;
    /// Shrinks a row to `len` tokens.
    ///
    /// # Errors
    /// Backend errors.
    fn truncate(&mut self, row: usize, len: usize) -> Result<()>;
    /// Frees a row and its pages.
    ///
    /// # Errors
    /// Backend errors.
    fn free_request(&mut self, row: usize) -> Result<()>;
    /// Free pages of the full pool.
    fn free_pages(&self) -> usize;
}

/// A request the scheduler replays (lengths after the caps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Trace request id (key of its activations).
    pub id: usize,
    /// Prompt tokens `P ≥ 1`.
    pub prompt: usize,
    /// Output tokens `G ≥ 1`.
    pub output: usize,
}

impl Job {
    /// A job from a trace request with optional caps.
    pub fn from_trace(r: &TraceRequest, max_context: Option<u32>, max_output: Option<u32>) -> Self {
        let cap = |v: u32, c: Option<u32>| c.map_or(v, |c| v.min(c)) as usize;
        Self {
            id: r.id,
            prompt: cap(r.context_tokens, max_context),
            output: cap(r.generated_tokens, max_output),
        }
    }
}

/// A running request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// The job.
    pub job: Job,
    /// Its request row in the pools.
    pub row: usize,
    /// Prompt tokens prefilled so far.
    pub prefilled: usize,
    /// Output tokens produced so far.
    pub generated: usize,
    /// Tokens with KV in the cache.
    pub kv_len: usize,
    /// Pages reserved at admission.
    pub reserved: usize,
}

impl Running {
    /// Prompt fully prefilled (decoding).
    pub fn decoding(&self) -> bool {
        self.prefilled == self.job.prompt
    }

    /// Output tokens still to produce.
    pub fn remaining(&self) -> usize {
        self.job.output - self.generated
    }
}

/// One prefill chunk of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Index into [`Scheduler::running`].
    pub idx: usize,
    /// Tokens of the chunk.
    pub len: usize,
}

/// What one scheduler step does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tick {
    /// Prefill chunks (admission order).
    pub prefill: Vec<Chunk>,
    /// Decoding requests (indices into [`Scheduler::running`], admission order).
    pub decode: Vec<usize>,
}

/// Scheduler parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedConfig {
    /// `P` tokens per page.
    pub page_size: usize,
    /// Allocatable pages of the full pool.
    pub num_pages: usize,
    /// Request rows (`--max-batch`).
    pub max_batch: usize,
    /// Prompt tokens per step (`--prefill-chunk`).
    pub prefill_chunk: usize,
    /// Speculative tokens in flight per request (`N`, 0 without speculation).
    pub spec_tokens: usize,
}

impl SchedConfig {
    /// Pages a job reserves: `ceil((P + G − 1 + N) / page_size)`.
    pub fn need_pages(&self, job: &Job) -> usize {
        self.need_tokens(job).div_ceil(self.page_size)
    }

    /// Tokens a job can hold at most: `P + G − 1 + N`.
    pub fn need_tokens(&self, job: &Job) -> usize {
        job.prompt + job.output - 1 + self.spec_tokens
    }
}

/// The scheduler state.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedConfig,
    waiting: VecDeque<Job>,
    running: Vec<Running>,
    reserved: usize,
    admitted: Vec<usize>,
    finished: Vec<usize>,
}

impl Scheduler {
    /// A scheduler over `jobs` (arrival order).
    ///
    /// # Errors
    /// [`ReplayError::Flag`] (`--kv-pages`) when one job alone needs more
    /// pages than the pool has.
    pub fn new(cfg: SchedConfig, jobs: Vec<Job>) -> Result<Self> {
        if let Some(j) = jobs.iter().find(|j| cfg.need_pages(j) > cfg.num_pages) {
            return Err(flag_err(
                "--kv-pages",
                format!(
                    "request {} needs {} pages of {} tokens ({} tokens), the pool has {}",
                    j.id,
                    cfg.need_pages(j),
                    cfg.page_size,
                    cfg.need_tokens(j),
                    cfg.num_pages
                ),
            ));
        }
        Ok(Self {
            cfg,
            waiting: jobs.into(),
            running: Vec::new(),
            reserved: 0,
            admitted: Vec::new(),
            finished: Vec::new(),
        })
    }

    /// Running requests, admission order.
    pub fn running(&self) -> &[Running] {
        &self.running
    }

    /// Mutable running request `idx`.
    pub fn running_mut(&mut self, idx: usize) -> &mut Running {
        &mut self.running[idx]
    }

    /// Requests still waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Ids in admission order.
    pub fn admitted(&self) -> &[usize] {
        &self.admitted
    }

    /// Ids in finishing order.
    pub fn finished(&self) -> &[usize] {
        &self.finished
    }

    /// Pages reserved by running requests.
    pub fn reserved_pages(&self) -> usize {
        self.reserved
    }

    /// Nothing waiting and nothing running.
    pub fn is_done(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Admits waiting requests in arrival order while a row is free and
    /// their reservation fits; returns how many were admitted.
    ///
    /// # Errors
    /// Backend errors; [`ReplayError::Internal`] when nothing runs and the
    /// head cannot be admitted (cannot happen after [`Scheduler::new`]'s check).
    pub fn admit(&mut self, pools: &mut dyn KvPools) -> Result<usize> {
        let mut n = 0;
        while let Some(job) = self.waiting.front().copied() {
            let need = self.cfg.need_pages(&job);
            if self.running.len() >= self.cfg.max_batch || self.reserved + need > self.cfg.num_pages
            {
                break;
            }
            let row = pools.alloc_request()?;
            self.waiting.pop_front();
            self.reserved += need;
            self.admitted.push(job.id);
            self.running.push(Running {
                job,
                row,
                prefilled: 0,
                generated: 0,
                kv_len: 0,
                reserved: need,
            });
            n += 1;
        }
        if self.running.is_empty() && !self.waiting.is_empty() {
            return Err(ReplayError::Internal(
                "no request running and the next one cannot be admitted".into(),
            ));
        }
        Ok(n)
    }

    /// The next step: prefill chunks up to `prefill_chunk` tokens (admission
    /// order) and every decoding request.
    pub fn plan(&self) -> Tick {
        let mut budget = self.cfg.prefill_chunk;
        let mut tick = Tick::default();
        for (idx, r) in self.running.iter().enumerate() {
            if r.decoding() {
                if r.remaining() > 0 {
                    tick.decode.push(idx);
                }
            } else if budget > 0 {
                let len = (r.job.prompt - r.prefilled).min(budget);
                budget -= len;
                tick.prefill.push(Chunk { idx, len });
            }
        }
        tick
    }

    /// Records a prefill chunk as done (after its pass ran; its tokens were
    /// allocated): the last chunk yields the first output token.
    pub fn prefilled(&mut self, c: Chunk) {
        let r = &mut self.running[c.idx];
        r.prefilled += c.len;
        r.kv_len += c.len;
        if r.decoding() {
            r.generated = 1;
        }
    }

    /// Records `committed` new tokens of a decoding request (1 for a plain
    /// decode step; the accepted tokens + 1 after a verify), its KV length
    /// growing by as much.
    pub fn decoded(&mut self, idx: usize, committed: usize) {
        let r = &mut self.running[idx];
        r.generated += committed;
        r.kv_len += committed;
    }

    /// Frees every finished request (rows and pages) and returns their ids.
    ///
    /// # Errors
    /// Backend errors.
    pub fn retire(&mut self, pools: &mut dyn KvPools) -> Result<Vec<usize>> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if r.decoding() && r.remaining() == 0 {
                pools.free_request(r.row)?;
                self.reserved -= r.reserved;
                done.push(r.job.id);
                self.running.remove(i);
            } else {
                i += 1;
            }
        }
        self.finished.extend(&done);
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mha_backend::{BackendConfig, Device, LayerConfig, MhaBackend};

    struct One(MhaBackend);

    impl KvPools for One {
        fn alloc_request(&mut self) -> Result<usize> {
            Ok(self.0.alloc_request()?)
        }
        fn alloc_tokens(&mut self, grow: &[(usize, usize)]) -> Result<Vec<i64>> {
            Ok(self.0.alloc_tokens(grow)?)
        }
        fn truncate(&mut self, row: usize, len: usize) -> Result<()> {
            Ok(self.0.truncate_request(row, len)?)
        }
        fn free_request(&mut self, row: usize) -> Result<()> {
            Ok(self.0.free_request(row)?)
        }
        fn free_pages(&self) -> usize {
            self.0.with_pools(|p| p.free_pages())
        }
    }

    fn jobs() -> Vec<Job> {
        [(30, 3), (5, 1), (40, 6), (17, 2), (8, 9), (64, 1), (3, 4)]
            .iter()
            .enumerate()
            .map(|(id, &(prompt, output))| Job { id, prompt, output })
            .collect()
    }

    /// Runs the scheduler's host logic to the end (allocating like the replay).
    fn drive(cfg: SchedConfig, pools: &mut One) -> Scheduler {
        let mut s = Scheduler::new(cfg, jobs()).unwrap();
        let mut steps = 0;
        while !s.is_done() {
            s.admit(pools).unwrap();
            // Admission never over-commits the pool.
            assert!(s.reserved_pages() <= cfg.num_pages);
            let tick = s.plan();
            let mut grow: Vec<(usize, usize)> = tick
                .prefill
                .iter()
                .map(|c| (s.running()[c.idx].row, c.len))
                .collect();
            grow.extend(tick.decode.iter().map(|&i| (s.running()[i].row, 1)));
            pools.alloc_tokens(&grow).unwrap();
            for c in tick.prefill {
                s.prefilled(c);
            }
            for i in tick.decode {
                s.decoded(i, 1);
            }
            for r in s.running() {
                assert_eq!(
                    pools.0.with_pools(|p| p.request_len(r.row)).unwrap(),
                    r.kv_len
                );
            }
            s.retire(pools).unwrap();
            steps += 1;
            assert!(steps < 1000);
        }
        s
    }

    fn pools(num_pages: usize, max_batch: usize) -> One {
        let cfg = BackendConfig::dense(1, LayerConfig::new(4, 1, 64), 4, 128, num_pages, max_batch);
        One(MhaBackend::new(cfg, Device::Cpu).unwrap())
    }

    #[test]
    fn pages_freed_and_admission_in_arrival_order() {
        for (num_pages, max_batch, chunk) in [(64, 3, 16), (20, 8, 7), (200, 2, 1000), (18, 16, 1)]
        {
            let cfg = SchedConfig {
                page_size: 4,
                num_pages,
                max_batch,
                prefill_chunk: chunk,
                spec_tokens: 0,
            };
            let mut p = pools(num_pages, max_batch);
            let s = drive(cfg, &mut p);
            assert_eq!(s.admitted(), &[0, 1, 2, 3, 4, 5, 6], "{cfg:?}");
            assert_eq!(s.finished().len(), 7);
            assert_eq!(p.free_pages(), num_pages, "all pages freed: {cfg:?}");
            assert_eq!(p.0.with_pools(|p| p.free_request_rows()), max_batch);
            assert_eq!(s.reserved_pages(), 0);
        }
    }

    #[test]
    fn head_of_line_waits_for_pages() {
        // Job 2 (40 + 6 − 1 = 45 tokens = 12 pages) cannot join jobs 0, 1
        // (8 + 2 pages) in a 16-page pool: it waits, and job 3 behind it too.
        let cfg = SchedConfig {
            page_size: 4,
            num_pages: 16,
            max_batch: 8,
            prefill_chunk: 1000,
            spec_tokens: 0,
        };
        let mut p = pools(16, 8);
        let mut s = Scheduler::new(cfg, jobs()).unwrap();
        assert_eq!(s.admit(&mut p).unwrap(), 2);
        assert_eq!(s.admitted(), &[0, 1]);
        assert_eq!(s.waiting(), 5);
    }

    #[test]
    fn too_small_pool_names_the_flag() {
        let cfg = SchedConfig {
            page_size: 4,
            num_pages: 5,
            max_batch: 8,
            prefill_chunk: 16,
            spec_tokens: 0,
        };
        let e = Scheduler::new(cfg, jobs()).unwrap_err();
        assert!(e.to_string().contains("--kv-pages"), "{e}");
    }

    #[test]
    fn chunk_budget_is_shared_in_admission_order() {
        let cfg = SchedConfig {
            page_size: 4,
            num_pages: 200,
            max_batch: 8,
            prefill_chunk: 32,
            spec_tokens: 0,
        };
        let mut p = pools(200, 8);
        let mut s = Scheduler::new(cfg, jobs()).unwrap();
        s.admit(&mut p).unwrap();
        let t = s.plan();
        assert_eq!(
            t.prefill,
            vec![Chunk { idx: 0, len: 30 }, Chunk { idx: 1, len: 2 }]
        );
        assert!(t.decode.is_empty());
    }
}

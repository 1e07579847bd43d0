//! Optional split of a pass's attention device time by part: the K/V-write
//! kernels, the context (prefill / extend) attention launches and the
//! decode / verify attention launches, each bracketed by CUDA events; plus
//! the causal FLOPs the context kernel was given, so its own FLOP/s can be
//! reported.
//!
//! Off by default: nothing is recorded until a [`PartTimer`] is installed
//! with [`crate::MhaBackend::set_part_timer`] (CUDA executor only). While
//! one is installed, every **eager** [`crate::MhaBackend::forward`] records:
//!
//! - one span around the layer's K/V write (`set_kv_buffer` or the fused
//!   FP8 write) — [`AttnPart::KvWrite`];
//! - one span around the context-kernel launch of an EXTEND / MIXED pass
//!   (the requests before the batch's trailing one-token tail) —
//!   [`AttnPart::Context`];
//! - one span around the decode-kernel launch (decode, draft decode,
//!   verify, draft extend v2, and the one-token tail of a mixed pass),
//!   including the split-counter reset it may need — [`AttnPart::Decode`];
//!   when it directly follows a context launch of the same layer, it starts
//!   at that launch's end event (one event fewer);
//! - for a mixed pass whose context and decode launches run concurrently
//!   ([`crate::MixedOverlap`]): each launch's span on its own stream (both
//!   start at the fork, so a launch whose CTAs wait for SMs the other holds
//!   counts that wait), and one [`AttnPart::Concurrent`] span on the pass's
//!   stream from before the fork to after the join; the seconds the two
//!   ran at the same time are [`PartTimes::concurrent_s`].
//!
//! Host-tensor staging copies, uploads of write locations and everything
//! outside `forward` are in no span. Recording is `cuEventRecord` only: no
//! stream or host synchronisation; events are created the first time a
//! pass needs more than the timer holds and reused afterwards (no
//! allocation per pass once the largest pass has run).
//!
//! **CUDA graphs:** nothing is recorded while a graph is captured or
//! replayed (an event recorded inside a capture becomes a graph node whose
//! timing cannot be read per replay); a caller that times graph replays
//! measures the whole replay itself (mha-replay attributes it to decode).
//!
//! Reading ([`PartTimer::read`]) waits for the recorded events (an event
//! synchronisation, never a stream one); call it where the caller already
//! waits for the pass, e.g. when its results are read back.

use std::sync::Arc;

use kernel_rt::cudarc::driver::sys::CUevent_flags;
use kernel_rt::cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use kernel_rt::{Gpu, KernelError};

use crate::error::Result;

/// The part of a layer's attention work a timed span covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnPart {
    /// The K/V write into the layer's cache (bit copy or fused FP8 write).
    KvWrite,
    /// A context-kernel launch (prefill / extend / mixed prefill chunks).
    Context,
    /// A decode-kernel launch (decode, verify, draft extend v2, the
    /// one-token tail of a mixed batch), with its split-counter reset.
    Decode,
    /// The wall span of a context and a decode launch run concurrently
    /// (fork to join); the two launches have their own spans too.
    Concurrent,
}

/// Device seconds of attention work by part (one pass, or a sum of
/// passes), and the work the context kernel did in them.
///
/// Seconds are CUDA-event device time summed over spans (all layers);
/// `context_flops` are causal FLOPs ([`causal_pairs`], [`attention_flops`])
/// of the requests given to the context kernel, so
/// `context_flops / context_s` is the context kernel's own FLOP/s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartTimes {
    /// Seconds in K/V-write kernels ([`AttnPart::KvWrite`]).
    pub kv_write_s: f64,
    /// Seconds in context-kernel launches ([`AttnPart::Context`]).
    pub context_s: f64,
    /// Seconds in decode-kernel launches ([`AttnPart::Decode`]).
    pub decode_s: f64,
    /// Seconds counted in both `context_s` and `decode_s` because the two
    /// launches of a mixed pass ran concurrently: per
    /// [`AttnPart::Concurrent`] span, its launches' spans minus its wall
    /// time (0 when nothing ran concurrently).
    pub concurrent_s: f64,
    /// Causal FLOPs of the context launches: `4 · Hq · D` per visible
    /// (query, key) pair, summed over layers and requests.
    pub context_flops: f64,
}

impl PartTimes {
    /// Device seconds the spans cover: `kv_write_s + context_s + decode_s −
    /// concurrent_s`.
    pub fn total_s(&self) -> f64 {
        self.kv_write_s + self.context_s + self.decode_s - self.concurrent_s
    }

    /// Adds `other` field by field.
    pub fn add(&mut self, other: &Self) {
        self.kv_write_s += other.kv_write_s;
        self.context_s += other.context_s;
        self.decode_s += other.decode_s;
        self.concurrent_s += other.concurrent_s;
        self.context_flops += other.context_flops;
    }
}

/// Visible (query, key) pairs of one request under causal attention: `n =
/// extend_len` new tokens at absolute positions `p .. p + n` over `p =
/// prefix_len` cached tokens; the query at position `x` sees keys
/// `max(0, x − w) ..= x` with `window_left = Some(w)` (`min(x, w) + 1`
/// keys), `0 ..= x` without a window (`x + 1` keys). Without a window this
/// is `n·p + n(n+1)/2`. Saturates at `u64::MAX` (never overflows).
pub fn causal_pairs(prefix_len: u64, extend_len: u64, window_left: Option<u32>) -> u64 {
    let (p, n) = (u128::from(prefix_len), u128::from(extend_len));
    if n == 0 {
        return 0;
    }
    // Sum of x over [a, b] (a ≤ b).
    let sum = |a: u128, b: u128| (a + b) * (b - a + 1) / 2;
    let hi = p + n - 1;
    let pairs = match window_left {
        // Saturating: n·p + n(n+1)/2 can pass u128 at u64 extremes.
        None => n.saturating_mul(p).saturating_add(n * (n + 1) / 2),
        Some(w) => {
            let w = u128::from(w);
            // Rows at x ≤ w see x + 1 keys, the rest w + 1.
            let below = if p <= w {
                let b = hi.min(w);
                (b - p + 1) + sum(p, b)
            } else {
                0
            };
            let above_from = p.max(w + 1);
            let above = if above_from <= hi {
                (hi - above_from + 1) * (w + 1)
            } else {
                0
            };
            below + above
        }
    };
    u64::try_from(pairs).unwrap_or(u64::MAX)
}

/// [`causal_pairs`] summed over a ragged batch: request `i` has
/// `cu_seqlens_q[i+1] − cu_seqlens_q[i]` new tokens and attends over
/// `cache_seqlens[i]` keys in all (its prefix is the difference), as the
/// context kernels count them: with more new tokens than keys the first
/// rows see no key and the last `cache_seqlens[i]` rows are a prefill of
/// that many tokens; a negative length is 0 keys. Requests past the
/// shorter of the two inputs and those with decreasing `cu_seqlens_q`
/// (which the kernels skip) count 0.
pub fn ragged_causal_pairs(
    cu_seqlens_q: &[i32],
    cache_seqlens: &[i32],
    window_left: Option<u32>,
) -> u64 {
    cu_seqlens_q
        .windows(2)
        .zip(cache_seqlens)
        .map(|(cu, &kv)| {
            let n = i64::from(cu[1]) - i64::from(cu[0]);
            let kv = i64::from(kv).max(0);
            // Rows with a key: all n over a prefix of kv − n, or the last kv.
            let (p, m) = if n > kv { (0, kv) } else { (kv - n, n) };
            match (u64::try_from(p), u64::try_from(m)) {
                (Ok(p), Ok(m)) => causal_pairs(p, m, window_left),
                _ => 0,
            }
        })
        .fold(0u64, u64::saturating_add)
}

/// Attention FLOPs of `pairs` visible (query, key) pairs for one layer:
/// `4 · Hq · D · pairs` (Q·Kᵀ and P·V, two FLOPs per multiply-add).
pub fn attention_flops(num_q_heads: usize, head_dim: usize, pairs: u64) -> f64 {
    4.0 * num_q_heads as f64 * head_dim as f64 * pairs as f64
}

/// One timed span: events `start → end` of the timer. A
/// [`AttnPart::Concurrent`] span covers the spans from index `first` up to
/// it (the launches that ran concurrently).
#[derive(Debug, Clone, Copy)]
struct Span {
    part: AttnPart,
    start: usize,
    end: usize,
    first: usize,
}

/// CUDA events bracketing one pass's K/V-write, context and decode
/// launches (see the module docs). Create one per pass in flight, install
/// it with [`crate::MhaBackend::set_part_timer`] before the pass's
/// `forward` calls, take it back (`set_part_timer(None)`) after them, and
/// [`PartTimer::read`] it once the pass is done; [`PartTimer::reset`]
/// before reusing it for another pass.
#[derive(Debug)]
pub struct PartTimer {
    ctx: Arc<CudaContext>,
    /// Timing events, reused pass after pass; grown on demand.
    events: Vec<CudaEvent>,
    /// Events recorded since the last reset.
    used: usize,
    spans: Vec<Span>,
    context_flops: f64,
}

impl PartTimer {
    /// An empty timer on `gpu`'s context (no event created yet).
    pub fn new(gpu: &Gpu) -> Self {
        Self {
            ctx: gpu.context().clone(),
            events: Vec::new(),
            used: 0,
            spans: Vec::new(),
            context_flops: 0.0,
        }
    }

    /// Whether the timer belongs to `ctx` (events can only be recorded on
    /// streams of their own context).
    pub(crate) fn same_context(&self, ctx: &Arc<CudaContext>) -> bool {
        self.ctx == *ctx
    }

    /// Forgets what was recorded (events are kept for reuse): the start of
    /// a new pass.
    pub fn reset(&mut self) {
        self.used = 0;
        self.spans.clear();
        self.context_flops = 0.0;
    }

    /// Spans recorded since the last reset.
    pub fn spans(&self) -> usize {
        self.spans.len()
    }

    /// Events recorded since the last reset (a span that directly follows
    /// another starts at its end event, so this can be less than twice
    /// [`PartTimer::spans`]).
    pub fn events_recorded(&self) -> usize {
        self.used
    }

    /// Events created so far: the most one pass recorded since the timer
    /// was made (events are reused after a reset, never re-created).
    pub fn events_created(&self) -> usize {
        self.events.len()
    }

    /// Records the next event on `stream`; returns its index.
    pub(crate) fn mark(&mut self, stream: &CudaStream) -> Result<usize> {
        if self.used == self.events.len() {
            let e = self
                .ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(KernelError::from)?;
            self.events.push(e);
        }
        let i = self.used;
        self.events[i].record(stream).map_err(KernelError::from)?;
        self.used += 1;
        Ok(i)
    }

    /// Records the end of a span of `part` that started at event `start`;
    /// returns the end event's index (the start of an adjacent span).
    pub(crate) fn close(
        &mut self,
        part: AttnPart,
        start: usize,
        stream: &CudaStream,
    ) -> Result<usize> {
        let first = self.spans.len();
        self.push_span(part, start, first, stream)
    }

    /// Records the end of an [`AttnPart::Concurrent`] span that started at
    /// event `start` and covers the spans recorded since the timer held
    /// `first` of them ([`PartTimer::spans`] before the fork).
    pub(crate) fn close_concurrent(
        &mut self,
        start: usize,
        first: usize,
        stream: &CudaStream,
    ) -> Result<usize> {
        let first = first.min(self.spans.len());
        self.push_span(AttnPart::Concurrent, start, first, stream)
    }

    /// Records the end event on `stream` and the span; returns the event.
    fn push_span(
        &mut self,
        part: AttnPart,
        start: usize,
        first: usize,
        stream: &CudaStream,
    ) -> Result<usize> {
        let end = self.mark(stream)?;
        self.spans.push(Span {
            part,
            start,
            end,
            first,
        });
        Ok(end)
    }

    /// Adds causal FLOPs given to the context kernel.
    pub(crate) fn add_context_flops(&mut self, flops: f64) {
        self.context_flops += flops;
    }

    /// Device seconds per part since the last reset, and the context FLOPs.
    /// Waits for the recorded events (event synchronisation only).
    ///
    /// # Errors
    /// [`crate::BackendError::Kernel`] (driver: an event not recorded, a
    /// failed launch surfacing).
    pub fn read(&self) -> Result<PartTimes> {
        let mut t = PartTimes {
            context_flops: self.context_flops,
            ..PartTimes::default()
        };
        let mut secs = Vec::with_capacity(self.spans.len());
        for s in &self.spans {
            let (Some(a), Some(b)) = (self.events.get(s.start), self.events.get(s.end)) else {
                secs.push(0.0);
                continue;
            };
            secs.push(f64::from(a.elapsed_ms(b).map_err(KernelError::from)?) * 1e-3);
        }
        for (i, (s, &x)) in self.spans.iter().zip(&secs).enumerate() {
            match s.part {
                AttnPart::KvWrite => t.kv_write_s += x,
                AttnPart::Context => t.context_s += x,
                AttnPart::Decode => t.decode_s += x,
                AttnPart::Concurrent => {
                    let parts: f64 = secs[s.first.min(i)..i].iter().sum();
                    t.concurrent_s += (parts - x).max(0.0);
                }
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one query at a time.
    fn brute(p: u64, n: u64, w: Option<u32>) -> u64 {
        (p..p + n)
            .map(|x| match w {
                Some(w) => x.min(u64::from(w)) + 1,
                None => x + 1,
            })
            .sum()
    }

    #[test]
    fn causal_pairs_closed_form() {
        // Edge cases.
        assert_eq!(causal_pairs(0, 0, None), 0);
        assert_eq!(causal_pairs(100, 0, None), 0);
        assert_eq!(causal_pairs(100, 0, Some(3)), 0);
        // No prefix: the triangle n(n+1)/2.
        assert_eq!(causal_pairs(0, 1, None), 1);
        assert_eq!(causal_pairs(0, 4, None), 10);
        // Prefix: n·p + n(n+1)/2 (rows at 7, 8, 9 see 8 + 9 + 10).
        assert_eq!(causal_pairs(7, 3, None), 27);
        assert_eq!(causal_pairs(1000, 1, None), 1001);
        // Window 0: every query sees itself only.
        assert_eq!(causal_pairs(0, 5, Some(0)), 5);
        assert_eq!(causal_pairs(40, 5, Some(0)), 5);
        // A window at least as long as the sequence changes nothing.
        assert_eq!(causal_pairs(7, 3, Some(9)), 27);
        assert_eq!(causal_pairs(7, 3, Some(u32::MAX)), 27);
        assert_eq!(causal_pairs(0, 64, Some(1000)), 64 * 65 / 2);
        // Window 2: 3 keys per row once x ≥ 2.
        assert_eq!(causal_pairs(7, 3, Some(2)), 9);
        assert_eq!(causal_pairs(0, 4, Some(2)), 1 + 2 + 3 + 3);
        for p in 0..40 {
            for n in 0..40 {
                assert_eq!(causal_pairs(p, n, None), brute(p, n, None), "{p} {n}");
                for w in [0, 1, 2, 5, 17, 39, 40, 100] {
                    assert_eq!(
                        causal_pairs(p, n, Some(w)),
                        brute(p, n, Some(w)),
                        "{p} {n} {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn causal_pairs_saturates() {
        assert_eq!(causal_pairs(u64::MAX, u64::MAX, None), u64::MAX);
        // Window bounds the pairs: n · (w + 1) once past the window.
        assert_eq!(causal_pairs(u64::MAX / 2, 1 << 20, Some(127)), 128 << 20);
    }

    #[test]
    fn ragged_pairs_and_flops() {
        // Requests: 3 new over 7 cached; 2 new over none; 1 new over 4.
        let cu = [0, 3, 5, 6];
        let kv = [10, 2, 5];
        assert_eq!(ragged_causal_pairs(&cu, &kv, None), 27 + 3 + 5);
        assert_eq!(
            ragged_causal_pairs(&cu, &kv, Some(2)),
            9 + 3 + causal_pairs(4, 1, Some(2))
        );
        // Only the requests both inputs describe; empty inputs give 0.
        assert_eq!(ragged_causal_pairs(&cu[..3], &kv, None), 30);
        assert_eq!(ragged_causal_pairs(&cu, &kv[..1], None), 27);
        assert_eq!(ragged_causal_pairs(&[], &[], None), 0);
        assert_eq!(ragged_causal_pairs(&[0], &[], None), 0);
        // Decreasing cu_seqlens_q counts 0, the others still count.
        assert_eq!(ragged_causal_pairs(&[0, 3, 1, 2], &[3, 5, 1], None), 6 + 1);
        // More new tokens than keys: the last 2 rows are a 2-token prefill;
        // a negative length has no key.
        assert_eq!(ragged_causal_pairs(&[0, 4], &[2], None), 3);
        assert_eq!(ragged_causal_pairs(&[0, 4], &[-1], None), 0);
        assert_eq!(attention_flops(32, 128, 27), 4.0 * 32.0 * 128.0 * 27.0);
        assert_eq!(attention_flops(32, 128, 0), 0.0);
    }

    #[test]
    fn part_times_add_up() {
        let mut a = PartTimes {
            kv_write_s: 0.5,
            context_s: 2.0,
            decode_s: 1.0,
            concurrent_s: 0.25,
            context_flops: 10.0,
        };
        a.add(&a.clone());
        assert_eq!(
            a,
            PartTimes {
                kv_write_s: 1.0,
                context_s: 4.0,
                decode_s: 2.0,
                concurrent_s: 0.5,
                context_flops: 20.0,
            }
        );
        assert_eq!(a.total_s(), 6.5);
        assert_eq!(PartTimes::default().total_s(), 0.0);
    }
}

//! The CPU definition of paged attention (SEMANTICS.md §attention.2), in f64,
//! from the *stored* values of Q, K and V. Shared by the decode/verify kernel
//! and the future context kernel: rows are given per request, and row `j` of
//! request `i` sits at position `cache_seqlens[i] − n_i + j`.
//!
//! It also returns the [`ErrorReport`] the GPU's device error word must hold
//! (flag bits [`crate::ErrorFlags`]; DESIGN.md D10, D13), and each row's
//! natural-log log-sum-exp ([`RefOutput::lse`]), the second half of the
//! row's partial state when the keys are split ([`crate::merge`]).
//! [`attention_at`] runs the same definition over a shard of the keys
//! ([`KeyPositions`]: a key offset, a block interleave over ranks, global
//! lengths), deciding causality and the window in global positions.

use kernel_rt::ErrorReport;

use crate::ErrorFlags;

/// Element type of a 16-bit floating-point tensor stored as `u16` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HalfDtype {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
}

impl HalfDtype {
    /// Exact value of the stored bits.
    pub fn to_f64(self, bits: u16) -> f64 {
        match self {
            Self::Bf16 => half::bf16::from_bits(bits).to_f64(),
            Self::F16 => half::f16::from_bits(bits).to_f64(),
        }
    }

    /// Round-to-nearest-even encoding of `x`.
    pub fn from_f64(self, x: f64) -> u16 {
        match self {
            Self::Bf16 => half::bf16::from_f64(x).to_bits(),
            Self::F16 => half::f16::from_f64(x).to_bits(),
        }
    }

    /// Lower-case name as used in kernel entry names (`bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }
}

/// Stored KV elements, one of the three cache dtypes.
#[derive(Debug, Clone, Copy)]
pub enum KvData<'a> {
    /// bf16 bits.
    Bf16(&'a [u16]),
    /// f16 bits.
    F16(&'a [u16]),
    /// e4m3 (`float8_e4m3fn`) bytes, decoded per SEMANTICS.md §fp8-kv.4.
    E4m3(&'a [u8]),
}

impl KvData<'_> {
    fn value(&self, i: usize) -> f64 {
        match self {
            Self::Bf16(v) => HalfDtype::Bf16.to_f64(v[i]),
            Self::F16(v) => HalfDtype::F16.to_f64(v[i]),
            Self::E4m3(v) => float8::F8E4M3::from_bits(v[i]).to_f64(),
        }
    }
}

/// A strided `[num_pages, num_kv_heads, page_size, head_dim]` view of a K or
/// V pool (strides in elements; the stride of a size-1 dim is ignored).
#[derive(Debug, Clone, Copy)]
pub struct HostKv<'a> {
    /// The pool's elements.
    pub data: KvData<'a>,
    /// `[num_pages, num_kv_heads, page_size, head_dim]`.
    pub shape: [usize; 4],
    /// Element strides of the four dims.
    pub strides: [usize; 4],
}

impl HostKv<'_> {
    fn at(&self, page: usize, head: usize, tok: usize, d: usize) -> f64 {
        let s = |i: usize| {
            if self.shape[i] == 1 {
                0
            } else {
                self.strides[i]
            }
        };
        self.data
            .value(page * s(0) + head * s(1) + tok * s(2) + d * s(3))
    }
}

/// How query rows are grouped into requests (SEMANTICS.md §attention.4.1).
#[derive(Debug, Clone, Copy)]
pub enum HostLayout<'a> {
    /// Every request has `q_len_per_req` rows; request `i` owns rows
    /// `i·n .. i·n + n`; `num_tokens = bs · n`.
    Uniform {
        /// Rows per request, `n ≥ 1`.
        q_len_per_req: usize,
    },
    /// Request `i` owns rows `cu_seqlens_q[i] .. cu_seqlens_q[i+1]`, at most
    /// `max_q_len` of them.
    Ragged {
        /// `[bs + 1]` i32 prefix sums.
        cu_seqlens_q: &'a [i32],
        /// Upper bound on rows per request; longer requests are skipped (counted).
        max_q_len: usize,
    },
}

/// Inputs of one attention call, host side.
#[derive(Debug, Clone, Copy)]
pub struct HostInputs<'a> {
    /// Query bits, `[num_tokens, num_q_heads, head_dim]` via `q_strides`.
    pub q: &'a [u16],
    /// Query dtype (the output has the same dtype).
    pub q_dtype: HalfDtype,
    /// `[num_tokens, num_q_heads, head_dim]`.
    pub q_shape: [usize; 3],
    /// Element strides of `q`.
    pub q_strides: [usize; 3],
    /// K pool view.
    pub k: HostKv<'a>,
    /// V pool view (same shape as K).
    pub v: HostKv<'a>,
    /// `[bs, max_num_pages]` i32, row stride `page_table_stride`.
    pub page_table: &'a [i32],
    /// `max_num_pages` (`M`).
    pub max_num_pages: usize,
    /// Elements between page-table rows.
    pub page_table_stride: usize,
    /// `[bs]` KV lengths `L_i`, including the request's own new tokens.
    pub cache_seqlens: &'a [i32],
    /// Row grouping.
    pub layout: HostLayout<'a>,
    /// Logit scale, natural-log units.
    pub bmm1_scale: f32,
    /// Output scale.
    pub bmm2_scale: f32,
    /// `W`: row at `x` sees keys `max(0, x−W) ..= x`; `None` = no window.
    pub window_left: Option<u32>,
    /// `[num_q_heads]` f32 sink logits (never scaled).
    pub sinks: Option<&'a [f32]>,
}

/// Geometry of one request after the device's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestGeometry {
    /// First query row (token) of the request.
    pub row_start: usize,
    /// Rows `n` (`≤ max_q_len`).
    pub n: usize,
    /// KV length `L` (negative lengths read as 0).
    pub len: i64,
    /// First key any row needs: `max(0, L − n − W)` with a window, else 0.
    pub k_lo: i64,
}

/// The per-request checks the kernel makes (and counts) before using a
/// request. Ragged request `i` is processed only if
/// `0 ≤ cu[i] ≤ cu[i+1] ≤ num_tokens`, `cu[i+1] − cu[i] ≤ max_q_len` and
/// `cu[i] ≥ cu[k]` for every `k < i` (prefix maximum: two processed requests
/// never share a row); otherwise it is skipped (`None`, rows untouched) and
/// counted once ([`ErrorFlags::BAD_CU_SEQLENS`] or
/// [`ErrorFlags::Q_LEN_TOO_LONG`]). Negative `cache_seqlens` read as 0 (counted).
pub fn request_geometry(
    input: &HostInputs<'_>,
    b: usize,
    errors: &mut ErrorReport,
) -> Option<RequestGeometry> {
    let mut count = |f: ErrorFlags| {
        errors.count += 1;
        errors.flags |= f.bits();
    };
    let num_tokens = input.q_shape[0] as i64;
    let (row_start, n) = match input.layout {
        HostLayout::Uniform { q_len_per_req } => (b * q_len_per_req, q_len_per_req),
        HostLayout::Ragged {
            cu_seqlens_q,
            max_q_len,
        } => {
            let (s, e) = (i64::from(cu_seqlens_q[b]), i64::from(cu_seqlens_q[b + 1]));
            // Prefix-maximum rule: a start below an earlier request's start
            // means overlapping rows; the request is skipped.
            let overlap = cu_seqlens_q[..b].iter().any(|&c| i64::from(c) > s);
            if s < 0 || e < s || e > num_tokens || overlap {
                count(ErrorFlags::BAD_CU_SEQLENS);
                return None;
            }
            if e - s > max_q_len as i64 {
                count(ErrorFlags::Q_LEN_TOO_LONG);
                return None;
            }
            (s as usize, (e - s) as usize)
        }
    };
    let mut len = i64::from(input.cache_seqlens[b]);
    if len < 0 {
        len = 0;
        count(ErrorFlags::NEGATIVE_SEQLEN);
    }
    let k_lo = match input.window_left {
        Some(w) => (len - n as i64 - i64::from(w)).max(0),
        None => 0,
    };
    Some(RequestGeometry {
        row_start,
        n,
        len,
        k_lo,
    })
}

/// The page id holding key `k` of request `b`, or `None` when the table entry
/// lies past `max_num_pages` or the id is outside `[0, num_pages)` (D10).
fn page_of(input: &HostInputs<'_>, b: usize, k: i64) -> Option<usize> {
    let p = (k as usize) / input.k.shape[2];
    if p >= input.max_num_pages {
        return None;
    }
    let id = input.page_table[b * input.page_table_stride + p];
    (id >= 0 && (id as usize) < input.k.shape[0]).then_some(id as usize)
}

/// Result of [`attention`].
#[derive(Debug, Clone)]
pub struct RefOutput {
    /// `[num_tokens, num_q_heads, head_dim]` row-major, f64 (before rounding
    /// to the output dtype). Rows not written are 0 here.
    pub out: Vec<f64>,
    /// `[num_tokens]`: whether the row is written (rows of no request or of
    /// a skipped request keep the buffer's bytes).
    pub written: Vec<bool>,
    /// `[num_tokens, num_q_heads]` row-major, f64: the natural-log
    /// log-sum-exp of the row's logits over the keys it sees, with the sink
    /// (when given) joined once,
    ///
    /// ```text
    /// lse = ln( Σ_k exp(s_k) + exp(σ_h) ),   s_k = bmm1_scale · q·K_k
    /// ```
    ///
    /// in the units of the logits (natural log; `bmm1_scale` already holds
    /// `1/√D` and any K scale; `bmm2_scale` never enters). `-inf` for a row
    /// that sees no usable key (its output is 0, with or without a sink:
    /// D13) and for rows not written. NaN when a logit is NaN or `+inf`.
    /// Together with `out` this is the row's partial state for
    /// [`crate::merge::merge_states`].
    pub lse: Vec<f64>,
    /// What the device error word must hold.
    pub errors: ErrorReport,
}

/// The batch's length order ([`crate::PagedAttentionKernel::write_unit_order`],
/// the decode kernel's `set_length_order`): the request indices `0..bs` in
/// descending order of their length bucket `⌈cache_seqlens[i] / 128⌉`
/// (capped at 255; a length ≤ 0 is bucket 0), ties by index. `[bs]` i32.
pub fn unit_order(cache_seqlens: &[i32]) -> Vec<i32> {
    let bucket = |len: i32| {
        if len <= 0 {
            0
        } else {
            (len.unsigned_abs().div_ceil(128)).min(255)
        }
    };
    let mut order: Vec<i32> = (0..cache_seqlens.len() as i32).collect();
    // Stable: equal buckets keep index order.
    order.sort_by_key(|&i| std::cmp::Reverse(bucket(cache_seqlens[i as usize])));
    order
}

/// Visible keys of a row at position `x` (SEMANTICS.md §attention.2), before the
/// page check: `max(0, x − W) ..= x`, empty when `x < 0`.
pub fn visible_range(x: i64, window_left: Option<u32>) -> std::ops::Range<i64> {
    if x < 0 {
        return 0..0;
    }
    let lo = window_left.map_or(0, |w| (x - i64::from(w)).max(0));
    lo..x + 1
}

/// Block interleave of a sequence's keys over ranks, as decode context
/// parallelism stores them: the sequence is cut into blocks of `block` keys
/// and block `c` lives on rank `c mod ranks`, as that rank's local block
/// `c div ranks`. `block = P` deals whole pages round-robin; `block = 1`
/// deals single tokens.
///
/// Local key `k` of rank `r` sits at position (relative to the request's key
/// offset) `((k div B)·N + r)·B + k mod B`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interleave {
    /// This rank, `< ranks`.
    pub rank: usize,
    /// Ranks the blocks are dealt to (`N ≥ 1`; 0 counts as 1).
    pub ranks: usize,
    /// Keys per block (`B ≥ 1`; 0 counts as 1).
    pub block: usize,
}

impl Interleave {
    /// `(N, r, B)` as i64, `N` and `B` at least 1 (no division by zero).
    fn nrb(&self) -> (i64, i64, i64) {
        (
            self.ranks.max(1) as i64,
            self.rank as i64,
            self.block.max(1) as i64,
        )
    }

    /// Position (relative to the key offset) of local key `k ≥ 0`.
    pub fn position(&self, k: i64) -> i64 {
        let (n, r, b) = self.nrb();
        ((k / b) * n + r) * b + k % b
    }

    /// How many of this rank's keys sit at relative positions `< g`: the
    /// local index of the first key at a position `≥ g` (0 for `g ≤ 0`).
    pub fn count_below(&self, g: i64) -> i64 {
        if g <= 0 {
            return 0;
        }
        let (n, r, b) = self.nrb();
        let cycle = n * b;
        (g / cycle) * b + (g % cycle - r * b).clamp(0, b)
    }
}

/// Where a shard's keys and query rows sit in the global sequence, for
/// [`attention_at`]. The default (no offset, no interleave, no global
/// lengths) is the unsharded call of [`attention`].
///
/// Local key `k` of request `i` (the `k`-th key of the shard's page-table
/// row, `k < L_local = cache_seqlens[i]`) sits at global position
///
/// ```text
/// pos_i(k) = off_i + k                               (contiguous shard)
/// pos_i(k) = off_i + ((k div B)·N + r)·B + k mod B   (interleaved, see Interleave)
/// ```
///
/// and row `j` of the request's `n_i` rows at `x = Lg_i − n_i + j`, where
/// `Lg_i` is the global KV length. Causal and window visibility are decided
/// in global positions: local key `k` is visible to the row iff
/// `pos_i(k) ∈ [max(0, x − W), x]` (and its page is valid). A shard holding
/// keys `[off, off + L_local)` of a longer sequence is `key_offset = off`
/// with `seq_lens` the full lengths.
///
/// Sinks are not positional: [`attention_at`] joins `input.sinks` to every
/// row that sees a key, whatever the shard. Under sharding the rule of this
/// crate is that **the sink joins after the merge**: shards run with
/// `sinks: None`, their states are merged with
/// [`crate::merge::merge_states`], and [`crate::merge::apply_sinks`] adds the
/// sink once (see that module for why not on one rank).
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyPositions<'a> {
    /// `[bs]` i64: global position of each request's local key 0 (`off_i`);
    /// `None` = 0 for every request.
    pub key_offset: Option<&'a [i64]>,
    /// Block interleave of the local keys; `None` = contiguous.
    pub interleave: Option<Interleave>,
    /// `[bs]` i64 global KV lengths `Lg_i` (rows at `Lg_i − n_i + j`);
    /// `None` = one past the global position of the request's last local
    /// key (`off_i + L_local` for a contiguous shard: a shard that ends the
    /// sequence, or the unsharded call; `off_i` when it holds no key).
    pub seq_lens: Option<&'a [i64]>,
}

impl KeyPositions<'_> {
    fn offset(&self, b: usize) -> i64 {
        self.key_offset.map_or(0, |o| o[b])
    }

    /// Global position of local key `k` (`k ≥ 0`) of request `b`.
    pub fn position(&self, b: usize, k: i64) -> i64 {
        self.offset(b) + self.interleave.map_or(k, |il| il.position(k))
    }

    /// Local index of request `b`'s first local key at a global position
    /// `≥ g` (the number of its keys below `g`, before the `L_local` bound).
    pub fn local_below(&self, b: usize, g: i64) -> i64 {
        let rel = g - self.offset(b);
        self.interleave.map_or(rel.max(0), |il| il.count_below(rel))
    }

    /// Global KV length of request `b` whose shard holds `local_len` keys.
    pub fn seq_len(&self, b: usize, local_len: i64) -> i64 {
        match self.seq_lens {
            Some(l) => l[b],
            None if local_len <= 0 => self.offset(b),
            None => self.position(b, local_len - 1) + 1,
        }
    }
}

/// Paged attention, exactly as SEMANTICS.md §attention.2, in f64, with the row
/// log-sum-exp ([`RefOutput::lse`]). The unsharded case of [`attention_at`].
///
/// Per request: rows `j < n` at `x = L − n + j`; keys in [`visible_range`]
/// whose page is valid (D10: bad pages are masked and counted once per needed
/// page, needed = pages of `[k_lo, L)`); a row with no usable key outputs
/// zeros and `lse = -inf`, with or without a sink (D13).
pub fn attention(input: &HostInputs<'_>) -> RefOutput {
    attention_at(input, &KeyPositions::default())
}

/// [`attention`] over a shard of the keys placed by `pos` ([`KeyPositions`]):
/// row `j` of request `i` sits at `x = Lg_i − n_i + j` and sees the local
/// keys `k < L_local` with `pos_i(k) ∈ [max(0, x − W), x]` on valid pages.
/// Needed pages (checked and counted, D10) are those holding a local key at
/// a global position in `[max(0, Lg − n − W), Lg)`.
///
/// Per row and query head `h` (KV head `h / G`), over its visible keys `k`:
///
/// ```text
/// s_k = bmm1_scale · q·K_k,  m = max(max_k s_k, σ_h)
/// out = bmm2_scale · Σ_k exp(s_k − m)·V_k / (Σ_k exp(s_k − m) + exp(σ_h − m))
/// lse = m + ln(Σ_k exp(s_k − m) + exp(σ_h − m))      (natural log)
/// ```
///
/// (the `σ_h` terms only with `input.sinks`); no visible key: `out = 0`,
/// `lse = -inf`.
pub fn attention_at(input: &HostInputs<'_>, pos: &KeyPositions<'_>) -> RefOutput {
    let [num_tokens, hq, dim] = input.q_shape;
    let hkv = input.k.shape[1];
    let group = hq / hkv.max(1);
    let bs = input.cache_seqlens.len();
    let mut out = vec![0.0f64; num_tokens * hq * dim];
    let mut lse = vec![f64::NEG_INFINITY; num_tokens * hq];
    let mut written = vec![false; num_tokens];
    let mut errors = ErrorReport::default();
    let q_at = |t: usize, h: usize, d: usize| {
        input.q_dtype.to_f64(
            input.q[t * input.q_strides[0] + h * input.q_strides[1] + d * input.q_strides[2]],
        )
    };
    let bmm1 = f64::from(input.bmm1_scale);
    let bmm2 = f64::from(input.bmm2_scale);
    for b in 0..bs {
        let Some(g) = request_geometry(input, b, &mut errors) else {
            continue;
        };
        let page_size = input.k.shape[2] as i64;
        let n = g.n as i64;
        let len_g = pos.seq_len(b, g.len);
        let k_lo_g = input
            .window_left
            .map_or(0, |w| (len_g - n - i64::from(w)).max(0));
        // Local keys at global positions [k_lo_g, len_g): unsharded, [k_lo, L).
        let need_lo = pos.local_below(b, k_lo_g);
        let need_hi = pos.local_below(b, len_g).min(g.len);
        if g.n > 0 && need_lo < need_hi {
            for p in need_lo / page_size..=(need_hi - 1) / page_size {
                if page_of(input, b, p * page_size).is_none() {
                    errors.count += 1;
                    errors.flags |= ErrorFlags::BAD_PAGE.bits();
                }
            }
        }
        for j in 0..g.n {
            let row = g.row_start + j;
            written[row] = true;
            let x = len_g - n + j as i64;
            let vis = visible_range(x, input.window_left);
            let local = pos.local_below(b, vis.start)..pos.local_below(b, vis.end).min(g.len);
            let keys: Vec<(i64, usize)> = local
                .filter_map(|k| page_of(input, b, k).map(|id| (k, id)))
                .collect();
            if keys.is_empty() {
                continue; // D13: zeros, lse = -inf
            }
            for h in 0..hq {
                let kvh = h / group;
                let o = &mut out[(row * hq + h) * dim..(row * hq + h + 1) * dim];
                let logits: Vec<f64> = keys
                    .iter()
                    .map(|&(k, id)| {
                        let tok = (k % page_size) as usize;
                        bmm1 * (0..dim)
                            .map(|d| q_at(row, h, d) * input.k.at(id, kvh, tok, d))
                            .sum::<f64>()
                    })
                    .collect();
                let sink = input.sinks.map(|s| f64::from(s[h]));
                let m = logits
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = logits.iter().map(|&s| (s - m).exp()).collect();
                let den: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                lse[row * hq + h] = m + den.ln();
                for (d, od) in o.iter_mut().enumerate() {
                    let num: f64 = keys
                        .iter()
                        .zip(&w)
                        .map(|(&(k, id), &wk)| {
                            wk * input.v.at(id, kvh, (k % page_size) as usize, d)
                        })
                        .sum();
                    *od = bmm2 * num / den;
                }
            }
        }
    }
    RefOutput {
        out,
        written,
        lse,
        errors,
    }
}

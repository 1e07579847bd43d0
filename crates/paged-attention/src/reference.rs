//! The CPU definition of paged attention (spec `attention.md` §2), in f64,
//! from the *stored* values of Q, K and V. Shared by the decode/verify kernel
//! and the future context kernel: rows are given per request, and row `j` of
//! request `i` sits at position `cache_seqlens[i] − n_i + j`.
//!
//! It also returns the [`ErrorReport`] the GPU's device error word must hold
//! (flag bits [`crate::ErrorFlags`]; DECISIONS.md D10, D13).

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
    /// e4m3 (`float8_e4m3fn`) bytes, decoded per fp8-kv.md §4.
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

/// How query rows are grouped into requests (attention.md §4.1).
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
    /// What the device error word must hold.
    pub errors: ErrorReport,
}

/// Visible keys of a row at position `x` (attention.md §2), before the
/// page check: `max(0, x − W) ..= x`, empty when `x < 0`.
pub fn visible_range(x: i64, window_left: Option<u32>) -> std::ops::Range<i64> {
    if x < 0 {
        return 0..0;
    }
    let lo = window_left.map_or(0, |w| (x - i64::from(w)).max(0));
    lo..x + 1
}

/// Paged attention, exactly as attention.md §2, in f64.
///
/// Per request: rows `j < n` at `x = L − n + j`; keys in [`visible_range`]
/// whose page is valid (D10: bad pages are masked and counted once per needed
/// page, needed = pages of `[k_lo, L)`); a row with no usable key outputs
/// zeros, with or without a sink (D13).
pub fn attention(input: &HostInputs<'_>) -> RefOutput {
    let [num_tokens, hq, dim] = input.q_shape;
    let hkv = input.k.shape[1];
    let group = hq / hkv.max(1);
    let bs = input.cache_seqlens.len();
    let mut out = vec![0.0f64; num_tokens * hq * dim];
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
        if g.n > 0 && g.k_lo < g.len {
            for p in g.k_lo / page_size..=(g.len - 1) / page_size {
                if page_of(input, b, p * page_size).is_none() {
                    errors.count += 1;
                    errors.flags |= ErrorFlags::BAD_PAGE.bits();
                }
            }
        }
        for j in 0..g.n {
            let row = g.row_start + j;
            written[row] = true;
            let x = g.len - g.n as i64 + j as i64;
            let keys: Vec<(i64, usize)> = visible_range(x, input.window_left)
                .filter_map(|k| page_of(input, b, k).map(|id| (k, id)))
                .collect();
            for h in 0..hq {
                let kvh = h / group;
                let o = &mut out[(row * hq + h) * dim..(row * hq + h + 1) * dim];
                if keys.is_empty() {
                    continue; // D13: zeros
                }
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
        errors,
    }
}

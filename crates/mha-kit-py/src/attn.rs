//! `trtllm_batch_decode_with_kv_cache` / `trtllm_batch_context_with_kv_cache`:
//! validation shared by both paths (the launchers' shape rules, with the
//! public argument names) and the CPU path (paged-attention's f64 reference).

use paged_attention::reference::{self, HostInputs, HostKv, HostLayout, Interleave, KvData};
use paged_attention::{HalfDtype, KvDtype, DECODE_HEAD_DIMS, MAX_GROUP};

use crate::desc::{Dtype, Tensor};
use crate::error::ArgError;
use crate::host;

/// Largest uniform `q_len_per_req` / ragged `max_q_len` of the decode kernel.
pub const MAX_DECODE_Q_LEN: usize = 16;
/// Largest `max_q_len` of the context kernel (paged-attention's bound).
pub const MAX_CONTEXT_Q_LEN: usize = 1 << 24;
/// `max_seq_len` must stay below this (the kernels' window cap).
pub const MAX_SEQ_LEN: usize = 1 << 30;

/// Launcher argument names → public names (for the launchers' errors).
pub const NAMES: &[(&str, &str)] = &[
    ("q", "query"),
    ("out", "out"),
    ("k_cache", "k_cache"),
    ("v_cache", "v_cache"),
    ("page_table", "block_tables"),
    ("cache_seqlens", "seq_lens"),
    ("cu_seqlens_q", "cum_seq_lens_q"),
    ("cu_seqlens_k", "cum_seq_lens_kv"),
    ("sinks", "sinks"),
    ("workspace", "workspace_buffer"),
    ("max_q_len", "max_q_len"),
    ("q_len_per_req", "q_len_per_req"),
    ("max_seq_len", "max_seq_len"),
    ("bmm1_scale", "bmm1_scale"),
    ("bmm2_scale", "bmm2_scale"),
    ("page_size", "k_cache"),
    ("bs", "seq_lens"),
];

/// How query rows map to requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `q_len_per_req` rows per request (decode, uniform verify).
    Uniform(usize),
    /// `cum_seq_lens_q` rows, at most `max_q_len` per request (ragged verify,
    /// context).
    Ragged(usize),
}

/// One validated attention call (both entry points).
#[derive(Debug, Clone)]
pub struct AttnCall {
    /// `[T, Hq, D]` bf16/f16, or e4m3 when `q_fp8` (host memory only: the
    /// Python layer converts a CUDA query into the output dtype first).
    pub q: Tensor,
    /// Whether `q` holds e4m3 bytes (values taken exactly, no scale: the
    /// scale is in `bmm1_scale`).
    pub q_fp8: bool,
    /// `[T, Hq, D]`, of dtype `q_dtype`.
    pub out: Tensor,
    /// `[T, Hq]` f32: each written row's natural-log LSE (see
    /// `paged_attention::reference::Reference::lse`).
    pub lse: Option<Tensor>,
    /// K cache as the HND-indexed view `[num_pages, Hkv, P, D]`.
    pub k: Tensor,
    /// V cache, as `k`.
    pub v: Tensor,
    /// `[bs, M]` i32.
    pub page_table: Tensor,
    /// `[bs]` i32.
    pub seq_lens: Tensor,
    /// `[bs + 1]` i32 (ragged / context).
    pub cu_q: Option<Tensor>,
    /// `[bs + 1]` i32 (context; shape-checked only).
    pub cu_k: Option<Tensor>,
    /// Row grouping.
    pub layout: Layout,
    /// `[Hq]` f32.
    pub sinks: Option<Tensor>,
    /// The caller's workspace (decode splits).
    pub workspace: Tensor,
    /// Dtype of `out`, and of `q` unless `q_fp8`.
    pub q_dtype: HalfDtype,
    /// Dtype of the K/V caches.
    pub kv_dtype: KvDtype,
    /// Logit scale.
    pub bmm1: f32,
    /// Output scale.
    pub bmm2: f32,
    /// `W`, `None` = no window.
    pub window: Option<u32>,
    /// Upper bound on `seq_lens`, ≥ 1 (a caller's 0 is taken as 1: the
    /// bound only sizes the split plan, never which keys are read).
    pub max_seq_len: usize,
    /// Skip-softmax factor (decode on the GPU; `None` / 0: exact).
    pub skip_softmax: Option<f32>,
    /// Decode context parallelism: this call is rank `rank` of `ranks`
    /// by page interleave (`block` = the page size): it reads the request
    /// pages `e ≡ rank mod ranks` of the global `block_tables` and returns
    /// the rank's partial state, in global positions, without sinks.
    /// `None` = the whole sequence (also for one rank).
    pub interleave: Option<Interleave>,
    /// `[bs]` i32, contiguous: the batch's length order written by
    /// `write_decode_unit_order` from `seq_lens` (decode; the GPU's ordered
    /// launches of one split read it, the CPU path does not).
    pub unit_order: Option<Tensor>,
}

/// The arguments of either entry point, described.
#[derive(Debug)]
pub struct AttnInputs {
    /// `query`.
    pub q: Tensor,
    /// `k_cache` (already permuted to HND by the Python layer when the
    /// layout is NHD).
    pub k: Tensor,
    /// `v_cache`, as `k`.
    pub v: Tensor,
    /// `workspace_buffer`.
    pub workspace: Tensor,
    /// `block_tables`.
    pub page_table: Tensor,
    /// `seq_lens`.
    pub seq_lens: Tensor,
    /// `out`.
    pub out: Tensor,
    /// `lse` (`[T, Hq]` f32), optional.
    pub lse: Option<Tensor>,
    /// `cum_seq_lens_q`.
    pub cu_q: Option<Tensor>,
    /// `cum_seq_lens_kv` (context only).
    pub cu_k: Option<Tensor>,
    /// `sinks`.
    pub sinks: Option<Tensor>,
    /// `q_len_per_req` (decode; `None` = ragged).
    pub q_len_per_req: Option<usize>,
    /// `max_q_len`.
    pub max_q_len: Option<usize>,
    /// `max_seq_len` (decode) / `max_kv_len` (context).
    pub max_seq_len: usize,
    /// `batch_size` (context).
    pub batch_size: Option<usize>,
    /// `bmm1_scale`.
    pub bmm1: f64,
    /// `bmm2_scale`.
    pub bmm2: f64,
    /// `window_left`.
    pub window_left: i64,
    /// `skip_softmax_threshold_scale_factor` (decode).
    pub skip_softmax: Option<f64>,
    /// `(dcp_rank, dcp_world_size)` (decode; `None` = not sharded).
    pub dcp: Option<(usize, usize)>,
    /// `unit_order` (decode; mha-kit's own keyword).
    pub unit_order: Option<Tensor>,
}

fn half(t: &Tensor) -> Result<HalfDtype, ArgError> {
    match t.dtype {
        Dtype::Bf16 => Ok(HalfDtype::Bf16),
        Dtype::F16 => Ok(HalfDtype::F16),
        _ => Err(t.err("dtype must be bfloat16, float16 or float8_e4m3fn")),
    }
}

fn kv_dtype(t: &Tensor) -> Result<KvDtype, ArgError> {
    match t.dtype {
        Dtype::Bf16 => Ok(KvDtype::Bf16),
        Dtype::F16 => Ok(KvDtype::F16),
        Dtype::E4m3 | Dtype::U8 => Ok(KvDtype::E4m3),
        _ => Err(t.err("dtype must be bfloat16, float16, float8_e4m3fn or uint8 (e4m3 bytes)")),
    }
}

fn vector(t: &Tensor, dtype: Dtype, len: usize, what: &str) -> Result<(), ArgError> {
    t.require_dtype(&[dtype])?;
    t.require_shape(&[len], what)?;
    t.require_contiguous()
}

/// Whether paged-attention's `ContextKernel::launch` serves a context call:
/// a context kernel ([`paged_attention::context_supported`], head dims
/// [`paged_attention::HEAD_DIMS`]) or, at head dim 512, the decode kernel's
/// ragged path ([`paged_attention::context_decode_path`]: correct, not
/// tuned). Either way K/V e4m3 or of the Q dtype.
fn context_served(q: HalfDtype, kv: KvDtype, head_dim: usize) -> bool {
    paged_attention::context_supported(q, kv, head_dim)
        || paged_attention::context_decode_path(q, kv, head_dim)
}

/// Whether the context call serves head dim `head_dim` with a `q` query
/// for some K/V dtype (e4m3 goes with every query dtype).
fn context_head_dim(q: HalfDtype, head_dim: usize) -> bool {
    context_served(q, KvDtype::E4m3, head_dim)
}

/// Validates a call: `context` selects the context kernel's rules.
///
/// # Errors
/// [`ArgError`] naming the argument (shape, strides, dtype in the message).
pub fn validate(a: AttnInputs, context: bool) -> Result<AttnCall, ArgError> {
    a.q.require_rank(3, "[num_tokens, num_qo_heads, head_dim]")?;
    // An e4m3 query (the seed casts it for FP8 caches) computes in the
    // output's dtype: every e4m3 value is exact in bf16 and f16.
    let q_fp8 = a.q.dtype == Dtype::E4m3;
    let q_dtype = if q_fp8 {
        half(&a.out).map_err(|_| {
            a.out.err(
                "dtype must be bfloat16 or float16 with a float8_e4m3fn query (pass out_dtype): \
                 the kernels write no FP8 output",
            )
        })?
    } else {
        half(&a.q)?
    };
    let [t, hq, d] = a.q.dims::<3>();
    a.q.require_last_contiguous()?;
    // Both calls serve DECODE_HEAD_DIMS: the context call at 512 through
    // the decode kernel's ragged path (correct, not tuned).
    let served = |d: usize| {
        if context {
            context_head_dim(q_dtype, d)
        } else {
            DECODE_HEAD_DIMS.contains(&d)
        }
    };
    if !served(d) {
        let ok: Vec<String> = DECODE_HEAD_DIMS
            .iter()
            .filter(|&&x| served(x))
            .map(ToString::to_string)
            .collect();
        return Err(a
            .q
            .err(format!("head_dim {d} is not supported ({})", ok.join(", "))));
    }
    a.out
        .require_rank(3, "[num_tokens, num_qo_heads, head_dim]")?;
    if !q_fp8 && a.out.dtype != a.q.dtype {
        return Err(a.out.err(format!(
            "dtype must be the query's ({}): the kernels write the query dtype",
            a.q.dtype.name()
        )));
    }
    a.out.require_shape(&[t, hq, d], "as query")?;
    a.out.require_last_contiguous()?;
    for kv in [&a.k, &a.v] {
        kv.require_rank(4, "[num_pages, num_kv_heads, page_size, head_dim] (HND)")?;
        kv.require_last_contiguous()?;
    }
    let kv_dt = kv_dtype(&a.k)?;
    if kv_dtype(&a.v)? != kv_dt {
        return Err(a
            .v
            .err(format!("dtype must be k_cache's ({})", a.k.dtype.name())));
    }
    let [pages, hkv, p, kd] = a.k.dims::<4>();
    if kd != d || pages == 0 || hkv == 0 || p == 0 {
        return Err(a.k.err(format!(
            "expected [num_pages ≥ 1, num_kv_heads ≥ 1, page_size ≥ 1, head_dim = {d}] (HND \
             index order)"
        )));
    }
    if a.v.shape != a.k.shape {
        return Err(a.v.err(format!("shape must be k_cache's {:?}", a.k.shape)));
    }
    if hq == 0 || hq % hkv != 0 || hq / hkv > MAX_GROUP {
        return Err(a.q.err(format!(
            "num_qo_heads {hq} must be a multiple of num_kv_heads {hkv} with a group of at most \
             {MAX_GROUP}"
        )));
    }
    if context && !context_served(q_dtype, kv_dt, d) {
        return Err(a
            .k
            .err("dtype must be the query's or float8_e4m3fn (context kernel)"));
    }
    a.page_table
        .require_rank(2, "[batch_size, max_num_pages]")?;
    a.page_table.require_dtype(&[Dtype::I32])?;
    a.page_table.require_last_contiguous()?;
    let [bs, m] = a.page_table.dims::<2>();
    if m == 0 {
        return Err(a.page_table.err("max_num_pages (dim 1) must be ≥ 1"));
    }
    vector(&a.seq_lens, Dtype::I32, bs, "[batch_size]")?;
    if let Some(u) = &a.unit_order {
        if context {
            return Err(u.err("a decode / verify option (the context call has no unit order)"));
        }
        vector(u, Dtype::I32, bs, "[batch_size]")?;
    }
    if let Some(s) = &a.sinks {
        vector(s, Dtype::F32, hq, "[num_qo_heads]")?;
    }
    let (bmm1, bmm2) = (a.bmm1 as f32, a.bmm2 as f32);
    if !bmm1.is_finite() {
        return Err(ArgError::new(
            "bmm1_scale",
            format!("{} is not finite in f32", a.bmm1),
        ));
    }
    if !bmm2.is_finite() {
        return Err(ArgError::new(
            "bmm2_scale",
            format!("{} is not finite in f32", a.bmm2),
        ));
    }
    let window = match a.window_left {
        -1 => None,
        w if w >= 0 => Some(u32::try_from(w).unwrap_or(u32::MAX)),
        w => {
            return Err(ArgError::new(
                "window_left",
                format!("{w} (must be -1 or ≥ 0)"),
            ))
        }
    };
    let skip_softmax = match a.skip_softmax {
        None => None,
        Some(f) if f.is_finite() && f >= 0.0 && (f as f32).is_finite() => Some(f as f32),
        Some(f) => {
            return Err(ArgError::new(
                "skip_softmax_threshold_scale_factor",
                format!("{f} (a finite factor ≥ 0, or None)"),
            ))
        }
    };
    let interleave = match a.dcp {
        None | Some((0, 1)) => None,
        Some(_) if context => {
            return Err(ArgError::new(
                "dcp_world_size",
                "decode context parallelism is a decode / verify option",
            ))
        }
        Some((rank, ranks)) if ranks == 0 || rank >= ranks => {
            return Err(ArgError::new(
                "dcp_rank",
                format!("rank {rank} of dcp_world_size {ranks} (0 ≤ rank < size)"),
            ))
        }
        Some(_) if a.sinks.is_some() => {
            return Err(ArgError::new(
                "sinks",
                "a context-parallel rank's partial state has no sinks: pass them to \
                 merge_states, which joins them once",
            ))
        }
        Some(_) if a.lse.is_none() => {
            return Err(ArgError::new(
                "lse",
                "a context-parallel rank's output merges only with its log-sum-exp: pass lse \
                 or return_lse=True",
            ))
        }
        Some((rank, ranks)) => Some(Interleave {
            rank,
            ranks,
            block: p,
        }),
    };
    if let Some(l) = &a.lse {
        l.require_rank(2, "[num_tokens, num_qo_heads]")?;
        l.require_dtype(&[Dtype::F32])?;
        l.require_shape(&[t, hq], "[num_tokens, num_qo_heads]")?;
    }
    if a.max_seq_len >= MAX_SEQ_LEN {
        let name = if context { "max_kv_len" } else { "max_seq_len" };
        return Err(ArgError::new(
            name,
            format!("{} (supported 0..2^30)", a.max_seq_len),
        ));
    }
    let ragged = |max_q: Option<usize>, bound: usize| -> Result<Layout, ArgError> {
        let max_q = max_q.ok_or_else(|| {
            ArgError::new("max_q_len", "required with cum_seq_lens_q (ragged rows)")
        })?;
        if !(1..=bound).contains(&max_q) {
            return Err(ArgError::new(
                "max_q_len",
                format!("{max_q} (supported 1..={bound})"),
            ));
        }
        let cu = a.cu_q.as_ref().ok_or_else(|| {
            ArgError::new(
                "cum_seq_lens_q",
                "required for ragged rows (q_len_per_req=None)",
            )
        })?;
        vector(cu, Dtype::I32, bs + 1, "[batch_size + 1]")?;
        Ok(Layout::Ragged(max_q))
    };
    let layout = if context {
        if let Some(b) = a.batch_size {
            if b != bs {
                return Err(ArgError::new(
                    "batch_size",
                    format!("{b}, but block_tables / seq_lens have {bs} rows"),
                ));
            }
        }
        if let Some(k) = &a.cu_k {
            vector(k, Dtype::I32, bs + 1, "[batch_size + 1]")?;
        }
        ragged(a.max_q_len, MAX_CONTEXT_Q_LEN)?
    } else {
        match a.q_len_per_req {
            Some(n) => {
                if a.cu_q.is_some() {
                    return Err(ArgError::new(
                        "cum_seq_lens_q",
                        format!(
                            "given with q_len_per_req={n}: pass q_len_per_req=None for ragged rows"
                        ),
                    ));
                }
                if !(1..=MAX_DECODE_Q_LEN).contains(&n) {
                    return Err(ArgError::new(
                        "q_len_per_req",
                        format!("{n} (supported 1..={MAX_DECODE_Q_LEN})"),
                    ));
                }
                if t != bs * n {
                    return Err(a.q.err(format!(
                        "num_tokens must be batch_size · q_len_per_req = {bs} · {n}"
                    )));
                }
                Layout::Uniform(n)
            }
            None => ragged(a.max_q_len, MAX_DECODE_Q_LEN)?,
        }
    };
    Ok(AttnCall {
        q: a.q,
        q_fp8,
        out: a.out,
        lse: a.lse,
        k: a.k,
        v: a.v,
        page_table: a.page_table,
        seq_lens: a.seq_lens,
        cu_q: a.cu_q,
        cu_k: a.cu_k,
        layout,
        sinks: a.sinks,
        workspace: a.workspace,
        q_dtype,
        kv_dtype: kv_dt,
        bmm1,
        bmm2,
        window,
        max_seq_len: a.max_seq_len.max(1),
        skip_softmax,
        interleave,
        unit_order: a.unit_order,
    })
}

/// Checks `write_decode_unit_order`'s tensors: `seq_lens` and `unit_order`
/// `[bs]` i32, contiguous (`bs` from `seq_lens`).
///
/// # Errors
/// [`ArgError`] naming the tensor.
pub fn validate_unit_order(seq_lens: &Tensor, unit_order: &Tensor) -> Result<(), ArgError> {
    seq_lens.require_rank(1, "[batch_size]")?;
    let bs = seq_lens.shape[0];
    vector(seq_lens, Dtype::I32, bs, "[batch_size]")?;
    vector(unit_order, Dtype::I32, bs, "[batch_size]")
}

/// `write_decode_unit_order` on host tensors: `unit_order` = the length
/// order of `seq_lens` ([`paged_attention::reference::unit_order`], the
/// definition the GPU's writer is tested against).
///
/// # Safety
/// Both tensors must describe live host memory as validated by
/// [`validate_unit_order`]; they must not overlap.
///
/// # Errors
/// [`ArgError`] for a misaligned or non-host tensor.
pub unsafe fn unit_order_cpu(seq_lens: &Tensor, unit_order: &Tensor) -> Result<(), ArgError> {
    // SAFETY: the caller's contract.
    let lens = unsafe { host::slice::<i32>(seq_lens)? };
    let order = paged_attention::reference::unit_order(lens);
    // SAFETY: as above.
    unsafe { host::scatter::<i32>(unit_order, &order) }
}

/// The CPU path: the f64 reference on the host tensors, rounded to the
/// output dtype into the rows of processed requests (other rows untouched).
/// One definition for every head dim and both calls (the context call at
/// 512 included, which the GPU runs on the decode kernel's ragged path).
/// Returns the error word the GPU would hold (`count`, `flags`).
///
/// # Safety
/// Every tensor of `c` must describe live host memory as its description
/// says (the Python layer's contract); `out` must not overlap an input.
///
/// # Errors
/// [`ArgError`] for a misaligned or non-host tensor.
pub unsafe fn run_cpu(c: &AttnCall) -> Result<(u32, u32), ArgError> {
    let [t, hq, d] = c.q.dims::<3>();
    let (bs, m) = (c.page_table.shape[0], c.page_table.shape[1]);
    let result = {
        // SAFETY: the caller's contract; the slices live only in
        // this block, before `out` is written.
        // An e4m3 query becomes the output dtype's bits, element for element
        // over the same span (exact), so the strides stay the query's.
        let q_owned: Vec<u16>;
        let q = if c.q_fp8 {
            // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
            let bytes = unsafe { host::slice::<u8>(&c.q)? };
            q_owned = bytes
                .iter()
                .map(|&b| c.q_dtype.from_f64(f64::from(fp8_kv::codec::e4m3_decode(b))))
                .collect();
            &q_owned[..]
        } else {
            // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
            unsafe { host::slice::<u16>(&c.q)? }
        };
        let kv = |x: &Tensor| -> Result<HostKv<'_>, ArgError> {
            // SAFETY: as above.
            let data = match c.kv_dtype {
                // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
                KvDtype::Bf16 => KvData::Bf16(unsafe { host::slice::<u16>(x)? }),
                // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
                KvDtype::F16 => KvData::F16(unsafe { host::slice::<u16>(x)? }),
                // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
                KvDtype::E4m3 => KvData::E4m3(unsafe { host::slice::<u8>(x)? }),
            };
            Ok(HostKv {
                data,
                shape: x.dims::<4>(),
                strides: x.stride_dims::<4>(),
            })
        };
        let (k, v) = (kv(&c.k)?, kv(&c.v)?);
        // SAFETY: as above.
        let page_table = unsafe { host::slice::<i32>(&c.page_table)? };
        // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
        let seq_lens = unsafe { host::slice::<i32>(&c.seq_lens)? };
        let cu = match &c.cu_q {
            // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
            Some(cu) => unsafe { host::slice::<i32>(cu)? },
            None => &[],
        };
        let sinks = match &c.sinks {
            // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
            Some(s) => Some(unsafe { host::slice::<f32>(s)? }),
            None => None,
        };
        let input = HostInputs {
            q,
            q_dtype: c.q_dtype,
            q_shape: [t, hq, d],
            q_strides: c.q.stride_dims::<3>(),
            k,
            v,
            page_table,
            max_num_pages: m,
            page_table_stride: if bs > 1 { c.page_table.strides[0] } else { m },
            cache_seqlens: seq_lens,
            layout: match c.layout {
                Layout::Uniform(n) => HostLayout::Uniform { q_len_per_req: n },
                Layout::Ragged(max_q_len) => HostLayout::Ragged {
                    cu_seqlens_q: cu,
                    max_q_len,
                },
            },
            bmm1_scale: c.bmm1,
            bmm2_scale: c.bmm2,
            window_left: c.window,
            sinks,
        };
        if bs == 0 {
            return Ok((0, 0));
        }
        match c.interleave {
            // The rank's partial state and error word, as its interleaved
            // launch computes them (`cp::rank_partial`).
            Some(il) => paged_attention::cp::rank_partial(&input, il.rank, il.ranks),
            None => reference::attention(&input),
        }
    };
    // Rows of processed requests get the rounded result; the others keep
    // their bytes: read them, overwrite the written rows, write back.
    // SAFETY: the caller's contract (live, writable, unaliased host memory).
    let mut out = unsafe { host::gather::<u16>(&c.out)? };
    let row = hq * d;
    for (i, _) in result.written.iter().enumerate().filter(|(_, &w)| w) {
        for j in 0..row {
            out[i * row + j] = c.q_dtype.from_f64(result.out[i * row + j]);
        }
    }
    // SAFETY: as above.
    unsafe { host::scatter::<u16>(&c.out, &out)? };
    if let Some(l) = &c.lse {
        // Written rows get their LSE (natural log, f32); the others keep
        // their bytes, as in `out`.
        // SAFETY: the caller's contract (live, writable, unaliased host memory).
        let mut lse = unsafe { host::gather::<f32>(l)? };
        for (i, _) in result.written.iter().enumerate().filter(|(_, &w)| w) {
            for h in 0..hq {
                lse[i * hq + h] = result.lse[i * hq + h] as f32;
            }
        }
        // SAFETY: as above.
        unsafe { host::scatter::<f32>(l, &lse)? };
    }
    Ok((result.errors.count, result.errors.flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A contiguous host description (validation reads no memory).
    fn t(arg: &'static str, dtype: &str, shape: &[usize]) -> Tensor {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1] as i64;
        }
        Tensor::from_raw(arg, (64, dtype.into(), shape.to_vec(), strides, -1)).unwrap()
    }

    /// A context call of two requests (3 and 2 rows), `Hq` 4, `Hkv` 1.
    fn context_call(q: &str, kv: &str, d: usize) -> Result<AttnCall, ArgError> {
        let out = if q == "e4m3" { "bf16" } else { q };
        validate(
            AttnInputs {
                q: t("query", q, &[5, 4, d]),
                k: t("k_cache", kv, &[4, 1, 8, d]),
                v: t("v_cache", kv, &[4, 1, 8, d]),
                workspace: t("workspace_buffer", "u8", &[1024]),
                page_table: t("block_tables", "i32", &[2, 2]),
                seq_lens: t("seq_lens", "i32", &[2]),
                out: t("out", out, &[5, 4, d]),
                lse: None,
                cu_q: Some(t("cum_seq_lens_q", "i32", &[3])),
                cu_k: None,
                sinks: None,
                q_len_per_req: None,
                max_q_len: Some(3),
                max_seq_len: 16,
                batch_size: Some(2),
                bmm1: 0.125,
                bmm2: 1.0,
                window_left: -1,
                skip_softmax: None,
                dcp: None,
                unit_order: None,
            },
            true,
        )
    }

    #[test]
    fn context_serves_head_dim_512_where_the_context_kernel_does() {
        for (q, kv) in [
            ("bf16", "bf16"),
            ("f16", "f16"),
            ("bf16", "e4m3"),
            ("f16", "u8"),
            ("e4m3", "e4m3"),
        ] {
            for d in DECODE_HEAD_DIMS {
                let c = context_call(q, kv, d).unwrap_or_else(|e| panic!("{q} {kv} D {d}: {e}"));
                assert!(
                    context_served(c.q_dtype, c.kv_dtype, d),
                    "{q} {kv} D {d}: accepted but not served by ContextKernel::launch"
                );
                assert_eq!(
                    paged_attention::context_decode_path(c.q_dtype, c.kv_dtype, d),
                    d == 512
                );
            }
        }
        for d in DECODE_HEAD_DIMS {
            let e = context_call("f16", "bf16", d).unwrap_err().to_string();
            assert!(e.contains("`k_cache`") && e.contains("dtype"), "{e}");
        }
        for d in [32, 96, 192, 1024] {
            let e = context_call("bf16", "bf16", d).unwrap_err().to_string();
            assert!(
                e.contains("`query`")
                    && e.contains(&format!(
                        "head_dim {d} is not supported (64, 128, 256, 512)"
                    )),
                "{e}"
            );
        }
    }
}

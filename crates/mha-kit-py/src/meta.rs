//! The seed's metadata helpers and the fused FP8 KV write:
//! `build_trtllm_mha_page_table`, `update_trtllm_mha_graph_metadata`,
//! `fused_fp8_set_kv_buffer`. Validation shared by both paths (the
//! launchers' rules, public argument names) and the CPU path (each family's
//! reference, bit for bit what the kernels compute).

use fp8_kv::{KvCacheDtype, KvScales};
use graph_metadata::GraphMode;

use crate::desc::{Dtype, Tensor};
use crate::error::ArgError;
use crate::host;

pub(crate) fn vector(t: &Tensor, dtype: Dtype, len: usize, what: &str) -> Result<(), ArgError> {
    t.require_dtype(&[dtype])?;
    t.require_shape(&[len], what)?;
    t.require_contiguous()
}

fn table(t: &Tensor, bs: Option<usize>, m: Option<usize>) -> Result<[usize; 2], ArgError> {
    t.require_rank(2, "[bs, max_num_pages]")?;
    t.require_dtype(&[Dtype::I32])?;
    t.require_last_contiguous()?;
    let [b, w] = t.dims::<2>();
    if w == 0 {
        return Err(t.err("max_num_pages (dim 1) must be ≥ 1"));
    }
    if bs.is_some_and(|x| x != b) || m.is_some_and(|x| x != w) {
        return Err(t.err(format!(
            "expected [bs={}, M={}] (as page_table)",
            bs.unwrap_or(b),
            m.unwrap_or(w)
        )));
    }
    Ok([b, w])
}

fn req_to_token(t: &Tensor) -> Result<(), ArgError> {
    t.require_rank(2, "[max_requests, max_context_len]")?;
    t.require_dtype(&[Dtype::I32])?;
    t.require_last_contiguous()
}

fn page_size(p: usize) -> Result<(), ArgError> {
    if p == 0 {
        Err(ArgError::new("page_size", "must be ≥ 1"))
    } else {
        Ok(())
    }
}

/// Launcher argument names → public names, for the metadata launchers.
pub const NAMES: &[(&str, &str)] = &[("max_num_pages", "page_table"), ("q_stride", "q_stride")];

/// `build_trtllm_mha_page_table`, validated.
#[derive(Debug)]
pub struct PageTableCall {
    /// `[R, W]` i32.
    pub req_to_token: Tensor,
    /// `[bs]` i64.
    pub req_pool_indices: Tensor,
    /// `[bs]` i32.
    pub cache_seqlens: Tensor,
    /// `[bs, M]` i32 (written).
    pub page_table: Tensor,
    /// `P`.
    pub page_size: usize,
    /// `([N_map] i64 map, [bs, M] i32 table)`, both or neither.
    pub swa: Option<(Tensor, Tensor)>,
}

/// Validates a page-table build.
///
/// # Errors
/// [`ArgError`] naming the argument.
pub fn validate_page_table(
    req_to_token_t: Tensor,
    req_pool_indices: Tensor,
    cache_seqlens: Tensor,
    page_table: Tensor,
    page_size_v: usize,
    swa_page_table: Option<Tensor>,
    full_to_swa: Option<Tensor>,
) -> Result<PageTableCall, ArgError> {
    req_to_token(&req_to_token_t)?;
    let [bs, m] = table(&page_table, None, None)?;
    vector(&req_pool_indices, Dtype::I64, bs, "[bs] (page_table rows)")?;
    vector(&cache_seqlens, Dtype::I32, bs, "[bs] (page_table rows)")?;
    page_size(page_size_v)?;
    let swa = match (swa_page_table, full_to_swa) {
        (None, None) => None,
        (Some(t), Some(map)) => {
            table(&t, Some(bs), Some(m))?;
            map.require_rank(1, "[N_map]")?;
            map.require_dtype(&[Dtype::I64])?;
            map.require_contiguous()?;
            if map.shape[0] == 0 {
                return Err(map.err("the full→SWA map must not be empty"));
            }
            Some((map, t))
        }
        (Some(t), None) => return Err(t.err("given without full_to_swa (both or neither)")),
        (None, Some(map)) => return Err(map.err("given without swa_page_table (both or neither)")),
    };
    Ok(PageTableCall {
        req_to_token: req_to_token_t,
        req_pool_indices,
        cache_seqlens,
        page_table,
        page_size: page_size_v,
        swa,
    })
}

/// The CPU path of the page-table build. Returns the error word (`count`,
/// `flags`) the GPU kernel would hold.
///
/// # Safety
/// Every tensor must describe live host memory as described; outputs must
/// not overlap inputs.
///
/// # Errors
/// [`ArgError`] for a misaligned or non-host tensor.
pub unsafe fn page_table_cpu(c: &PageTableCall) -> Result<(u32, u32), ArgError> {
    let [rows, width] = c.req_to_token.dims::<2>();
    let [bs, m] = c.page_table.dims::<2>();
    // SAFETY: the caller's contract.
    let r2t = unsafe { host::gather::<i32>(&c.req_to_token)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let rpi = unsafe { host::gather::<i64>(&c.req_pool_indices)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let lens = unsafe { host::gather::<i32>(&c.cache_seqlens)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let mut pt = unsafe { host::gather::<i32>(&c.page_table)? };
    let map = match &c.swa {
        // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
        Some((map, _)) => Some(unsafe { host::gather::<i64>(map)? }),
        None => None,
    };
    let mut swa = match &c.swa {
        // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
        Some((_, t)) => Some(unsafe { host::gather::<i32>(t)? }),
        None => None,
    };
    let input = page_table::reference::HostInputs {
        req_to_token: &r2t,
        req_to_token_rows: rows,
        req_to_token_width: width,
        req_to_token_stride: width,
        req_pool_indices: &rpi,
        cache_seqlens: &lens,
        page_size: c.page_size,
        max_num_pages: m,
        full_to_swa: map.as_deref(),
        pool_slots: None,
    };
    debug_assert_eq!(rpi.len(), bs);
    let err = page_table::reference::build_page_table(
        &input,
        &mut pt,
        m,
        swa.as_mut().map(|s| (&mut s[..], m)),
    );
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    unsafe { host::scatter(&c.page_table, &pt)? };
    if let (Some((_, t)), Some(s)) = (&c.swa, &swa) {
        // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
        unsafe { host::scatter(t, s)? };
    }
    Ok((err.count, err.flags))
}

/// `q_mode` values of the seed's graph-metadata call, plus mha-kit's ragged
/// verify.
pub mod q_mode {
    /// `cu_seqlens_q` untouched.
    pub const NONE: i64 = 0;
    /// Seed: `cu_seqlens_q = [0, cumsum(qlens)]` with `cache_seqlens = seq_lens
    /// + seqlen_offset` (not supported: see [`RAGGED_VERIFY`]).
    pub const CUMSUM: i64 = 1;
    /// `cu_seqlens_q[i] = i · q_stride`.
    pub const STRIDED: i64 = 2;
    /// mha-kit: ragged verify, `cache_seqlens = seq_lens + qlens` and
    /// `cu_seqlens_q = [0, cumsum(qlens)]`, `qlens` clamped into
    /// `[0, q_stride]` (`q_stride` = the attention call's `max_q_len`).
    pub const RAGGED_VERIFY: i64 = 3;
}

/// The graph mode of the seed's `(seqlen_offset, q_mode, q_stride)`, and
/// whether `cu_seqlens_q` is written.
///
/// # Errors
/// [`ArgError`] for a combination the fused kernel does not compute.
pub fn graph_mode(
    seqlen_offset: i64,
    mode: i64,
    q_stride: i64,
) -> Result<(GraphMode, bool), ArgError> {
    let stride = || {
        u32::try_from(q_stride)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| {
                ArgError::new(
                    "q_stride",
                    format!("{q_stride} (must be ≥ 1 with this q_mode)"),
                )
            })
    };
    match mode {
        q_mode::NONE => match seqlen_offset {
            0 => Ok((GraphMode::Decode, false)),
            o if o > 0 => u32::try_from(o - 1)
                .map(|step| (GraphMode::DraftDecode { step }, false))
                .map_err(|_| ArgError::new("seqlen_offset", format!("{o} is too large"))),
            o => Err(ArgError::new("seqlen_offset", format!("{o} (must be ≥ 0)"))),
        },
        q_mode::STRIDED => {
            let s = stride()?;
            match seqlen_offset {
                0 => Ok((GraphMode::DraftExtendV2 { q_len: s }, true)),
                o if o == i64::from(s) => Ok((GraphMode::TargetVerify { q_len: s }, true)),
                o => Err(ArgError::new(
                    "seqlen_offset",
                    format!("{o} with q_mode=STRIDED: the fused kernel supports 0 (draft extend) or q_stride = {s} (target verify)"),
                )),
            }
        }
        q_mode::RAGGED_VERIFY => {
            if seqlen_offset != 0 {
                return Err(ArgError::new(
                    "seqlen_offset",
                    format!("{seqlen_offset} with q_mode=RAGGED_VERIFY (qlens are the offsets; pass 0)"),
                ));
            }
            Ok((GraphMode::RaggedVerify { max_q_len: stride()? }, true))
        }
        q_mode::CUMSUM => Err(ArgError::new(
            "q_mode",
            "Q_MODE_CUMSUM (cache_seqlens = seq_lens + seqlen_offset with cumsum(qlens)) is not \
             computed by mha-kit's fused kernel; ragged verify is q_mode=mha_kit.Q_MODE_RAGGED_VERIFY \
             (cache_seqlens = seq_lens + qlens)",
        )),
        m => Err(ArgError::new("q_mode", format!("{m} (0 NONE, 2 STRIDED, 3 RAGGED_VERIFY)"))),
    }
}

/// `update_trtllm_mha_graph_metadata`, validated (views already cut to
/// `bs` rows / `max_seq_pages` columns by the Python layer).
#[derive(Debug)]
pub struct GraphCall {
    /// Mode.
    pub mode: GraphMode,
    /// `[bs]` i64.
    pub req_pool_indices: Tensor,
    /// `[bs]` i64.
    pub seq_lens: Tensor,
    /// `[R, W]` i32.
    pub req_to_token: Tensor,
    /// `[bs]` i32 (written).
    pub cache_seqlens: Tensor,
    /// `[bs + 1]` i32 (written).
    pub cu_seqlens_k: Tensor,
    /// `[bs + 1]` i32 (written) when the mode writes it.
    pub cu_seqlens_q: Option<Tensor>,
    /// `[bs]` i32 (ragged verify).
    pub qlens: Option<Tensor>,
    /// `[bs, M]` i32 (written).
    pub page_table: Tensor,
    /// `P`.
    pub page_size: usize,
    /// `[N_map]` i64.
    pub swa_mapping: Option<Tensor>,
    /// `[bs, M]` i32 (written).
    pub swa_page_table: Option<Tensor>,
    /// `[n_out]` i64.
    pub out_cache_loc: Option<Tensor>,
    /// `[n_swa]` i64 (written).
    pub swa_out_cache_loc: Option<Tensor>,
}

impl GraphCall {
    /// Every tensor of the update (for the device checks).
    pub fn tensors(&self) -> Vec<&Tensor> {
        let mut ts = vec![
            &self.req_pool_indices,
            &self.seq_lens,
            &self.req_to_token,
            &self.cache_seqlens,
            &self.cu_seqlens_k,
            &self.page_table,
        ];
        ts.extend(
            self.cu_seqlens_q
                .iter()
                .chain(&self.qlens)
                .chain(&self.swa_mapping)
                .chain(&self.swa_page_table)
                .chain(&self.out_cache_loc)
                .chain(&self.swa_out_cache_loc),
        );
        ts
    }
}

/// Validates a graph-metadata update.
///
/// # Errors
/// [`ArgError`] naming the argument.
#[allow(clippy::too_many_arguments)]
pub fn validate_graph(
    mode: GraphMode,
    writes_cu_q: bool,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    req_to_token_t: Tensor,
    cache_seqlens: Tensor,
    cu_seqlens_k: Tensor,
    page_table: Tensor,
    page_size_v: usize,
    swa_mapping: Option<Tensor>,
    swa_page_table: Option<Tensor>,
    out_cache_loc: Option<Tensor>,
    swa_out_cache_loc: Option<Tensor>,
    cu_seqlens_q: Option<Tensor>,
    qlens: Option<Tensor>,
) -> Result<GraphCall, ArgError> {
    let [bs, m] = table(&page_table, None, None)?;
    vector(&req_pool_indices, Dtype::I64, bs, "[bs]")?;
    vector(&seq_lens, Dtype::I64, bs, "[bs]")?;
    req_to_token(&req_to_token_t)?;
    vector(&cache_seqlens, Dtype::I32, bs, "[bs]")?;
    vector(&cu_seqlens_k, Dtype::I32, bs + 1, "[bs + 1]")?;
    page_size(page_size_v)?;
    let cu_q = match (writes_cu_q, cu_seqlens_q) {
        (true, Some(t)) => {
            vector(&t, Dtype::I32, bs + 1, "[bs + 1]")?;
            Some(t)
        }
        (true, None) => {
            return Err(ArgError::new(
                "cu_seqlens_q",
                "required by this q_mode (it is written)",
            ))
        }
        // NONE: the buffer is not touched (seed semantics).
        (false, _) => None,
    };
    let ragged = matches!(mode, GraphMode::RaggedVerify { .. });
    let qlens = match (ragged, qlens) {
        (true, Some(q)) => {
            vector(&q, Dtype::I32, bs, "[bs]")?;
            Some(q)
        }
        (true, None) => return Err(ArgError::new("qlens", "required with q_mode=RAGGED_VERIFY")),
        (false, _) => None,
    };
    if let Some(t) = &swa_page_table {
        table(t, Some(bs), Some(m))?;
    }
    if let Some(t) = &out_cache_loc {
        t.require_rank(1, "[n_out]")?;
        t.require_dtype(&[Dtype::I64])?;
        t.require_contiguous()?;
    }
    if let Some(t) = &swa_out_cache_loc {
        t.require_rank(1, "[n_swa]")?;
        t.require_dtype(&[Dtype::I64])?;
        t.require_contiguous()?;
    }
    match &swa_mapping {
        Some(map) => {
            map.require_rank(1, "[N_map]")?;
            map.require_dtype(&[Dtype::I64])?;
            map.require_contiguous()?;
            if map.shape[0] == 0 {
                return Err(map.err("the full→SWA map must not be empty"));
            }
            if swa_page_table.is_none() && swa_out_cache_loc.is_none() {
                return Err(map.err("needs swa_page_table or swa_out_cache_loc to fill"));
            }
        }
        None => {
            if let Some(t) = swa_page_table.as_ref().or(swa_out_cache_loc.as_ref()) {
                return Err(t.err("given without swa_mapping"));
            }
        }
    }
    Ok(GraphCall {
        mode,
        req_pool_indices,
        seq_lens,
        req_to_token: req_to_token_t,
        cache_seqlens,
        cu_seqlens_k,
        cu_seqlens_q: cu_q,
        qlens,
        page_table,
        page_size: page_size_v,
        swa_mapping,
        swa_page_table,
        out_cache_loc,
        swa_out_cache_loc,
    })
}

/// The CPU path of the graph-metadata update.
///
/// # Safety
/// As [`page_table_cpu`].
///
/// # Errors
/// As [`page_table_cpu`].
pub unsafe fn graph_cpu(c: &GraphCall) -> Result<(u32, u32), ArgError> {
    let [rows, width] = c.req_to_token.dims::<2>();
    let [bs, m] = c.page_table.dims::<2>();
    if bs == 0 {
        return Ok((0, 0));
    }
    // SAFETY: the caller's contract.
    let g = |t: &Tensor| unsafe { host::gather::<i32>(t) };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let g64 = |t: &Tensor| unsafe { host::gather::<i64>(t) };
    let r2t = g(&c.req_to_token)?;
    let rpi = g64(&c.req_pool_indices)?;
    let lens = g64(&c.seq_lens)?;
    let map = c.swa_mapping.as_ref().map(g64).transpose()?;
    let loc = c.out_cache_loc.as_ref().map(g64).transpose()?;
    let qlens = c.qlens.as_ref().map(g).transpose()?;
    let input = graph_metadata::reference::HostInputs {
        mode: c.mode,
        req_pool_indices: &rpi,
        seq_lens: &lens,
        req_to_token: &r2t,
        req_to_token_rows: rows,
        req_to_token_width: width,
        req_to_token_stride: width,
        page_size: c.page_size,
        pool_slots: None,
        swa_mapping: map.as_deref(),
        out_cache_loc: loc.as_deref(),
        qlens: qlens.as_deref(),
    };
    let mut out = graph_metadata::reference::HostOutputs {
        cache_seqlens: g(&c.cache_seqlens)?,
        cu_seqlens_k: g(&c.cu_seqlens_k)?,
        cu_seqlens_q: c.cu_seqlens_q.as_ref().map(g).transpose()?,
        max_num_pages: m,
        page_table: g(&c.page_table)?,
        page_table_stride: m,
        swa_page_table: c.swa_page_table.as_ref().map(g).transpose()?,
        swa_page_table_stride: m,
        swa_out_cache_loc: c.swa_out_cache_loc.as_ref().map(g64).transpose()?,
    };
    let err = graph_metadata::reference::update_graph_metadata(&input, &mut out);
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    unsafe {
        host::scatter(&c.cache_seqlens, &out.cache_seqlens)?;
        host::scatter(&c.cu_seqlens_k, &out.cu_seqlens_k)?;
        host::scatter(&c.page_table, &out.page_table)?;
        if let (Some(t), Some(v)) = (&c.cu_seqlens_q, &out.cu_seqlens_q) {
            host::scatter(t, v)?;
        }
        if let (Some(t), Some(v)) = (&c.swa_page_table, &out.swa_page_table) {
            host::scatter(t, v)?;
        }
        if let (Some(t), Some(v)) = (&c.swa_out_cache_loc, &out.swa_out_cache_loc) {
            host::scatter(t, v)?;
        }
    }
    Ok((err.count, err.flags))
}

/// `fused_fp8_set_kv_buffer`, validated: K/V rows `[T, Hkv, D]` and caches
/// seen as `[S, Hkv, D]`.
#[derive(Debug)]
pub struct KvWriteCall {
    /// `[T, Hkv, D]` bf16/f16.
    pub k: Tensor,
    /// `[T, Hkv, D]`, as `k`.
    pub v: Tensor,
    /// `[S, Hkv, D]` e4m3 / u8.
    pub k_cache: Tensor,
    /// `[S, Hkv, D]`, as `k_cache`.
    pub v_cache: Tensor,
    /// `[T]` i64.
    pub cache_loc: Tensor,
    /// `P`.
    pub page_size: usize,
    /// The resolved scales (D8).
    pub scales: KvScales,
    /// Dtype of `k` / `v`.
    pub dtype: fp8_kv::KvDtype,
}

/// A cache `[S, Hkv, D]` or `[S/P, P, Hkv, D]` seen as `[S, Hkv, D]`.
fn cache_3d(t: Tensor, page_size: usize) -> Result<Tensor, ArgError> {
    t.require_dtype(&[Dtype::E4m3, Dtype::U8])?;
    match t.shape.len() {
        3 => Ok(t),
        4 => {
            let [pages, p, h, d] = t.dims::<4>();
            let [s0, s1, s2, s3] = t.stride_dims::<4>();
            if p != page_size {
                return Err(t.err(format!("dim 1 must be page_size = {page_size}")));
            }
            if pages > 1 && p > 0 && s0 != p * s1 {
                return Err(t.err("the page stride must be page_size × the slot stride"));
            }
            Ok(Tensor {
                shape: vec![pages * p, h, d],
                strides: vec![s1, s2, s3],
                ..t
            })
        }
        _ => Err(t.err("expected [S, Hkv, D] or [S/page_size, page_size, Hkv, D]")),
    }
}

/// K/V rows `[T, Hkv, D]`, or `[T, Hkv·D]` viewed with the cache's `Hkv`, `D`.
pub(crate) fn rows_3d(t: Tensor, hkv: usize, d: usize) -> Result<Tensor, ArgError> {
    t.require_dtype(&[Dtype::Bf16, Dtype::F16])?;
    match t.shape.len() {
        3 => Ok(t),
        2 => {
            let [n, w] = t.dims::<2>();
            if w != hkv * d || (w > 1 && t.strides[1] != 1) {
                return Err(t.err(format!(
                    "a 2-D input must be [T, Hkv·D = {}] with a contiguous last dim",
                    hkv * d
                )));
            }
            Ok(Tensor {
                shape: vec![n, hkv, d],
                strides: vec![t.strides[0], d, 1],
                ..t
            })
        }
        _ => Err(t.err("expected [T, Hkv, D] or [T, Hkv·D]")),
    }
}

/// Validates a fused FP8 KV write; `k_scale` / `v_scale` are the layer's
/// scales as floats (`None` = missing), resolved by the D8 rule (each on its
/// own: missing, ≤ 0, NaN or ±∞ → 1.0).
///
/// # Errors
/// [`ArgError`] naming the argument.
#[allow(clippy::too_many_arguments)]
pub fn validate_kv_write(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_loc: Tensor,
    k_scale: Option<f64>,
    v_scale: Option<f64>,
    page_size_v: usize,
) -> Result<KvWriteCall, ArgError> {
    page_size(page_size_v)?;
    let k_cache = cache_3d(k_cache, page_size_v)?;
    let v_cache = cache_3d(v_cache, page_size_v)?;
    if v_cache.shape != k_cache.shape {
        return Err(v_cache.err(format!(
            "shape must be k_cache's {:?} (as [S, Hkv, D])",
            k_cache.shape
        )));
    }
    for c in [&k_cache, &v_cache] {
        c.require_last_contiguous()?;
    }
    let [slots, hkv, d] = k_cache.dims::<3>();
    if hkv == 0 || d == 0 {
        return Err(k_cache.err("num_kv_heads and head_dim must be ≥ 1"));
    }
    if slots % page_size_v != 0 {
        return Err(k_cache.err(format!(
            "{slots} slots is not a multiple of page_size {page_size_v}"
        )));
    }
    let k = rows_3d(k, hkv, d)?;
    let v = rows_3d(v, hkv, d)?;
    if v.dtype != k.dtype {
        return Err(v.err(format!("dtype must be k's ({})", k.dtype.name())));
    }
    let n = k.shape[0];
    k.require_shape(&[n, hkv, d], "[T, Hkv, D] (the cache's Hkv, D)")?;
    v.require_shape(&[n, hkv, d], "as k")?;
    k.require_last_contiguous()?;
    v.require_last_contiguous()?;
    vector(&cache_loc, Dtype::I64, n, "[T] (k's tokens)")?;
    let dtype = if k.dtype == Dtype::Bf16 {
        fp8_kv::KvDtype::Bf16
    } else {
        fp8_kv::KvDtype::F16
    };
    let scales = KvScales::from_values(
        KvCacheDtype::Fp8E4m3,
        k_scale.map(|x| x as f32),
        v_scale.map(|x| x as f32),
    );
    Ok(KvWriteCall {
        k,
        v,
        k_cache,
        v_cache,
        cache_loc,
        page_size: page_size_v,
        scales,
        dtype,
    })
}

/// The CPU path of the fused FP8 write (bit for bit the kernel's bytes).
///
/// # Safety
/// As [`page_table_cpu`].
///
/// # Errors
/// As [`page_table_cpu`].
pub unsafe fn kv_write_cpu(c: &KvWriteCall) -> Result<(u32, u32), ArgError> {
    let [n, hkv, d] = c.k.dims::<3>();
    // SAFETY: the caller's contract.
    let k = unsafe { host::gather::<u16>(&c.k)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let v = unsafe { host::gather::<u16>(&c.v)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let loc = unsafe { host::gather::<i64>(&c.cache_loc)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let mut kc = unsafe { host::gather::<u8>(&c.k_cache)? };
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    let mut vc = unsafe { host::gather::<u8>(&c.v_cache)? };
    let slots = c.k_cache.shape[0];
    let w = fp8_kv::reference::HostWrite {
        cache_loc: &loc,
        num_kv_heads: hkv,
        head_dim: d,
        k: fp8_kv::reference::HostRows {
            data: &k,
            token_stride: hkv * d,
            head_stride: d,
        },
        v: fp8_kv::reference::HostRows {
            data: &v,
            token_stride: hkv * d,
            head_stride: d,
        },
    };
    debug_assert_eq!(loc.len(), n);
    let cache = |data| fp8_kv::reference::HostCache {
        data,
        slots,
        slot_stride: hkv * d,
        head_stride: d,
    };
    let err = fp8_kv::reference::fused_fp8_set_kv_buffer(
        &w,
        c.dtype,
        &c.scales,
        &mut cache(&mut kc),
        &mut cache(&mut vc),
    );
    // SAFETY: the caller's contract: host tensors the Python layer describes, live for the call.
    unsafe {
        host::scatter(&c.k_cache, &kc)?;
        host::scatter(&c.v_cache, &vc)?;
    }
    Ok((err.count, err.flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_modes_map_to_graph_modes() {
        assert_eq!(graph_mode(0, 0, 0).unwrap(), (GraphMode::Decode, false));
        assert_eq!(
            graph_mode(3, 0, 0).unwrap(),
            (GraphMode::DraftDecode { step: 2 }, false)
        );
        assert_eq!(
            graph_mode(0, 2, 4).unwrap(),
            (GraphMode::DraftExtendV2 { q_len: 4 }, true)
        );
        assert_eq!(
            graph_mode(4, 2, 4).unwrap(),
            (GraphMode::TargetVerify { q_len: 4 }, true)
        );
        assert_eq!(
            graph_mode(0, 3, 5).unwrap(),
            (GraphMode::RaggedVerify { max_q_len: 5 }, true)
        );
        for (o, m, s) in [
            (0, 1, 0),
            (2, 2, 4),
            (-1, 0, 0),
            (0, 2, 0),
            (1, 3, 4),
            (0, 9, 1),
        ] {
            assert!(graph_mode(o, m, s).is_err(), "{o} {m} {s}");
        }
    }
}

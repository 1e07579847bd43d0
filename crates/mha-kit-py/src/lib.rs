//! # mha-kit-py
//!
//! The native half of the Python package `mha_kit` (module `mha_kit._native`,
//! PyO3, abi3 for CPython ≥ 3.9, built by maturin): the FlashInfer-shaped
//! calls of the seed's TRT-LLM MHA backend over mha-kit's kernel crates.
//!
//! The Python layer (`python/mha_kit`) describes each tensor as
//! `(data_ptr, dtype, shape, strides, device)` ([`desc::Desc`]) and
//! passes torch's current stream handle. Here every call is validated once
//! for both paths ([`attn`], [`meta`]: the launchers' rules, errors naming the
//! public argument with its shape, strides and dtype), then runs
//!
//! - on CUDA tensors: the launchers' `launch_on` on the engine's memory
//!   ([`kernel_rt::ExternalBuffer`], zero copy) and stream ([`cuda`]); no
//!   allocation, no copy, no synchronisation after a family's first call;
//! - on host tensors: the kernel crates' CPU references ([`attn::run_cpu`],
//!   [`meta`]), in place, so every function's semantics runs without a GPU.
//!
//! Errors become `mha_kit.InvalidArgument` (a `ValueError`) or
//! `mha_kit.DeviceError` (a `RuntimeError`); a panic (a bug) is caught and
//! raised as `DeviceError` too, never an abort.

pub mod attn;
pub mod cuda;
pub mod desc;
pub mod error;
pub mod exchange;
pub mod host;
pub mod merge;
pub mod meta;
pub mod paged_write;
pub mod probe;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::desc::{common_device, Desc, Device, Tensor};
use crate::error::{CallError, CallResult};

pyo3::create_exception!(
    _native,
    InvalidArgument,
    pyo3::exceptions::PyValueError,
    "Bad input to an mha_kit function: the message names the argument, its shape, strides and dtype."
);
pyo3::create_exception!(
    _native,
    DeviceError,
    pyo3::exceptions::PyRuntimeError,
    "No GPU, a kernel module that does not load, or a CUDA driver failure."
);

fn to_py(e: CallError) -> PyErr {
    match e {
        CallError::Arg(a) => InvalidArgument::new_err(a.to_string()),
        CallError::Device(s) => DeviceError::new_err(s),
    }
}

/// Runs `f`, turning its error and any panic into a Python exception.
fn guard<T>(f: impl FnOnce() -> CallResult<T>) -> PyResult<T> {
    let t0 = probe::start();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    probe::end_call(t0);
    match r {
        Ok(r) => r.map_err(to_py),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(DeviceError::new_err(format!(
                "mha_kit internal error (please report): {msg}"
            )))
        }
    }
}

fn t(arg: &'static str, raw: Desc) -> CallResult<Tensor> {
    Ok(Tensor::from_desc(arg, raw)?)
}

fn opt(arg: &'static str, raw: Option<Desc>) -> CallResult<Option<Tensor>> {
    Ok(Tensor::opt(arg, raw)?)
}

/// `(count, flags)` of the call's device error word on the CPU path; `None`
/// on the GPU (read it with `device_errors`).
type ErrWord = Option<(u32, u32)>;

/// `trtllm_batch_decode_with_kv_cache` (the Python layer has unpacked the
/// KV cache and permuted NHD to the HND index order).
#[pyfunction]
#[pyo3(signature = (query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
    max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks, q_len_per_req, max_q_len,
    cum_seq_lens_q, stream, lse=None, skip_softmax=None, dcp=None, unit_order=None))]
#[allow(clippy::too_many_arguments)]
fn decode(
    py: Python<'_>,
    query: Desc,
    k_cache: Desc,
    v_cache: Desc,
    workspace_buffer: Desc,
    block_tables: Desc,
    seq_lens: Desc,
    out: Desc,
    max_seq_len: usize,
    bmm1_scale: f64,
    bmm2_scale: f64,
    window_left: i64,
    sinks: Option<Desc>,
    q_len_per_req: Option<usize>,
    max_q_len: Option<usize>,
    cum_seq_lens_q: Option<Desc>,
    stream: Option<u64>,
    lse: Option<Desc>,
    skip_softmax: Option<f64>,
    dcp: Option<(usize, usize)>,
    unit_order: Option<Desc>,
) -> PyResult<ErrWord> {
    let stream = resolve_stream(py, stream, query.device)?;
    guard(|| {
        let c = attn::validate(
            attn::AttnInputs {
                q: t("query", query)?,
                k: t("k_cache", k_cache)?,
                v: t("v_cache", v_cache)?,
                workspace: t("workspace_buffer", workspace_buffer)?,
                page_table: t("block_tables", block_tables)?,
                seq_lens: t("seq_lens", seq_lens)?,
                out: t("out", out)?,
                lse: opt("lse", lse)?,
                cu_q: opt("cum_seq_lens_q", cum_seq_lens_q)?,
                cu_k: None,
                sinks: opt("sinks", sinks)?,
                q_len_per_req,
                max_q_len,
                max_seq_len,
                batch_size: None,
                bmm1: bmm1_scale,
                bmm2: bmm2_scale,
                window_left,
                skip_softmax,
                dcp,
                unit_order: opt("unit_order", unit_order)?,
            },
            false,
        )?;
        match common_device(&cuda::attn_tensors(&c))? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(Some(unsafe { attn::run_cpu(&c) }?)),
            Device::Cuda(_) if probe::stubbed() => Ok(None),
            Device::Cuda(n) => cuda::decode(&c, n, stream).map(|()| None),
        }
    })
}

/// The stream to launch on: the caller's, or with `None` (the caller passed
/// tensor objects) the framework's current stream of `device` through the
/// DLPack exchange API (0 for host memory).
fn resolve_stream(py: Python<'_>, stream: Option<u64>, device: i64) -> PyResult<u64> {
    match stream {
        Some(s) => Ok(s),
        None if device >= 0 => exchange::current_stream(py, device)?.ok_or_else(|| {
            InvalidArgument::new_err(
                "argument `stream`: None needs the DLPack exchange API's current_work_stream",
            )
        }),
        None => Ok(0),
    }
}

/// `trtllm_batch_context_with_kv_cache` (KV unpacked and in HND index order).
#[pyfunction]
#[pyo3(signature = (query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
    max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv,
    window_left, sinks, stream, lse=None))]
#[allow(clippy::too_many_arguments)]
fn context(
    py: Python<'_>,
    query: Desc,
    k_cache: Desc,
    v_cache: Desc,
    workspace_buffer: Desc,
    block_tables: Desc,
    seq_lens: Desc,
    out: Desc,
    max_q_len: usize,
    max_kv_len: usize,
    bmm1_scale: f64,
    bmm2_scale: f64,
    batch_size: usize,
    cum_seq_lens_q: Desc,
    cum_seq_lens_kv: Option<Desc>,
    window_left: i64,
    sinks: Option<Desc>,
    stream: Option<u64>,
    lse: Option<Desc>,
) -> PyResult<ErrWord> {
    let stream = resolve_stream(py, stream, query.device)?;
    guard(|| {
        let c = attn::validate(
            attn::AttnInputs {
                q: t("query", query)?,
                k: t("k_cache", k_cache)?,
                v: t("v_cache", v_cache)?,
                workspace: t("workspace_buffer", workspace_buffer)?,
                page_table: t("block_tables", block_tables)?,
                seq_lens: t("seq_lens", seq_lens)?,
                out: t("out", out)?,
                lse: opt("lse", lse)?,
                cu_q: Some(t("cum_seq_lens_q", cum_seq_lens_q)?),
                cu_k: opt("cum_seq_lens_kv", cum_seq_lens_kv)?,
                sinks: opt("sinks", sinks)?,
                q_len_per_req: None,
                max_q_len: Some(max_q_len),
                max_seq_len: max_kv_len,
                batch_size: Some(batch_size),
                bmm1: bmm1_scale,
                bmm2: bmm2_scale,
                window_left,
                skip_softmax: None,
                dcp: None,
                unit_order: None,
            },
            true,
        )?;
        match common_device(&cuda::attn_tensors(&c))? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(Some(unsafe { attn::run_cpu(&c) }?)),
            Device::Cuda(_) if probe::stubbed() => Ok(None),
            Device::Cuda(n) => cuda::context(&c, n, stream).map(|()| None),
        }
    })
}

/// `build_trtllm_mha_page_table`.
#[pyfunction]
#[pyo3(signature = (req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
    swa_page_table, full_to_swa, stream))]
#[allow(clippy::too_many_arguments)]
fn build_page_table(
    req_to_token: Desc,
    req_pool_indices: Desc,
    cache_seqlens: Desc,
    page_table: Desc,
    page_size: usize,
    swa_page_table: Option<Desc>,
    full_to_swa: Option<Desc>,
    stream: u64,
) -> PyResult<ErrWord> {
    guard(|| {
        let c = meta::validate_page_table(
            t("req_to_token", req_to_token)?,
            t("req_pool_indices", req_pool_indices)?,
            t("cache_seqlens", cache_seqlens)?,
            t("page_table", page_table)?,
            page_size,
            opt("swa_page_table", swa_page_table)?,
            opt("full_to_swa", full_to_swa)?,
        )?;
        let mut ts = vec![
            &c.req_to_token,
            &c.req_pool_indices,
            &c.cache_seqlens,
            &c.page_table,
        ];
        if let Some((m, s)) = &c.swa {
            ts.extend([m, s]);
        }
        match common_device(&ts)? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(Some(unsafe { meta::page_table_cpu(&c) }?)),
            Device::Cuda(_) if probe::stubbed() => Ok(None),
            Device::Cuda(n) => cuda::page_table(&c, n, stream).map(|()| None),
        }
    })
}

/// `update_trtllm_mha_graph_metadata` (views already cut to `bs` rows).
#[pyfunction]
#[pyo3(signature = (req_pool_indices, seq_lens, req_to_token, cache_seqlens, cu_seqlens_k,
    page_table, seqlen_offset, page_size, swa_mapping, swa_page_table, out_cache_loc,
    swa_out_cache_loc, cu_seqlens_q, qlens, q_stride, q_mode, stream))]
#[allow(clippy::too_many_arguments)]
fn update_graph_metadata(
    req_pool_indices: Desc,
    seq_lens: Desc,
    req_to_token: Desc,
    cache_seqlens: Desc,
    cu_seqlens_k: Desc,
    page_table: Desc,
    seqlen_offset: i64,
    page_size: usize,
    swa_mapping: Option<Desc>,
    swa_page_table: Option<Desc>,
    out_cache_loc: Option<Desc>,
    swa_out_cache_loc: Option<Desc>,
    cu_seqlens_q: Option<Desc>,
    qlens: Option<Desc>,
    q_stride: i64,
    q_mode: i64,
    stream: u64,
) -> PyResult<ErrWord> {
    guard(|| {
        let (mode, writes_cu_q) = meta::graph_mode(seqlen_offset, q_mode, q_stride)?;
        let c = meta::validate_graph(
            mode,
            writes_cu_q,
            t("req_pool_indices", req_pool_indices)?,
            t("seq_lens", seq_lens)?,
            t("req_to_token", req_to_token)?,
            t("cache_seqlens", cache_seqlens)?,
            t("cu_seqlens_k", cu_seqlens_k)?,
            t("page_table", page_table)?,
            page_size,
            opt("swa_mapping", swa_mapping)?,
            opt("swa_page_table", swa_page_table)?,
            opt("out_cache_loc", out_cache_loc)?,
            opt("swa_out_cache_loc", swa_out_cache_loc)?,
            opt("cu_seqlens_q", cu_seqlens_q)?,
            opt("qlens", qlens)?,
        )?;
        let ts = c.tensors();
        match common_device(&ts)? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(Some(unsafe { meta::graph_cpu(&c) }?)),
            Device::Cuda(_) if probe::stubbed() => Ok(None),
            Device::Cuda(n) => cuda::graph(&c, n, stream).map(|()| None),
        }
    })
}

/// `fused_fp8_set_kv_buffer` (`k_scale` / `v_scale` as floats or `None`).
#[pyfunction]
#[pyo3(signature = (k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, stream))]
#[allow(clippy::too_many_arguments)]
fn fused_fp8_set_kv_buffer(
    k: Desc,
    v: Desc,
    k_cache: Desc,
    v_cache: Desc,
    cache_loc: Desc,
    k_scale: Option<f64>,
    v_scale: Option<f64>,
    page_size: usize,
    stream: u64,
) -> PyResult<ErrWord> {
    guard(|| {
        let c = meta::validate_kv_write(
            t("k", k)?,
            t("v", v)?,
            t("k_cache", k_cache)?,
            t("v_cache", v_cache)?,
            t("cache_loc", cache_loc)?,
            k_scale,
            v_scale,
            page_size,
        )?;
        match common_device(&[&c.k, &c.v, &c.k_cache, &c.v_cache, &c.cache_loc])? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(Some(unsafe { meta::kv_write_cpu(&c) }?)),
            Device::Cuda(_) if probe::stubbed() => Ok(None),
            Device::Cuda(n) => cuda::kv_write(&c, n, stream).map(|()| None),
        }
    })
}

/// `set_kv_buffer`: K/V rows into a 16-bit paged cache (HND index order;
/// out-of-range slots skipped and counted).
#[pyfunction]
#[pyo3(signature = (k, v, k_cache, v_cache, cache_loc, stream))]
fn set_kv_buffer(
    py: Python<'_>,
    k: Desc,
    v: Desc,
    k_cache: Desc,
    v_cache: Desc,
    cache_loc: Desc,
    stream: Option<u64>,
) -> PyResult<ErrWord> {
    let stream = resolve_stream(py, stream, k.device)?;
    guard(|| {
        let c = paged_write::validate_set_kv(
            t("k", k)?,
            t("v", v)?,
            t("k_cache", k_cache)?,
            t("v_cache", v_cache)?,
            t("cache_loc", cache_loc)?,
        )?;
        match common_device(&[&c.k, &c.v, &c.k_cache, &c.v_cache, &c.cache_loc])? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(Some(unsafe { paged_write::set_kv_cpu(&c) }?)),
            Device::Cuda(_) if probe::stubbed() => Ok(None),
            Device::Cuda(n) => cuda::set_kv(&c, n, stream).map(|()| None),
        }
    })
}

/// `merge_states` (natural-log LSE: the Python layer converts FlashInfer's
/// base 2): `v` `[T, K, H, D]`, `s` `[T, K, H]` into `out` `[T, H, D]` and
/// `lse_out` `[T, H]`, the `sinks` `[H]` joined once.
#[pyfunction]
#[pyo3(signature = (v, s, out, lse_out, sinks, stream))]
fn merge_states(
    py: Python<'_>,
    v: Desc,
    s: Desc,
    out: Desc,
    lse_out: Option<Desc>,
    sinks: Option<Desc>,
    stream: Option<u64>,
) -> PyResult<()> {
    let stream = resolve_stream(py, stream, v.device)?;
    guard(|| {
        let c = merge::validate_merge(
            t("v", v)?,
            t("s", s)?,
            t("out", out)?,
            opt("lse_out", lse_out)?,
            opt("sinks", sinks)?,
        )?;
        let mut ts = vec![&c.v, &c.s, &c.out];
        ts.extend(c.lse_out.iter().chain(&c.sinks));
        match common_device(&ts)? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(unsafe { merge::merge_cpu(&c) }?),
            Device::Cuda(_) if probe::stubbed() => Ok(()),
            Device::Cuda(n) => cuda::merge(&c, n, stream),
        }
    })
}

/// `write_decode_unit_order`: the length order of `seq_lens` (`[bs]` i32)
/// into `unit_order` (`[bs]` i32), on the GPU (one small launch on `stream`)
/// or on the host.
#[pyfunction]
#[pyo3(signature = (seq_lens, unit_order, stream))]
fn write_unit_order(
    py: Python<'_>,
    seq_lens: Desc,
    unit_order: Desc,
    stream: Option<u64>,
) -> PyResult<()> {
    let stream = resolve_stream(py, stream, seq_lens.device)?;
    guard(|| {
        let lens = t("seq_lens", seq_lens)?;
        let order = t("unit_order", unit_order)?;
        attn::validate_unit_order(&lens, &order)?;
        match common_device(&[&lens, &order])? {
            // SAFETY: host tensors described by the Python layer, alive for the call.
            Device::Cpu => Ok(unsafe { attn::unit_order_cpu(&lens, &order) }?),
            Device::Cuda(_) if probe::stubbed() => Ok(()),
            Device::Cuda(n) => cuda::write_unit_order(&lens, &order, n, stream),
        }
    })
}

/// Whether a decode launch on CUDA device `device` over `bs` requests and
/// `work_items` work items (requests · KV heads for one query row a
/// request) can read a given unit order (`stream`: torch's current stream,
/// used if the decode module loads here).
#[pyfunction]
fn decode_may_read_unit_order(
    device: usize,
    stream: u64,
    bs: usize,
    work_items: usize,
) -> PyResult<bool> {
    guard(|| cuda::may_read_unit_order(device, stream, bs, work_items))
}

/// Opens CUDA device `device` and loads every kernel module now (outside any
/// graph capture); `stream` is torch's current stream of that device.
#[pyfunction]
fn init(device: usize, stream: u64) -> PyResult<()> {
    guard(|| cuda::device(device)?.init_all(stream))
}

/// Each family's device error word on `device` as `{family: (count, flags)}`,
/// zeroed afterwards with `reset`. Synchronises the device.
#[pyfunction]
#[pyo3(signature = (device, reset=false))]
fn device_errors<'py>(py: Python<'py>, device: usize, reset: bool) -> PyResult<Bound<'py, PyDict>> {
    let words = guard(|| cuda::device(device)?.read_errors(reset))?;
    let d = PyDict::new(py);
    for (name, w) in cuda::FAMILIES.iter().zip(words) {
        d.set_item(*name, (w.count, w.flags))?;
    }
    Ok(d)
}

/// `{module: "cubin sm_90" | "cubin sm_90a" | "ptx"}` for the modules loaded
/// on `device` so far.
#[pyfunction]
fn module_sources<'py>(py: Python<'py>, device: usize) -> PyResult<Bound<'py, PyDict>> {
    let list = guard(|| Ok(cuda::device(device)?.module_sources()))?;
    let d = PyDict::new(py);
    for (m, s) in list {
        d.set_item(m, s)?;
    }
    Ok(d)
}

/// `None` when a CUDA GPU can be used, else why not (never raises).
#[pyfunction]
fn gpu_missing() -> Option<String> {
    match kernel_rt::gpu_status() {
        kernel_rt::GpuStatus::Available { .. } => None,
        kernel_rt::GpuStatus::Missing(why) => Some(why.clone()),
    }
}

/// Test / benchmark only: with `on`, CUDA-tensor calls return after
/// validation, before any device is touched ([`probe::stubbed`]).
#[pyfunction]
fn _stub_launches(on: bool) {
    probe::set_stub(on);
}

/// Host-time probes ([`probe`]): `enable` turns them on or off (`None`
/// leaves them), `reset` zeroes them; returns `(calls, native_ns, launches,
/// launch_ns)` as they were before.
#[pyfunction]
#[pyo3(signature = (enable=None, reset=false))]
fn _timing(enable: Option<bool>, reset: bool) -> (u64, u64, u64, u64) {
    probe::timing(enable, reset)
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("InvalidArgument", m.py().get_type::<InvalidArgument>())?;
    m.add("DeviceError", m.py().get_type::<DeviceError>())?;
    m.add(
        "NotExchangeable",
        m.py().get_type::<exchange::NotExchangeable>(),
    )?;
    m.add("WORKSPACE_COUNTER_BYTES", cuda::COUNTER_ELEMS * 4)?;
    m.add("Q_MODE_NONE", meta::q_mode::NONE)?;
    m.add("Q_MODE_CUMSUM", meta::q_mode::CUMSUM)?;
    m.add("Q_MODE_STRIDED", meta::q_mode::STRIDED)?;
    m.add("Q_MODE_RAGGED_VERIFY", meta::q_mode::RAGGED_VERIFY)?;
    m.add("MAX_DECODE_Q_LEN", attn::MAX_DECODE_Q_LEN)?;
    m.add("HEAD_DIMS", paged_attention::HEAD_DIMS.to_vec())?;
    m.add(
        "DECODE_HEAD_DIMS",
        paged_attention::DECODE_HEAD_DIMS.to_vec(),
    )?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(context, m)?)?;
    m.add_function(wrap_pyfunction!(build_page_table, m)?)?;
    m.add_function(wrap_pyfunction!(update_graph_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(fused_fp8_set_kv_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(merge_states, m)?)?;
    m.add_function(wrap_pyfunction!(set_kv_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(write_unit_order, m)?)?;
    m.add_function(wrap_pyfunction!(decode_may_read_unit_order, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(device_errors, m)?)?;
    m.add_function(wrap_pyfunction!(module_sources, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_missing, m)?)?;
    m.add_function(wrap_pyfunction!(_stub_launches, m)?)?;
    m.add_function(wrap_pyfunction!(_timing, m)?)?;
    m.add_function(wrap_pyfunction!(exchange::register_exchange_api, m)?)?;
    m.add_function(wrap_pyfunction!(exchange::exchange_api_registered, m)?)?;
    m.add_function(wrap_pyfunction!(exchange::_exchange_describe, m)?)?;
    Ok(())
}

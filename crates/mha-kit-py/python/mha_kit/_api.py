"""The public functions: FlashInfer's / the seed's signatures over mha-kit.

Each function takes the engine's tensors as they are (torch tensors on a CUDA
device, or torch CPU tensors / numpy arrays for the CPU path), checks them,
and either launches mha-kit's kernels on torch's current stream (CUDA) or
runs the kernel crates' f64 CPU references in place (host memory). Inside a
call: no allocation, no copy, no synchronisation (``out=None`` allocates the
output *before* the call, as FlashInfer does; pass ``out`` to avoid it).

Under ``torch.compile`` the calls go through the ``torch.library`` custom ops
``mha_kit::*`` (see ``_torch_ops``), which have fake implementations; in
eager mode (and under CUDA-graph capture) they call the native module
directly, saving the dispatcher's overhead.
"""

import sys

from . import _native, _tensor
from ._tensor import (InvalidArgument, describe, host_int, maybe, permute, select, head, scalar,
                      scale, stream_of)

Q_MODE_NONE = _native.Q_MODE_NONE
Q_MODE_CUMSUM = _native.Q_MODE_CUMSUM
Q_MODE_STRIDED = _native.Q_MODE_STRIDED
Q_MODE_RAGGED_VERIFY = _native.Q_MODE_RAGGED_VERIFY


def _compiling():
    """Whether torch.compile is tracing (replaced by ``torch.compiler.is_compiling``
    when the torch ops are registered, which dynamo evaluates to True)."""
    return False


# torch.ops.mha_kit, set by _torch_ops when torch is importable (a global,
# so that torch.compile traces no import).
_TORCH_OPS = None


def _ops():
    if _TORCH_OPS is None:
        raise RuntimeError("mha_kit: torch.compile needs the torch custom ops (import torch first)")
    return _TORCH_OPS


def _split_kv(kv_cache, name="kv_cache"):
    """``(k, v)`` from a pair, or from one ``[num_pages, 1 | 2, ...]`` tensor."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise InvalidArgument(f"argument `{name}`: expected (k_cache, v_cache), got {len(kv_cache)} items")
        return kv_cache[0], kv_cache[1]
    shape = tuple(kv_cache.shape)
    if len(shape) != 5 or shape[1] not in (1, 2):
        raise InvalidArgument(
            f"argument `{name}`: a single tensor must be [num_pages, 1 or 2, ...] (5 dims), "
            f"got shape {list(shape)}"
        )
    if shape[1] == 1:
        return kv_cache[:, 0], kv_cache[:, 0]
    return kv_cache[:, 0], kv_cache[:, 1]


def _kv_descs(k_cache, v_cache, kv_layout, writable=False):
    k = describe(k_cache, "k_cache", writable)
    v = describe(v_cache, "v_cache", writable)
    if kv_layout == "NHD":
        if len(k[2]) == 4:
            k = permute(k, (0, 2, 1, 3))
        if len(v[2]) == 4:
            v = permute(v, (0, 2, 1, 3))
    elif kv_layout != "HND":
        raise InvalidArgument(f"argument `kv_layout`: {kv_layout!r} (expected 'HND' or 'NHD')")
    return k, v


def _sinks(sinks):
    if isinstance(sinks, (list, tuple)):
        if len(sinks) != 1:
            raise InvalidArgument(f"argument `sinks`: expected one tensor, got a list of {len(sinks)}")
        return sinks[0]
    return sinks


def _is_fp8(x):
    """Whether ``x`` holds float8_e4m3fn values (torch or ml_dtypes/numpy)."""
    return str(getattr(x, "dtype", "")).endswith("float8_e4m3fn")


def _dtype_name(dt):
    """``bfloat16`` for ``torch.bfloat16``, ``np.float16``, ``ml_dtypes.bfloat16``, …"""
    s = str(dt)
    if s.startswith("torch."):
        return s[6:]
    try:
        import numpy as np

        return np.dtype(dt).name
    except TypeError:
        return s


def _out(query, out, out_dtype):
    fp8 = _is_fp8(query)
    if out_dtype is not None and out_dtype != query.dtype:
        if not (fp8 and _dtype_name(out_dtype) in ("bfloat16", "float16")):
            raise InvalidArgument(
                f"argument `out_dtype`: {out_dtype} (the query's dtype {query.dtype}, or "
                "bfloat16 / float16 with a float8_e4m3fn query)"
            )
    if out is None:
        if fp8 and out_dtype is None:
            raise InvalidArgument(
                f"argument `out_dtype`: None with a float8_e4m3fn query of shape "
                f"{list(query.shape)}: pass bfloat16 or float16 (the kernels write no FP8 output)"
            )
        dtype = query.dtype if out_dtype is None else out_dtype
        if sys.modules.get("torch") is not None and hasattr(query, "new_empty"):
            return query.new_empty(query.shape, dtype=dtype)
        import numpy as np

        return np.empty(query.shape, dtype=dtype)
    return out


#: ``log2(e)``: mha-kit's kernels write the natural-log LSE; FlashInfer's
#: calls return it in base 2 (its convention for every backend).
LOG2E = 1.4426950408889634

#: The decode split counters at the end of ``workspace_buffer`` (bytes),
#: which a cast query must never overwrite (the native side's constant).
_COUNTER_BYTES = _native.WORKSPACE_COUNTER_BYTES


def _lse_buffer(query, lse, return_lse):
    """The LSE output: the caller's ``lse``, or with ``return_lse`` a new
    ``[num_tokens, num_qo_heads]`` float32 buffer (allocated before the call,
    as FlashInfer does)."""
    if lse is not None or not return_lse:
        return lse
    return _new(query, (query.shape[0], query.shape[1]), "float32")


def _lse_to_base2(lse):
    """Natural log → base 2, in place (on the tensor's stream for CUDA)."""
    if hasattr(lse, "mul_"):
        lse.mul_(LOG2E)
    else:
        lse *= LOG2E


def _cast_query(query, out, workspace_buffer):
    """An e4m3 CUDA query cast exactly (every e4m3 value is a bf16 / f16
    value) into ``out``'s dtype: in the head of ``workspace_buffer`` when it
    fits below the split counters, else a new tensor. Returns the query to
    launch with and the workspace the decode kernel may use (the rest).

    Host arrays are passed through: the native CPU path reads e4m3 itself.
    """
    if not (_is_fp8(query) and getattr(query, "is_cuda", False)):
        return query, workspace_buffer
    need = query.numel() * 2
    head = (need + 255) // 256 * 256
    ws = workspace_buffer
    if (getattr(ws, "is_cuda", False) and ws.device == query.device and ws.is_contiguous()
            and ws.numel() * ws.element_size() >= head + _COUNTER_BYTES
            and out.dtype.itemsize == 2):
        import torch

        raw = ws.reshape(-1).view(torch.uint8)
        q16 = raw[:need].view(out.dtype).view(query.shape)
        q16.copy_(query)
        return q16, raw[head:]
    return query.to(out.dtype), workspace_buffer


_BACKENDS = ("auto", "xqa", "trtllm-gen")


def _is_default(value, ok):
    """Whether ``value`` is the default ``ok`` (``None`` by identity, so that
    an array or tensor argument never goes through ``!=``, whose elementwise
    result has no truth value)."""
    if ok is None:
        return value is None
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()  # a numpy scalar or 0-d array / tensor
    if isinstance(value, (bool, int, float)):
        return value == ok
    return False


def _unsupported(**kw):
    for name, (value, ok) in kw.items():
        if not _is_default(value, ok):
            plain = isinstance(value, (bool, int, float, str))
            shown = repr(value) if plain else f"a {type(value).__name__}"
            raise InvalidArgument(f"argument `{name}`: {shown} is not supported (only {ok!r})")


_TRANSFORM_MODES = (None, "k_only", "separate_kv")


def _decode_extras(kv_cache_sf, uses_shared_paged_kv_idx, bmm1_scale_log2,
                   enable_block_sparse_attention, bf16q_fp8kv_transform_mode):
    """Checks upstream's later decode keywords (off the hot path)."""
    _unsupported(kv_cache_sf=(kv_cache_sf, None),
                 uses_shared_paged_kv_idx=(uses_shared_paged_kv_idx, True),
                 bmm1_scale_log2=(bmm1_scale_log2, None),
                 enable_block_sparse_attention=(enable_block_sparse_attention, False))
    if bf16q_fp8kv_transform_mode not in _TRANSFORM_MODES:
        raise InvalidArgument(
            f"argument `bf16q_fp8kv_transform_mode`: {bf16q_fp8kv_transform_mode!r} "
            "(None, 'k_only' or 'separate_kv')"
        )


def _decode_impl(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                 max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks, q_len_per_req,
                 max_q_len, cum_seq_lens_q, kv_layout, lse=None, skip=None, dcp=None,
                 unit_order=None):
    if lse is not None or query.dtype != out.dtype:
        # Off the hot path: an e4m3 query cast into the workspace, the LSE
        # converted to FlashInfer's base 2 after the launch.
        query, workspace_buffer = _cast_query(query, out, workspace_buffer)
        r = _decode_native(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens,
                           out, max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks,
                           q_len_per_req, max_q_len, cum_seq_lens_q, kv_layout, lse, skip, dcp,
                           unit_order)
        if lse is not None:
            _lse_to_base2(lse)
        return r
    return _decode_native(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                          max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks, q_len_per_req,
                          max_q_len, cum_seq_lens_q, kv_layout, None, skip, dcp, unit_order)


def _decode_native(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                   max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks, q_len_per_req,
                   max_q_len, cum_seq_lens_q, kv_layout, lse, skip, dcp=None, unit_order=None):
    # The eager hot path (issue 15). With the DLPack exchange API the native
    # side reads the tensors itself (and torch's current stream: `None`);
    # anything it cannot read comes back as NotExchangeable before any
    # launch, and takes the descriptions below.
    if _tensor.EXCHANGE and kv_layout == "HND":
        try:
            return _native.decode(
                query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                int(max_seq_len), float(bmm1_scale), float(bmm2_scale), int(window_left),
                sinks, None if q_len_per_req is None else int(q_len_per_req),
                None if max_q_len is None else int(max_q_len), cum_seq_lens_q, None, lse, skip,
                dcp, unit_order,
            )
        except _native.NotExchangeable:
            pass
    # Descriptions: one describe per tensor, no helper calls for absent
    # optionals, the layout handled only when it is NHD.
    q = describe(query, "query")
    if kv_layout == "HND":
        k = describe(k_cache, "k_cache")
        v = describe(v_cache, "v_cache")
    else:
        k, v = _kv_descs(k_cache, v_cache, kv_layout)
    return _native.decode(
        q, k, v,
        describe(workspace_buffer, "workspace_buffer", True),
        describe(block_tables, "block_tables"),
        describe(seq_lens, "seq_lens"),
        describe(out, "out", True),
        int(max_seq_len), float(bmm1_scale), float(bmm2_scale), int(window_left),
        None if sinks is None else describe(sinks, "sinks"),
        None if q_len_per_req is None else int(q_len_per_req),
        None if max_q_len is None else int(max_q_len),
        None if cum_seq_lens_q is None else describe(cum_seq_lens_q, "cum_seq_lens_q"),
        stream_of(q),
        maybe(lse, "lse", True),
        skip,
        dcp,
        maybe(unit_order, "unit_order"),
    )


def trtllm_batch_decode_with_kv_cache(
    query,
    kv_cache,
    workspace_buffer,
    block_tables,
    seq_lens,
    max_seq_len,
    bmm1_scale=1.0,
    bmm2_scale=1.0,
    window_left=-1,
    out=None,
    out_dtype=None,
    o_sf_scale=None,
    o_sf_vec_size=None,
    sinks=None,
    kv_layout="HND",
    enable_pdl=None,
    backend="auto",
    q_len_per_req=1,
    o_scale=1.0,
    mask=None,
    max_q_len=None,
    cum_seq_lens_q=None,
    skip_softmax_threshold_scale_factor=None,
    kv_cache_sf=None,
    uses_shared_paged_kv_idx=True,
    lse=None,
    return_lse=False,
    bmm1_scale_log2=None,
    multi_ctas_kv_counter_buffer=None,
    enable_block_sparse_attention=False,
    bf16q_fp8kv_transform_mode=None,
    dcp_rank=0,
    dcp_world_size=1,
    unit_order=None,
):
    """Decode / speculative verify attention over a paged KV cache.

    FlashInfer's signature (``flashinfer.decode``); for request ``i`` with
    ``n_i`` query rows and KV length ``L_i = seq_lens[i]``, row ``j`` sits at
    position ``x = L_i - n_i + j`` and attends causally to keys
    ``max(0, x - window_left) ..= x`` (all of ``0 ..= x`` when
    ``window_left = -1``); query head ``h`` reads KV head ``h // (Hq // Hkv)``.

    Args:
        query: ``[num_tokens, Hq, D]`` bfloat16 / float16, or float8_e4m3fn
            (the seed casts the query for FP8 caches; its values are used
            exactly, any query scale belongs in ``bmm1_scale``; a CUDA query
            is cast into ``out``'s dtype in the head of ``workspace_buffer``
            when it fits, else into a new tensor); ``D`` 64, 128, 256 or 512
            (``DECODE_HEAD_DIMS``); last dim contiguous.
        kv_cache: ``(k_cache, v_cache)``, each ``[num_pages, Hkv, P, D]``
            (``kv_layout="HND"``) or ``[num_pages, P, Hkv, D]`` (``"NHD"``),
            any strides with a contiguous last dim; or one tensor
            ``[num_pages, 2, ...]``. dtype: the query's, or float8_e4m3fn /
            uint8 (e4m3 bytes; the FP8 scales go into ``bmm1_scale`` /
            ``bmm2_scale``). ``Hq / Hkv`` must be an integer ≤ 16.
        workspace_buffer: scratch for split-KV partials, any dtype,
            contiguous, 16-byte aligned, **zeroed before its first use**;
            its last 256 KiB hold split counters that every call leaves zero
            (share it only with calls that do the same). A few MiB suffice;
            128 MiB (FlashInfer's usual size) lets full batches split.
        block_tables: ``[bs, max_num_pages]`` int32 page ids.
        seq_lens: ``[bs]`` int32 KV lengths, new tokens included.
        max_seq_len: upper bound on ``seq_lens``, ≥ 0; it only sizes the
            split plan (a larger length is still read whole; 0 counts as 1).
        bmm1_scale: logit scale in natural-log units (``sm_scale · k_scale``);
            a float or a one-element tensor (a CUDA one is read at call time,
            a stream sync, and refused during graph capture).
        bmm2_scale: output scale (``v_scale``).
        window_left: ``-1`` (no window) or ``W ≥ 0``.
        out: ``[num_tokens, Hq, D]`` output of the query's dtype (bfloat16 /
            float16 for an e4m3 query); allocated when ``None``. Rows of
            requests that are skipped (bad ``cum_seq_lens_q``) are left
            untouched.
        out_dtype: ``None`` or the query's dtype; bfloat16 / float16 (needed
            when ``out`` is ``None``) with an e4m3 query.
        lse: ``None`` or ``[num_tokens, Hq]`` float32, filled whether or not
            ``return_lse`` is set: each row's log-sum-exp of its logits
            ``bmm1_scale · q·k`` over the keys it sees, **base 2** (FlashInfer's
            convention: ``logsumexp · log2(e)``), a sink joined once, ``-inf``
            for a row that sees no key; rows of skipped requests hold
            unspecified values.
        return_lse: return ``(out, lse)``, allocating ``lse`` when ``None``.
        sinks: ``[Hq]`` float32 sink logits (or a one-element list of it).
        kv_layout: ``"HND"`` (default, as FlashInfer) or ``"NHD"``.
        q_len_per_req: rows per request, 1–16 (``num_tokens = bs · q_len_per_req``);
            ``None`` for ragged rows given by ``cum_seq_lens_q``.
        max_q_len: ragged rows: the bound on rows per request, 1–16.
        cum_seq_lens_q: ragged rows: ``[bs + 1]`` int32 row offsets.
        o_sf_scale, o_sf_vec_size, o_scale, mask, enable_pdl, backend:
            accepted for compatibility; only ``None`` / ``1.0`` / ``None``
            (the causal rule) are supported; ``enable_pdl`` and ``backend``
            are ignored (one implementation).
        skip_softmax_threshold_scale_factor: FlashInfer's skip-softmax
            factor ``f ≥ 0`` (``None`` or 0: exact attention, bit for bit).
            On the GPU the tensor-core decode kernel skips a 16-key slice
            when every row's logits there sit below its running maximum by
            ``ln(L / f)`` or more (``L`` the request's KV length); each output
            element stays within ``2·f·bmm2_scale·max|V|`` of exact attention
            for ``f < 1``. The CPU path computes exact attention.
        multi_ctas_kv_counter_buffer, bf16q_fp8kv_transform_mode: accepted
            and ignored, as upstream's later keywords: mha-kit keeps its split
            counters in ``workspace_buffer`` and has one kernel flavor.
        kv_cache_sf, uses_shared_paged_kv_idx, bmm1_scale_log2,
            enable_block_sparse_attention: accepted for compatibility at
            their defaults only (``None``, ``True``, ``None``, ``False``).
        dcp_rank, dcp_world_size: decode context parallelism by page
            interleave (mha-kit's keywords; ``0`` and ``1``: off). Page
            ``e`` of every request lives on rank ``e mod dcp_world_size``:
            ``block_tables`` and ``seq_lens`` stay the global ones (the
            entries of the other ranks' pages are never read, whatever they
            hold), causal limits and windows are in global positions, and
            the call returns this rank's partial state — with ``lse`` or
            ``return_lse`` its base-2 log-sum-exp, ``-inf`` where the rank
            saw no key of a row (``lse`` or ``return_lse`` is required).
            ``sinks`` must be ``None`` here (they join once, in
            :func:`merge_states`). All-gather every rank's
            ``(out, lse)`` and :func:`merge_states` them into the unsplit
            result.
        unit_order: ``None`` or ``[bs]`` int32 (contiguous, on ``seq_lens``'
            device): the batch's length order, written by
            :func:`write_decode_unit_order` from these ``seq_lens``
            (mha-kit's keyword). Write it once a step and pass it to every
            layer's call: a GPU launch that orders its CTAs longest request
            first (large unsplit batches) then reads each CTA's request
            instead of ranking the batch in every CTA (FP8 conv-like batch of
            224 requests: −5.5% on an H100). Any order of ``0 .. bs`` gives
            the same bits; other contents leave rows unwritten (an entry
            outside ``[0, bs)`` is skipped and counted), so rewrite it
            whenever ``seq_lens`` changes. The CPU path does not read it.

    Returns:
        ``out``, or ``(out, lse)`` with ``return_lse``.

    Raises:
        mha_kit.InvalidArgument: bad input; the message names the argument
            with its shape, strides and dtype.
        mha_kit.DeviceError: no GPU for CUDA tensors, a module that does not
            load, a driver failure, or a family's first call during CUDA-graph
            capture (warm up first, or ``mha_kit.init()``).

    On CUDA the call is asynchronous on torch's current stream; device data
    that the host cannot check (page ids, lengths, row offsets) is
    range-checked by the kernel and counted (``mha_kit.device_errors()``).
    """
    # Hot path (issue 15): the common case is tested inline; anything else
    # takes the general helpers, which raise the same errors as before.
    if o_sf_scale is not None or o_sf_vec_size is not None or o_scale != 1.0 or mask is not None:
        _unsupported(o_sf_scale=(o_sf_scale, None), o_sf_vec_size=(o_sf_vec_size, None),
                     o_scale=(o_scale, 1.0), mask=(mask, None))
    if (kv_cache_sf is not None or uses_shared_paged_kv_idx is not True
            or bmm1_scale_log2 is not None or enable_block_sparse_attention is not False
            or bf16q_fp8kv_transform_mode is not None):
        _decode_extras(kv_cache_sf, uses_shared_paged_kv_idx, bmm1_scale_log2,
                       enable_block_sparse_attention, bf16q_fp8kv_transform_mode)
    if backend not in _BACKENDS:
        raise InvalidArgument(f"argument `backend`: {backend!r} (auto, xqa or trtllm-gen)")
    if type(kv_cache) is tuple and len(kv_cache) == 2:
        k_cache, v_cache = kv_cache
    else:
        k_cache, v_cache = _split_kv(kv_cache)
    if out is None and out_dtype is None and type(query) is _tensor._TENSOR:
        out = query.new_empty(query.shape)
    else:
        out = _out(query, out, out_dtype)
    if type(bmm1_scale) is not float:
        bmm1_scale = scale(bmm1_scale, "bmm1_scale")
    if type(bmm2_scale) is not float:
        bmm2_scale = scale(bmm2_scale, "bmm2_scale")
    if sinks is not None:
        sinks = _sinks(sinks)
    if return_lse:
        lse = _lse_buffer(query, lse, return_lse)
    skip = skip_softmax_threshold_scale_factor
    if skip is not None and type(skip) is not float:
        skip = scalar(skip, "skip_softmax_threshold_scale_factor")
    dcp = None
    if dcp_world_size != 1 or dcp_rank != 0:
        dcp = (int(dcp_rank), int(dcp_world_size))
        if min(dcp) < 0:
            raise InvalidArgument(
                f"argument `dcp_rank`: rank {dcp[0]} of dcp_world_size {dcp[1]} (0 ≤ rank < size)")
    if _compiling():
        _ops().trtllm_batch_decode(query, k_cache, v_cache, workspace_buffer, block_tables,
                                   seq_lens, out, int(max_seq_len), bmm1_scale, bmm2_scale,
                                   int(window_left), sinks, q_len_per_req, max_q_len,
                                   cum_seq_lens_q, kv_layout, lse, skip,
                                   int(dcp_rank), int(dcp_world_size), unit_order)
    else:
        try:
            _decode_impl(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                         max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks, q_len_per_req,
                         max_q_len, cum_seq_lens_q, kv_layout, lse, skip, dcp, unit_order)
        except (TypeError, OverflowError):  # a host int no native integer holds: name it
            _tensor.host_ints(max_seq_len=(max_seq_len, 0), window_left=(window_left, -1),
                              q_len_per_req=(q_len_per_req or 1, 0), max_q_len=(max_q_len or 1, 0))
            raise
    return (out, lse) if return_lse else out


def write_decode_unit_order(seq_lens, unit_order=None):
    """Writes the batch's length order for :func:`trtllm_batch_decode_with_kv_cache`'s
    ``unit_order`` (mha-kit's own function).

    ``unit_order`` receives the request indices ``0 .. bs`` in descending
    order of ``ceil(seq_lens[i] / 128)`` (capped at 255; a length ≤ 0 counts
    as 0), ties by index: the order in which a large decode launch serves
    the batch's requests. Write it once a step (after ``seq_lens`` is final,
    e.g. after :func:`update_trtllm_mha_graph_metadata`) and pass it to every
    layer's decode call over the same ``seq_lens``.

    Args:
        seq_lens: ``[bs]`` int32, contiguous.
        unit_order: ``[bs]`` int32, contiguous, on the same device; allocated
            when ``None``.

    Returns:
        ``unit_order``.

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError.

    On CUDA one small launch (one CTA) on torch's current stream,
    capturable in a CUDA graph after a first eager decode or
    :func:`init`; on host tensors the definition, in place.
    """
    if unit_order is None:
        shape = tuple(getattr(seq_lens, "shape", ()))
        unit_order = _new(seq_lens, shape, None)
    if _compiling():
        _ops().write_decode_unit_order(seq_lens, unit_order)
    else:
        _unit_order_impl(seq_lens, unit_order)
    return unit_order


def _decode_may_read_unit_order(like, bs, work_items):
    """Whether a decode launch over ``bs`` requests and ``work_items`` work
    items (requests · KV heads for one row a request) on ``like``'s CUDA
    device can read a ``unit_order`` (the decode launcher's rule,
    ``PagedAttentionKernel::may_read_unit_order``); False off CUDA."""
    device = getattr(like, "device", None)
    if getattr(device, "type", None) != "cuda" or bs < 2:
        return False
    import torch

    stream = torch.cuda.current_stream(device).cuda_stream
    return _native.decode_may_read_unit_order(device.index, stream, int(bs), int(work_items))


def _unit_order_impl(seq_lens, unit_order):
    sd = describe(seq_lens, "seq_lens")
    _native.write_unit_order(sd, describe(unit_order, "unit_order", True), stream_of(sd))


def _context_impl(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                  max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q,
                  cum_seq_lens_kv, window_left, sinks, kv_layout, lse=None):
    # As _decode_impl (the workspace's head may hold the cast query; the
    # context kernel keeps its own split workspace).
    query, _ = _cast_query(query, out, workspace_buffer)
    r = _context_native(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                        max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size,
                        cum_seq_lens_q, cum_seq_lens_kv, window_left, sinks, kv_layout, lse)
    if lse is not None:
        _lse_to_base2(lse)
    return r


def _context_native(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                    max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q,
                    cum_seq_lens_kv, window_left, sinks, kv_layout, lse):
    # As _decode_native: tensors straight to the native side when it can read them.
    if _tensor.EXCHANGE and kv_layout == "HND":
        try:
            return _native.context(
                query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                int(max_q_len), int(max_kv_len), float(bmm1_scale), float(bmm2_scale),
                int(batch_size), cum_seq_lens_q, cum_seq_lens_kv, int(window_left), sinks, None,
                lse,
            )
        except _native.NotExchangeable:
            pass
    q = describe(query, "query")
    k, v = _kv_descs(k_cache, v_cache, kv_layout)
    return _native.context(
        q, k, v,
        describe(workspace_buffer, "workspace_buffer", True),
        describe(block_tables, "block_tables"),
        describe(seq_lens, "seq_lens"),
        describe(out, "out", True),
        int(max_q_len), int(max_kv_len), float(bmm1_scale), float(bmm2_scale), int(batch_size),
        describe(cum_seq_lens_q, "cum_seq_lens_q"),
        maybe(cum_seq_lens_kv, "cum_seq_lens_kv"),
        int(window_left),
        maybe(sinks, "sinks"),
        stream_of(q),
        maybe(lse, "lse", True),
    )


def trtllm_batch_context_with_kv_cache(
    query,
    kv_cache,
    workspace_buffer,
    block_tables,
    seq_lens,
    max_q_len,
    max_kv_len,
    bmm1_scale,
    bmm2_scale,
    batch_size,
    cum_seq_lens_q,
    cum_seq_lens_kv,
    window_left=-1,
    out=None,
    out_dtype=None,
    o_sf_scale=None,
    o_sf_vec_size=None,
    kv_layout="HND",
    enable_pdl=None,
    sinks=None,
    kv_cache_sf=None,
    skip_softmax_threshold_scale_factor=None,
    uses_shared_paged_kv_idx=True,
    causal=True,
    lse=None,
    return_lse=False,
    multi_ctas_kv_counter_buffer=None,
    use_fp16_softmax=None,
    uses_spcompress=None,
    backend="trtllm-gen",
    window_right=-1,
    variable_window_token_starts=None,
    variable_window_token_ends=None,
):
    """Context (prefill / chunked prefill / extend) attention over a paged KV cache.

    FlashInfer's signature (``flashinfer.prefill``). Request ``i`` owns query
    rows ``cum_seq_lens_q[i] .. cum_seq_lens_q[i+1]`` (``n_i`` of them, at most
    ``max_q_len``) and ``L_i = seq_lens[i]`` keys (its cached prefix plus the
    new tokens); row ``j`` sits at ``x = L_i - n_i + j`` and sees keys
    ``max(0, x - window_left) ..= x``, causally.

    Args:
        query: ``[total_q, Hq, D]`` bfloat16 / float16 (D 64, 128, 256 on
            the context kernels; D 512 runs the decode kernel's ragged path on
            the GPU: correct, not tuned), or float8_e4m3fn as for decode (the
            seed's context call with an FP8 cache passes one).
        kv_cache: as in :func:`trtllm_batch_decode_with_kv_cache`; dtype the
            query's or e4m3.
        workspace_buffer: the context kernel keeps its own split workspace
            (allocated once per device); this buffer only holds an e4m3
            query's cast (its head; its last 256 KiB, the decode split
            counters, are never written).
        block_tables: ``[batch_size, max_num_pages]`` int32.
        seq_lens: ``[batch_size]`` int32 KV lengths.
        max_q_len: bound on rows per request, 1..2^24.
        max_kv_len: bound on ``seq_lens``, ≥ 0 (a schedule hint only).
        bmm1_scale, bmm2_scale: as for decode (floats).
        batch_size: ``len(seq_lens)``.
        cum_seq_lens_q: ``[batch_size + 1]`` int32 row offsets.
        cum_seq_lens_kv: ``[batch_size + 1]`` int32 (shape-checked, not read).
        window_left: ``-1`` or ``W ≥ 0``.
        out: ``[total_q, Hq, D]`` of the query's dtype (bfloat16 / float16
            for an e4m3 query), or ``None``.
        out_dtype: as for decode.
        sinks: ``[Hq]`` float32.
        lse, return_lse: as for decode (base 2).
        causal: must be ``True``; the other FlashInfer options (FP4
            output, KV scale factors, right windows, …) must keep their
            defaults, except ``skip_softmax_threshold_scale_factor``,
            ``multi_ctas_kv_counter_buffer`` and ``use_fp16_softmax``, which
            are accepted and ignored (exact attention, SEMANTICS.md
            §attention.9; the kernel's own split workspace; one kernel flavor).

    Returns:
        ``out``, or ``(out, lse)`` with ``return_lse``.

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError: as for decode.
    """
    _unsupported(o_sf_scale=(o_sf_scale, None), o_sf_vec_size=(o_sf_vec_size, None),
                 kv_cache_sf=(kv_cache_sf, None),
                 uses_shared_paged_kv_idx=(uses_shared_paged_kv_idx, True), causal=(causal, True),
                 uses_spcompress=(uses_spcompress, None), window_right=(window_right, -1),
                 variable_window_token_starts=(variable_window_token_starts, None),
                 variable_window_token_ends=(variable_window_token_ends, None))
    k_cache, v_cache = _split_kv(kv_cache)
    out = _out(query, out, out_dtype)
    args = (query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
            host_int(max_q_len, "max_q_len"), host_int(max_kv_len, "max_kv_len"),
            scale(bmm1_scale, "bmm1_scale"), scale(bmm2_scale, "bmm2_scale"),
            host_int(batch_size, "batch_size"), cum_seq_lens_q, cum_seq_lens_kv,
            host_int(window_left, "window_left", -(1 << 63)), _sinks(sinks), kv_layout,
            _lse_buffer(query, lse, return_lse))
    if _compiling():
        _ops().trtllm_batch_context(*args)
    else:
        _context_impl(*args)
    return (out, args[-1]) if return_lse else out


def _page_table_impl(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
                     swa_page_table, full_to_swa):
    pt = describe(page_table, "page_table", True)
    return _native.build_page_table(
        describe(req_to_token, "req_to_token"),
        describe(req_pool_indices, "req_pool_indices"),
        describe(cache_seqlens, "cache_seqlens"),
        pt, int(page_size),
        maybe(swa_page_table, "swa_page_table", True),
        maybe(full_to_swa, "full_to_swa"),
        stream_of(pt),
    )


def build_trtllm_mha_page_table(req_to_token, req_pool_indices, cache_seqlens, page_table,
                                page_size, swa_page_table=None, full_to_swa=None):
    """Fills ``page_table`` (and ``swa_page_table``) from ``req_to_token``, in place.

    The seed's helper: for row ``i`` with ``n = ceil(cache_seqlens[i] / P)``
    and ``r = req_pool_indices[i]``, ``page_table[i, p] = req_to_token[r, p·P] // P``
    for ``p < n`` (entries past ``n`` untouched); with SWA,
    ``swa_page_table[i, p] = full_to_swa[req_to_token[r, p·P]] // P``.

    Args:
        req_to_token: ``[R, W]`` int32 slots, last dim contiguous.
        req_pool_indices: ``[bs]`` int64.
        cache_seqlens: ``[bs]`` int32 KV lengths (tokens).
        page_table: ``[bs, M]`` int32, written (live prefixes).
        page_size: ``P ≥ 1`` tokens per page (any value, not only divisors of 4096).
        swa_page_table: ``[bs, M]`` int32, written; with ``full_to_swa``.
        full_to_swa: ``[N_map]`` int64 full→SWA slot map; with ``swa_page_table``.

    Rows needing more than ``M`` pages are clamped, bad request indices
    skipped, bad slots mapped to page 0 (SWA: −1 for a negative slot); each
    event is counted in the device error word, never read out of bounds.

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError.
    """
    args = (req_to_token, req_pool_indices, cache_seqlens, page_table,
            host_int(page_size, "page_size"), swa_page_table, full_to_swa)
    if _compiling():
        _ops().build_page_table(*args)
    else:
        _page_table_impl(*args)


def _graph_impl(req_pool_indices, seq_lens, req_to_token, cache_seqlens, cu_seqlens_k,
                page_table, bs, seqlen_offset, max_seq_pages, page_size, swa_mapping,
                swa_page_table, out_cache_loc, swa_out_cache_loc, cu_seqlens_q, qlens,
                q_stride, q_mode):
    pt = describe(page_table, "page_table", True)
    if len(pt[2]) != 2:
        raise InvalidArgument(f"argument `page_table`: expected [bs, M] (2 dims), shape {list(pt[2])}")
    pt = head(head(pt, bs, "page_table"), max_seq_pages, "page_table", dim=1)
    spt = maybe(swa_page_table, "swa_page_table", True)
    if spt is not None:
        spt = head(head(spt, bs, "swa_page_table"), max_seq_pages, "swa_page_table", dim=1)
    cu_q = maybe(cu_seqlens_q, "cu_seqlens_q", True)
    ql = maybe(qlens, "qlens")
    return _native.update_graph_metadata(
        head(describe(req_pool_indices, "req_pool_indices"), bs, "req_pool_indices"),
        head(describe(seq_lens, "seq_lens"), bs, "seq_lens"),
        describe(req_to_token, "req_to_token"),
        head(describe(cache_seqlens, "cache_seqlens", True), bs, "cache_seqlens"),
        head(describe(cu_seqlens_k, "cu_seqlens_k", True), bs + 1, "cu_seqlens_k"),
        pt, int(seqlen_offset), int(page_size),
        maybe(swa_mapping, "swa_mapping"),
        spt,
        maybe(out_cache_loc, "out_cache_loc"),
        maybe(swa_out_cache_loc, "swa_out_cache_loc", True),
        None if cu_q is None else head(cu_q, bs + 1, "cu_seqlens_q"),
        None if ql is None else head(ql, bs, "qlens"),
        int(q_stride), int(q_mode),
        stream_of(pt),
    )


def update_trtllm_mha_graph_metadata(
    *,
    req_pool_indices,
    seq_lens,
    req_to_token,
    cache_seqlens,
    cu_seqlens_k,
    page_table,
    bs,
    seqlen_offset,
    max_seq_pages,
    page_size,
    swa_mapping=None,
    swa_page_table=None,
    out_cache_loc=None,
    swa_out_cache_loc=None,
    cu_seqlens_q=None,
    qlens=None,
    q_stride=0,
    q_mode=Q_MODE_NONE,
):
    """One fused launch that rewrites a CUDA-graph bucket's metadata (the seed's helper).

    For ``i < bs``: ``cache_seqlens[i] = seq_lens[i] + offset``,
    ``cu_seqlens_k = [0, cumsum(cache_seqlens)]``, the page tables' live
    prefixes from ``req_to_token`` (as :func:`build_trtllm_mha_page_table`,
    clamped to ``max_seq_pages``), with ``swa_mapping`` the SWA page table and
    ``swa_out_cache_loc[j] = swa_mapping[out_cache_loc[j]]`` (0 past
    ``out_cache_loc``). Inputs and outputs longer than ``bs`` rows are used
    through their first ``bs`` (``bs + 1``) entries, as in the seed.

    Modes (``seqlen_offset``, ``q_mode``, ``q_stride``), as the seed's backend
    calls them:

    - ``(0, Q_MODE_NONE)`` decode, ``(s + 1, Q_MODE_NONE)`` draft decode step
      ``s``: ``cu_seqlens_q`` untouched;
    - ``(0, Q_MODE_STRIDED, n)`` draft extend v2 and ``(n, Q_MODE_STRIDED, n)``
      target verify: ``cu_seqlens_q[i] = i · n``;
    - ``(0, Q_MODE_RAGGED_VERIFY, N)`` (mha-kit): ragged verify,
      ``cache_seqlens = seq_lens + qlens`` and ``cu_seqlens_q = [0, cumsum(qlens)]``
      with ``qlens`` clamped into ``[0, N]``;
    - ``Q_MODE_CUMSUM`` and other combinations raise ``InvalidArgument``.

    Unlike the seed, entry 0 of ``cu_seqlens_k`` / ``cu_seqlens_q`` is written
    (0), so the buffers need no zeroing.

    Args:
        req_pool_indices, seq_lens: ``[≥ bs]`` int64.
        req_to_token: ``[R, W]`` int32.
        cache_seqlens: ``[≥ bs]`` int32 (written).
        cu_seqlens_k: ``[≥ bs + 1]`` int32 (written).
        page_table: ``[≥ bs, ≥ max_seq_pages]`` int32 (written).
        bs: rows (0 does nothing).
        seqlen_offset, q_stride, q_mode: the mode, above.
        max_seq_pages: page-table columns written per row.
        page_size: ``P ≥ 1``.
        swa_mapping: ``[N_map]`` int64 full→SWA slot map.
        swa_page_table: ``[≥ bs, ≥ max_seq_pages]`` int32 (written).
        out_cache_loc: ``[n_out]`` int64.
        swa_out_cache_loc: ``[n_swa]`` int64 (written whole).
        cu_seqlens_q: ``[≥ bs + 1]`` int32 (written by STRIDED / RAGGED_VERIFY).
        qlens: ``[≥ bs]`` int32 (RAGGED_VERIFY).

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError.
    """
    bs = host_int(bs, "bs")
    if bs == 0:
        return
    low = -(1 << 63)  # signed: the native side names a negative one
    args = (req_pool_indices, seq_lens, req_to_token, cache_seqlens, cu_seqlens_k, page_table,
            bs, host_int(seqlen_offset, "seqlen_offset", low),
            host_int(max_seq_pages, "max_seq_pages"), host_int(page_size, "page_size"),
            swa_mapping, swa_page_table, out_cache_loc, swa_out_cache_loc, cu_seqlens_q, qlens,
            host_int(q_stride, "q_stride", low), host_int(q_mode, "q_mode", low))
    if _compiling():
        _ops().update_graph_metadata(*args)
    else:
        _graph_impl(*args)


def _kv_write_impl(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size):
    kd = describe(k, "k")
    return _native.fused_fp8_set_kv_buffer(
        kd,
        describe(v, "v"),
        describe(k_cache, "k_cache", True),
        describe(v_cache, "v_cache", True),
        describe(cache_loc, "cache_loc"),
        k_scale, v_scale, int(page_size),
        stream_of(kd),
    )


def fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
                            page_size=16):
    """Quantizes K/V rows to FP8 e4m3 and writes them into a paged cache (the seed's helper).

    For token ``t`` with ``loc = cache_loc[t]``: ``K[loc, h, d] =
    e4m3_satfinite(f32(k[t, h, d]) · f32(1 / k_scale))`` (round to nearest
    even, ±448 saturation, NaN → 0x7F), V likewise; slots outside the cache
    are skipped and counted.

    Args:
        k, v: ``[T, Hkv, D]`` (any strides, contiguous last dim) or
            ``[T, Hkv·D]``, bfloat16 / float16.
        k_cache, v_cache: ``[S, Hkv, D]`` or ``[S / P, P, Hkv, D]``,
            float8_e4m3fn or uint8, ``S`` a multiple of ``page_size``.
        cache_loc: ``[T]`` int64 slots.
        k_scale, v_scale: floats or one-element tensors (as ``bmm1_scale``), ``None`` =
            1.0; each resolved on its own (mha-kit D8: ≤ 0, NaN, ±∞ → 1.0;
            the seed ignores both when one is missing).
        page_size: ``P ≥ 1``.

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError.
    """
    args = (k, v, k_cache, v_cache, cache_loc, scalar(k_scale, "k_scale"),
            scalar(v_scale, "v_scale"), host_int(page_size, "page_size"))
    if _compiling():
        _ops().fused_fp8_set_kv_buffer(*args)
    else:
        _kv_write_impl(*args)


#: ``ln(2)``: FlashInfer's base-2 log-sum-exp to the natural log of mha-kit's kernels.
LN2 = 0.6931471805599453


def _new(like, shape, dtype_name):
    """An uninitialised ``shape`` array like ``like`` (torch or numpy), of
    ``like``'s dtype (``None``) or float32 (``"float32"``)."""
    if sys.modules.get("torch") is not None and hasattr(like, "new_empty"):
        import torch

        return like.new_empty(shape, dtype=None if dtype_name is None else torch.float32)
    import numpy as np

    return np.empty(shape, dtype=like.dtype if dtype_name is None else np.float32)


def _merge_impl(v, s, out, lse_out, sinks):
    vd = describe(v, "v")
    _native.merge_states(vd, describe(s, "s"), describe(out, "out", True),
                         maybe(lse_out, "lse_out", True), maybe(sinks, "sinks"), stream_of(vd))


def merge_states(v, s, out=None, lse_out=None, sinks=None):
    """Merges ``K`` partial attention states of the same rows (FlashInfer's ``merge_states``).

    Each part ``i`` is an attention output ``O_i`` over a disjoint subset of
    a row's keys and its log-sum-exp ``s_i`` (base 2, FlashInfer's
    convention, as ``return_lse=True`` gives it). With ``M = max_i s_i`` and
    ``w_i = 2^(s_i − M)`` (0 for a part with ``s_i = −inf``, which saw no
    key; its ``O_i`` is never read)::

        V = Σ_i w_i·O_i / Σ_i w_i,        S = M + log2 Σ_i w_i

    A row whose parts all saw no key is ``V = 0, S = −inf``; a NaN ``s_i``
    makes the row NaN. ``sinks`` (natural-log logits, as the attention
    calls take them; for decode context parallelism compute the parts
    without sinks) join each row once after the merge: ``S' = log2(2^S +
    e^σ_h)``, ``V' = V·2^(S − S')``, rows with ``S = −inf`` unchanged.

    Args:
        v: ``[seq_len, num_states, num_heads, head_dim]`` bfloat16 / float16
            (any strides, contiguous last dim, even ``head_dim``), e.g. an
            all-gather's ``[world, ...]`` buffer seen through ``transpose(0, 1)``.
        s: ``[seq_len, num_states, num_heads]`` float32 (contiguous last dim).
        out: ``[seq_len, num_heads, head_dim]`` of ``v``'s dtype, or ``None``
            (allocated before the call).
        lse_out: ``[seq_len, num_heads]`` float32, or ``None`` (allocated).
        sinks: ``[num_heads]`` float32 or ``None``.

    Returns:
        ``(V, S)``: ``out`` and ``lse_out``.

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError.

    CUDA tensors run on torch's current stream (capturable in a CUDA graph
    after a first eager call); host tensors run the float64 definition.
    The log-sum-exp conversions (to the kernels' natural log and back)
    are two elementwise multiplies of ``s`` / ``S``.
    """
    shape = tuple(getattr(v, "shape", ()))
    if len(shape) != 4:
        raise InvalidArgument(
            f"argument `v`: expected [seq_len, num_states, num_heads, head_dim], got shape {list(shape)}"
        )
    t, _, h, d = shape
    if out is None:
        out = _new(v, (t, h, d), None)
    if lse_out is None:
        lse_out = _new(v, (t, h), "float32")
    if not hasattr(s, "shape"):
        raise InvalidArgument(
            f"argument `s`: expected a float32 array or tensor, got {type(s).__name__}")
    s_nat = s * LN2
    if _compiling():
        _ops().merge_states(v, s_nat, out, lse_out, sinks)
    else:
        _merge_impl(v, s_nat, out, lse_out, sinks)
    _lse_to_base2(lse_out)
    return out, lse_out


def merge_state(v_a, s_a, v_b, s_b):
    """Merges two partial states (FlashInfer's ``merge_state``): ``v_a``,
    ``v_b`` ``[seq_len, num_heads, head_dim]``, ``s_a``, ``s_b``
    ``[seq_len, num_heads]`` float32 base-2 log-sum-exp; returns ``(V, S)``
    as :func:`merge_states` of the two (stacked on a new axis 1)."""
    if sys.modules.get("torch") is not None and hasattr(v_a, "new_empty"):
        import torch

        return merge_states(torch.stack((v_a, v_b), 1), torch.stack((s_a, s_b), 1))
    import numpy as np

    return merge_states(np.stack((v_a, v_b), 1), np.stack((s_a, s_b), 1))


def _set_kv_impl(k, v, k_cache, v_cache, cache_loc, kv_layout):
    kd = describe(k, "k")
    kc, vc = _kv_descs(k_cache, v_cache, kv_layout, True)
    return _native.set_kv_buffer(kd, describe(v, "v"), kc, vc, describe(cache_loc, "cache_loc"),
                                 stream_of(kd))


def set_kv_buffer(k, v, k_cache, v_cache, cache_loc, kv_layout="HND"):
    """Writes K/V rows into a 16-bit paged cache, bit for bit (the
    bfloat16 / float16 counterpart of :func:`fused_fp8_set_kv_buffer`).

    Token ``t`` goes to slot ``s = cache_loc[t]``: page ``s // P``, token
    ``s % P``. A slot outside ``[0, num_pages · P)`` — a negative one
    included — is skipped and counted in the ``kv_write`` error word
    (:func:`device_errors`), never written through (plain tensor indexing
    would wrap ``-1`` around to the last page).

    Args:
        k, v: ``[T, Hkv, D]`` (any strides, contiguous last dim) or
            ``[T, Hkv·D]``, the caches' dtype.
        k_cache, v_cache: ``[num_pages, Hkv, P, D]`` (``kv_layout="HND"``) or
            ``[num_pages, P, Hkv, D]`` (``"NHD"``), bfloat16 / float16, any
            strides with a contiguous last dim.
        cache_loc: ``[T]`` int64 slots.
        kv_layout: ``"HND"`` or ``"NHD"``.

    Raises:
        mha_kit.InvalidArgument, mha_kit.DeviceError.
    """
    if _compiling():
        _ops().set_kv_buffer(k, v, k_cache, v_cache, cache_loc, kv_layout)
    else:
        _set_kv_impl(k, v, k_cache, v_cache, cache_loc, kv_layout)

"""A ``TRTLLMHAAttnBackend``-style backend over mha_kit's calls, on engine tensors.

SGLang's TRT-LLM MHA backend turns a forward batch into metadata once per
pass, then, per attention layer, writes the layer's new K/V and calls one
attention kernel. This module is the same state machine over plain tensors and
small dataclasses (no SGLang import), so an engine built like SGLang can swap
it in:

- :class:`TrtllmMhaBackend`: ``init_forward_metadata``, ``forward_decode``,
  ``forward_extend``, and the CUDA-graph protocol ``init_cuda_graph_state``,
  ``init_forward_metadata_capture_cuda_graph``,
  ``init_forward_metadata_replay_cuda_graph``;
- :class:`TrtllmMhaMultiStepDraftBackend`: one backend per EAGLE draft step
  (step ``i`` attends ``seq_lens + i + 1`` keys).

The engine owns every buffer: ``req_to_token`` ``[R, W]`` int32, the per-layer
K/V caches (``[num_pages, Hkv, P, D]`` for ``kv_layout="HND"``, ``[num_pages,
P, Hkv, D]`` for ``"NHD"``; bf16 / f16, or e4m3 as ``float8_e4m3fn`` / ``uint8``
bytes), the full→SWA slot map of a hybrid model and the zeroed workspace. The
backend allocates only its metadata (per eager pass, as SGLang does) and, in
``init_cuda_graph_state``, the graph buffers; a graph replay rewrites those in
place with one fused launch (``update_trtllm_mha_graph_metadata``).

Metadata per mode (the seed backend's rules): DECODE / IDLE ``cache_seqlens =
seq_lens`` (draft step ``s``: ``+ s + 1``), one row per request; TARGET_VERIFY
uniform ``n = num_tokens / bs`` rows per request and ``cache_seqlens = seq_lens +
n``, ragged (``SpecInfo.verify_lens``) ``seq_lens + verify_lens`` and
``cu_seqlens_q = [0, cumsum(verify_lens)]``; DRAFT_EXTEND_V2 ``n`` rows per
request over ``seq_lens`` keys; EXTEND / MIXED the context kernel over
``cu_seqlens_q = [0, cumsum(extend_seq_lens)]`` and ``cu_seqlens_k``. Page tables
``[bs, M]``, ``M = ceil(max_context_len / P)``, from ``build_trtllm_mha_page_table``.

Arrays may be torch tensors (CUDA: the kernels; CPU: the f64 references) or numpy
arrays (the CPU path); the backend follows the type of ``req_to_token``.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from . import _api
from ._tensor import InvalidArgument, is_torch

#: Forward modes (SGLang's ``ForwardMode`` names) the backend serves.
DECODE, IDLE, EXTEND, MIXED = "DECODE", "IDLE", "EXTEND", "MIXED"
TARGET_VERIFY, DRAFT_EXTEND_V2 = "TARGET_VERIFY", "DRAFT_EXTEND_V2"
_MODES = (DECODE, IDLE, EXTEND, MIXED, TARGET_VERIFY, DRAFT_EXTEND_V2)
_GRAPH_MODES = (DECODE, IDLE, TARGET_VERIFY, DRAFT_EXTEND_V2)


@dataclass
class Layer:
    """One attention layer as the backend needs it (SGLang's ``RadixAttention``
    fields): ``num_q_heads`` / ``num_kv_heads`` of this rank, ``head_dim``,
    ``scaling`` (the softmax scale), ``window_left`` (-1: full attention; ``W``:
    keys ``x - W ..= x``), the checkpoint ``k_scale`` / ``v_scale`` of an e4m3
    cache (each resolved as the fused write resolves it: not a positive finite
    number → 1.0, for the write and the attention scales alike), and ``is_swa`` (its K/V live in the SWA pool of a hybrid model)."""

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    window_left: int = -1
    k_scale: Optional[float] = None
    v_scale: Optional[float] = None
    is_swa: bool = False


@dataclass
class SpecInfo:
    """Speculative-decoding inputs of a pass: ``draft`` for a draft-decode step
    input (the multi-step draft backend's passes), ``verify_lens`` (host ints,
    one per request) for a ragged TARGET_VERIFY."""

    draft: bool = False
    verify_lens: Optional[Sequence[int]] = None


@dataclass
class ForwardBatch:
    """A pass: ``forward_mode``, ``req_pool_indices`` ``[bs]`` int64,
    ``seq_lens`` ``[bs]`` KV lengths with the pass's tokens (int32 or int64),
    ``out_cache_loc`` ``[num_tokens]`` int64 write slots, ``extend_seq_lens`` /
    ``extend_prefix_lens`` (host ints, EXTEND / MIXED), ``spec_info``."""

    forward_mode: str
    req_pool_indices: Any
    seq_lens: Any
    out_cache_loc: Any
    extend_seq_lens: Optional[Sequence[int]] = None
    extend_prefix_lens: Optional[Sequence[int]] = None
    spec_info: Optional[SpecInfo] = None

    @property
    def batch_size(self):
        return int(self.req_pool_indices.shape[0])


@dataclass
class Metadata:
    """The seed backend's metadata object (``[bs]`` / ``[bs + 1]`` int32 lengths
    and offsets, ``[bs, M]`` int32 page tables, ``[num_tokens]`` int64 SWA slots).

    ``unit_order``: ``[bs]`` int32, the length order of ``cache_seqlens``
    (:func:`mha_kit.write_decode_unit_order`) that every layer's decode call
    of the pass reads, written once a pass where a decode launch can read it
    (a CUDA batch of at least ``2·SMs`` requests · KV heads); ``None``
    otherwise (the calls then rank the batch themselves)."""

    cache_seqlens: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    page_table: Any
    max_seq_len_q: int = 1
    swa_page_table: Any = None
    swa_out_cache_loc: Any = None
    is_ragged_verify: bool = False
    mode: str = DECODE
    batch_size: int = 0
    num_tokens: int = 0
    unit_order: Any = None


# ---- array helpers: torch tensors or numpy arrays, following `like` ----

def _torch():
    import torch

    return torch


def _i32(x):
    if is_torch(x):
        return x.to(_torch().int32)
    return np.asarray(x).astype(np.int32)


def _from_host(values, like, dtype="int32"):
    if is_torch(like):
        torch = _torch()
        return torch.tensor(list(values), dtype=getattr(torch, dtype), device=like.device)
    return np.asarray(list(values), dtype=dtype)


def _arange_i32(stop, step, like):
    """``0, step, 2·step, … < stop`` as int32, made where ``like`` lives (on a
    CUDA device: no host list and no copy)."""
    if is_torch(like):
        torch = _torch()
        return torch.arange(0, stop, step, dtype=torch.int32, device=like.device)
    return np.arange(0, stop, step, dtype=np.int32)


def _cumsum0(x, like):
    """``[0, cumsum(x)]`` as int32."""
    if is_torch(like):
        torch = _torch()
        out = torch.zeros(x.shape[0] + 1, dtype=torch.int32, device=like.device)
        if x.shape[0]:
            out[1:] = torch.cumsum(x, 0, dtype=torch.int32)
        return out
    return np.concatenate([[0], np.cumsum(np.asarray(x, dtype=np.int64))]).astype(np.int32)


def _empty_i32(shape, like):
    if is_torch(like):
        torch = _torch()
        return torch.zeros(shape, dtype=torch.int32, device=like.device)
    return np.zeros(shape, dtype=np.int32)


def _zeros(shape, like, dtype):
    if is_torch(like):
        torch = _torch()
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=like.device)
    return np.zeros(shape, dtype=dtype)


def _is_e4m3(cache):
    name = str(cache.dtype)
    return "float8_e4m3fn" in name or "uint8" in name


def _resolve_scale(x, name):
    """A checkpoint K/V scale as the fused write resolves it (SEMANTICS.md
    §fp8-kv.5, D8): rounded to f32, kept when positive and finite, else 1.0
    (``None`` too), so that the attention scales match what was written."""
    x = _api.scalar(x, name)
    if x is None:
        return 1.0
    x = float(np.float32(x))
    return x if x > 0.0 and math.isfinite(x) else 1.0


def _rows(x, heads, dim):
    return x.reshape(-1, heads, dim)


class TrtllmMhaBackend:
    """The seed backend's state machine over engine tensors (module docs).

    Args:
        req_to_token: ``[R, W]`` int32 slots of each request row (the engine's).
        kv_buffers: per layer id, ``(k_cache, v_cache)`` (layout ``kv_layout``).
        layers: the :class:`Layer` of each layer id.
        page_size: ``P ≥ 1`` tokens per page.
        max_context_len: the model context length (``M = ceil(max_context_len / P)``).
        workspace_buffer: the zeroed decode workspace (shared by all instances).
        kv_layout: ``"HND"`` or ``"NHD"``.
        full_to_swa: ``[N_map]`` int64 full→SWA slot map of a hybrid model.
        num_draft_tokens: ``N``, tokens verified per request (speculative decoding).
        speculative_step_id: 0 for the target; ``i`` for draft step ``i``.
        topk: EAGLE tree width; only ``≤ 1`` (linear chains) is supported.
        skip_softmax_decode: the seed's decode skip-softmax factor (FlashInfer's
            ``skip_softmax_threshold_scale_factor``, passed to every decode-kernel
            call; ``None`` or 0: exact attention). The context calls stay exact.

    Raises:
        InvalidArgument: ``topk > 1``, a bad layout, e4m3 caches in HND
            layout, SWA layers without ``full_to_swa``, a cache count other
            than the layer count.
    """

    def __init__(self, *, req_to_token, kv_buffers, layers, page_size, max_context_len,
                 workspace_buffer, kv_layout="HND", full_to_swa=None, num_draft_tokens=None,
                 speculative_step_id=0, topk=0, skip_softmax_decode=None):
        if topk is not None and topk > 1:
            raise InvalidArgument(f"argument `topk`: {topk} (only linear draft chains, topk <= 1)")
        if kv_layout not in ("HND", "NHD"):
            raise InvalidArgument(f"argument `kv_layout`: {kv_layout!r} (expected 'HND' or 'NHD')")
        if len(kv_buffers) != len(layers):
            raise InvalidArgument(
                f"argument `kv_buffers`: {len(kv_buffers)} caches for {len(layers)} layers")
        if kv_layout == "HND" and any(_is_e4m3(k) for k, _ in kv_buffers):
            raise InvalidArgument(
                "argument `kv_layout`: e4m3 caches must be 'NHD' (token-major pages, as "
                "SGLang's pool): the fused FP8 writer writes whole token rows")
        if any(l.is_swa for l in layers) and full_to_swa is None:
            raise InvalidArgument("argument `full_to_swa`: SWA layers need the full→SWA slot map")
        self.req_to_token = req_to_token
        self.kv_buffers = list(kv_buffers)
        self.layers = list(layers)
        self.page_size = int(page_size)
        self.max_context_len = int(max_context_len)
        self.max_num_pages = -(-self.max_context_len // self.page_size)
        self.workspace_buffer = workspace_buffer
        self.kv_layout = kv_layout
        self.full_to_swa = full_to_swa
        self.num_draft_tokens = num_draft_tokens
        self.speculative_step_id = int(speculative_step_id)
        self.skip_softmax_decode = skip_softmax_decode
        self.forward_metadata = None
        self._graph = None
        self._graph_metadata = {}
        self._order_rule = {}

    # ---- eager metadata (SEMANTICS.md §backend.3) ----

    def init_forward_metadata(self, batch):
        """Builds the current metadata of ``batch`` (allocates it, as the seed does)."""
        mode = batch.forward_mode
        if mode not in _MODES:
            raise InvalidArgument(f"argument `forward_mode`: {mode!r} (one of {', '.join(_MODES)})")
        bs = batch.batch_size
        like = self.req_to_token
        seq = _i32(batch.seq_lens)
        n_tok = int(batch.out_cache_loc.shape[0])
        ragged = False
        if mode in (DECODE, IDLE):
            off = self.speculative_step_id + 1 if (batch.spec_info and batch.spec_info.draft) else 0
            cache = seq + off
            cu_q = _arange_i32(bs + 1, 1, like)
            max_q = 1
        elif mode == TARGET_VERIFY and batch.spec_info and batch.spec_info.verify_lens is not None:
            vl = [int(x) for x in batch.spec_info.verify_lens]
            if len(vl) != bs:
                raise InvalidArgument(
                    f"argument `spec_info.verify_lens`: {len(vl)} lengths for {bs} requests")
            vl_t = _from_host(vl, like)
            cache = seq + vl_t
            cu_q = _cumsum0(vl_t, like)
            max_q = max(vl + [1])
            ragged = True
        elif mode in (TARGET_VERIFY, DRAFT_EXTEND_V2):
            if bs and (n_tok % bs or n_tok == 0):
                raise InvalidArgument(
                    f"argument `out_cache_loc`: {n_tok} rows are not {mode}'s uniform rows for {bs} requests")
            n = n_tok // bs if bs else 1
            cache = seq + n if mode == TARGET_VERIFY else seq
            cu_q = _arange_i32(bs * n + 1, n, like)
            max_q = n
        else:
            ext = [int(x) for x in (batch.extend_seq_lens or [])]
            if len(ext) != bs:
                raise InvalidArgument(
                    f"argument `extend_seq_lens`: {len(ext)} lengths for {bs} requests")
            cache = seq
            cu_q = _cumsum0(_from_host(ext, like), like)
            max_q = max(ext + [1])
        cache = _i32(cache)
        meta = Metadata(
            cache_seqlens=cache,
            cu_seqlens_q=cu_q,
            cu_seqlens_k=_cumsum0(cache, like),
            page_table=_empty_i32((bs, self.max_num_pages), like),
            max_seq_len_q=max_q,
            is_ragged_verify=ragged,
            mode=mode,
            batch_size=bs,
            num_tokens=n_tok,
        )
        if mode not in (EXTEND, MIXED) and self._orders(bs, like):
            meta.unit_order = _api.write_decode_unit_order(cache)
        if self.full_to_swa is not None:
            meta.swa_page_table = _empty_i32((bs, self.max_num_pages), like)
            meta.swa_out_cache_loc = self.full_to_swa[batch.out_cache_loc]
        if bs:
            _api.build_trtllm_mha_page_table(
                self.req_to_token, batch.req_pool_indices, cache, meta.page_table,
                self.page_size, meta.swa_page_table, self.full_to_swa)
        self.forward_metadata = meta
        return meta

    def _orders(self, bs, like):
        """Whether this pass's decode calls get a unit order: a launch over
        ``bs`` requests of the layer with the most KV heads could read one
        (the decode launcher's fixed settings decide it: kept per ``bs`` and
        device, off the replay path's host time)."""
        key = (bs, str(getattr(like, "device", "")))
        got = self._order_rule.get(key)
        if got is None:
            hkv = max((l.num_kv_heads for l in self.layers), default=0)
            got = self._order_rule[key] = _api._decode_may_read_unit_order(like, bs, bs * hkv)
        return got

    # ---- per-layer forward (SEMANTICS.md §backend.7) ----

    def _write_kv(self, k, v, layer, batch):
        k_cache, v_cache = self.kv_buffers[layer.layer_id]
        meta = self.forward_metadata
        loc = meta.swa_out_cache_loc if layer.is_swa else batch.out_cache_loc
        k = _rows(k, layer.num_kv_heads, layer.head_dim)
        v = _rows(v, layer.num_kv_heads, layer.head_dim)
        if _is_e4m3(k_cache):  # NHD (checked at construction)
            _api.fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, loc, layer.k_scale,
                                         layer.v_scale, self.page_size)
            return
        # The native write skips and counts a slot outside the cache (a -1
        # from the SWA translation, a bad out_cache_loc) where tensor
        # indexing would wrap it around to the last page.
        _api.set_kv_buffer(k, v, k_cache, v_cache, loc, self.kv_layout)

    def _scales(self, layer):
        k_cache = self.kv_buffers[layer.layer_id][0]
        if _is_e4m3(k_cache):
            ks = _resolve_scale(layer.k_scale, "k_scale")
            vs = _resolve_scale(layer.v_scale, "v_scale")
            return layer.scaling * ks, vs
        return layer.scaling, 1.0

    def _page_table(self, layer):
        meta = self.forward_metadata
        return meta.swa_page_table if (layer.is_swa and meta.swa_page_table is not None) \
            else meta.page_table

    def _decode_call(self, q, layer, sinks):
        meta = self.forward_metadata
        bmm1, bmm2 = self._scales(layer)
        kw = dict(q_len_per_req=meta.max_seq_len_q)
        if meta.is_ragged_verify:
            kw = dict(q_len_per_req=None, max_q_len=meta.max_seq_len_q,
                      cum_seq_lens_q=meta.cu_seqlens_q)
        out = _api.trtllm_batch_decode_with_kv_cache(
            _rows(q, layer.num_q_heads, layer.head_dim), self.kv_buffers[layer.layer_id],
            self.workspace_buffer, self._page_table(layer), meta.cache_seqlens,
            self.max_context_len, bmm1_scale=bmm1, bmm2_scale=bmm2,
            window_left=layer.window_left, sinks=sinks, kv_layout=self.kv_layout,
            skip_softmax_threshold_scale_factor=self.skip_softmax_decode,
            unit_order=meta.unit_order, **kw)
        return out.reshape(-1, layer.num_q_heads * layer.head_dim)

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache=True, sinks=None):
        """One layer of a DECODE pass: writes ``k`` / ``v`` (``[bs, Hkv·D]``) at
        ``out_cache_loc`` (its SWA translation for an SWA layer), then the decode
        kernel; returns ``[bs, Hq·D]``."""
        if save_kv_cache and k is not None:
            self._write_kv(k, v, layer, batch)
        return self._decode_call(q, layer, sinks)

    def forward_extend(self, q, k, v, layer, batch, save_kv_cache=True, sinks=None):
        """One layer of an EXTEND / MIXED pass (the context kernel) or a
        TARGET_VERIFY / DRAFT_EXTEND_V2 pass (the decode kernel, uniform or
        ragged rows); returns ``[num_tokens, Hq·D]``."""
        if save_kv_cache and k is not None:
            self._write_kv(k, v, layer, batch)
        meta = self.forward_metadata
        if meta.mode in (TARGET_VERIFY, DRAFT_EXTEND_V2):
            return self._decode_call(q, layer, sinks)
        bmm1, bmm2 = self._scales(layer)
        out = _api.trtllm_batch_context_with_kv_cache(
            _rows(q, layer.num_q_heads, layer.head_dim), self.kv_buffers[layer.layer_id],
            self.workspace_buffer, self._page_table(layer), meta.cache_seqlens,
            meta.max_seq_len_q, self.max_context_len, bmm1, bmm2, meta.batch_size,
            meta.cu_seqlens_q, meta.cu_seqlens_k, window_left=layer.window_left, sinks=sinks,
            kv_layout=self.kv_layout)
        return out.reshape(-1, layer.num_q_heads * layer.head_dim)

    # ---- CUDA graphs (SEMANTICS.md §backend.4–5) ----

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        """Allocates the graph buffers for buckets of up to ``max_bs`` requests
        and ``max_num_tokens`` tokens (zeroed)."""
        like, m = self.req_to_token, self.max_num_pages
        g = {}
        for mode in ("decode", "verify", "draft_extend"):
            g[mode] = dict(
                cache_seqlens=_empty_i32((max_bs,), like),
                # Decode rows: 0, 1, …, bs for every bucket (a static preset;
                # verify / draft extend rows are written by the fused launch).
                cu_seqlens_q=(_arange_i32(max_bs + 1, 1, like) if mode == "decode"
                              else _empty_i32((max_bs + 1,), like)),
                cu_seqlens_k=_empty_i32((max_bs + 1,), like),
                page_table=_empty_i32((max_bs, m), like),
                swa_page_table=None if self.full_to_swa is None else _empty_i32((max_bs, m), like),
                unit_order=_empty_i32((max_bs,), like),
            )
        g["swa_out_cache_loc"] = (None if self.full_to_swa is None
                                  else _zeros((max_num_tokens,), like, "int64"))
        g["qlens"] = _empty_i32((max_bs,), like)
        self._graph = dict(g, max_bs=int(max_bs), max_num_tokens=int(max_num_tokens))
        self._graph_metadata = {}

    def _bucket(self, bs, num_tokens, mode, spec_info):
        if self._graph is None:
            raise InvalidArgument("init_cuda_graph_state must run before a graph capture")
        if mode not in _GRAPH_MODES:
            raise InvalidArgument(
                f"argument `forward_mode`: {mode} has no CUDA graph (one of {', '.join(_GRAPH_MODES)})")
        if bs > self._graph["max_bs"] or num_tokens > self._graph["max_num_tokens"]:
            raise InvalidArgument(
                f"argument `bs`: bucket ({bs} requests, {num_tokens} tokens) exceeds the graph "
                f"state ({self._graph['max_bs']}, {self._graph['max_num_tokens']})")
        ragged = bool(mode == TARGET_VERIFY and spec_info and spec_info.verify_lens is not None)
        if mode in (DECODE, IDLE):
            buf, n, name = self._graph["decode"], 1, "decode"
        elif mode == TARGET_VERIFY:
            buf, name = self._graph["verify"], "verify"
            n = (self.num_draft_tokens or 1) if ragged else (num_tokens // bs if bs else 1)
        else:
            buf, n, name = self._graph["draft_extend"], (num_tokens // bs if bs else 1), "draft_extend"
        swa_loc = self._graph["swa_out_cache_loc"]
        meta = Metadata(
            cache_seqlens=buf["cache_seqlens"][:bs],
            cu_seqlens_q=buf["cu_seqlens_q"][:bs + 1],
            cu_seqlens_k=buf["cu_seqlens_k"][:bs + 1],
            page_table=buf["page_table"][:bs],
            max_seq_len_q=n,
            swa_page_table=None if buf["swa_page_table"] is None else buf["swa_page_table"][:bs],
            swa_out_cache_loc=None if swa_loc is None else swa_loc[:num_tokens],
            is_ragged_verify=ragged,
            mode=mode,
            batch_size=bs,
            num_tokens=num_tokens,
            # The same for a bucket's capture and replays (bs and the
            # settings decide it), so the captured layers read it or not.
            unit_order=buf["unit_order"][:bs] if self._orders(bs, buf["unit_order"]) else None,
        )
        return (name, bs, num_tokens, ragged), meta, buf

    def _graph_update(self, key, meta, buf, req_pool_indices, seq_lens, out_cache_loc,
                      spec_info):
        """The fused metadata launch of a bucket (recorded in the graph on capture)."""
        name, bs, num_tokens, ragged = key
        if bs == 0:
            return
        g = self._graph
        draft = bool(spec_info and spec_info.draft)
        if name == "decode":
            offset, q_mode, q_stride = (self.speculative_step_id + 1 if draft else 0), \
                _api.Q_MODE_NONE, 0
        elif ragged:
            offset, q_mode, q_stride = 0, _api.Q_MODE_RAGGED_VERIFY, meta.max_seq_len_q
        elif name == "verify":
            offset, q_mode, q_stride = meta.max_seq_len_q, _api.Q_MODE_STRIDED, meta.max_seq_len_q
        else:
            offset, q_mode, q_stride = 0, _api.Q_MODE_STRIDED, meta.max_seq_len_q
        _api.update_trtllm_mha_graph_metadata(
            req_pool_indices=req_pool_indices, seq_lens=seq_lens, req_to_token=self.req_to_token,
            cache_seqlens=buf["cache_seqlens"], cu_seqlens_k=buf["cu_seqlens_k"],
            page_table=buf["page_table"], bs=bs, seqlen_offset=offset,
            max_seq_pages=self.max_num_pages, page_size=self.page_size,
            swa_mapping=self.full_to_swa, swa_page_table=buf["swa_page_table"],
            out_cache_loc=out_cache_loc,
            swa_out_cache_loc=g["swa_out_cache_loc"],
            cu_seqlens_q=buf["cu_seqlens_q"], qlens=g["qlens"] if ragged else None,
            q_stride=q_stride, q_mode=q_mode)
        if meta.unit_order is not None:
            _api.write_decode_unit_order(meta.cache_seqlens, meta.unit_order)

    def _ragged_lens(self, key, spec_info):
        """SEMANTICS.md §backend.5, first step: the batch's verify lengths padded to
        the bucket's rows."""
        _, bs, num_tokens, _ = key
        vl = [int(x) for x in spec_info.verify_lens]
        real = len(vl)
        if real > bs or any(x < 1 for x in vl):
            raise InvalidArgument(
                f"argument `spec_info.verify_lens`: {vl} for a bucket of {bs} rows (each >= 1)")
        left = num_tokens - sum(vl)
        pads = bs - real
        if left < 0:
            raise InvalidArgument(
                f"argument `spec_info.verify_lens`: {sum(vl)} tokens exceed the bucket's {num_tokens}")
        if pads:
            vl += [left // pads + (1 if k < left % pads else 0) for k in range(pads)]
        elif vl:
            vl[-1] += left
        n = self.num_draft_tokens or 1
        if max(vl + [0]) > n:
            raise InvalidArgument(
                f"argument `spec_info.verify_lens`: a padded row of {max(vl)} tokens exceeds "
                f"num_draft_tokens = {n}")
        self._graph["qlens"][:bs] = _from_host(vl, self.req_to_token)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices,
                                                 seq_lens, forward_mode, spec_info=None,
                                                 out_cache_loc=None):
        """Binds bucket ``(bs, num_tokens, mode)``'s metadata views (static
        buffers that the captured layers read) and fills them for the batch
        with the fused metadata launch. Call it, and the replay version, before
        and outside the graph capture, as SGLang does: the graph then holds the
        layers, and every replay's metadata is rewritten in place first."""
        key, meta, buf = self._bucket(int(bs), int(num_tokens), forward_mode, spec_info)
        self._graph_metadata[key] = (meta, buf)
        if key[3]:
            self._ragged_lens(key, spec_info)
        self._graph_update(key, meta, buf, req_pool_indices, seq_lens, out_cache_loc, spec_info)
        self.forward_metadata = meta
        return meta

    def init_forward_metadata_replay_cuda_graph(self, bs, num_tokens, req_pool_indices,
                                                seq_lens, forward_mode, spec_info=None,
                                                out_cache_loc=None):
        """Selects bucket ``(bs, num_tokens, mode)``'s metadata and rewrites it
        for the (padded) batch in place: the fused launch, or for a ragged
        verify the padded lengths first (host ints) and then the launch."""
        key, _, _ = self._bucket(int(bs), int(num_tokens), forward_mode, spec_info)
        if key not in self._graph_metadata:
            raise InvalidArgument(f"no captured graph metadata for bucket {key[:3]}")
        meta, buf = self._graph_metadata[key]
        if key[3]:
            self._ragged_lens(key, spec_info)
        self._graph_update(key, meta, buf, req_pool_indices, seq_lens, out_cache_loc, spec_info)
        self.forward_metadata = meta
        return meta


@dataclass
class TrtllmMhaMultiStepDraftBackend:
    """EAGLE draft decoding: ``num_steps - 1`` :class:`TrtllmMhaBackend` steps
    (step ids ``0 .. num_steps - 2``) over the same engine buffers; step ``i``
    attends ``seq_lens + i + 1`` keys. ``kwargs`` are the backends' arguments."""

    num_steps: int
    kwargs: dict
    steps: list = field(default_factory=list)

    def __post_init__(self):
        if self.num_steps < 2:
            raise InvalidArgument(f"argument `num_steps`: {self.num_steps} (a multi-step draft needs >= 2)")
        self.steps = [TrtllmMhaBackend(speculative_step_id=i, **self.kwargs)
                      for i in range(self.num_steps - 1)]

    def _draft(self, batch):
        if batch.forward_mode not in (DECODE, IDLE):
            raise InvalidArgument(
                f"argument `forward_mode`: {batch.forward_mode} (the multi-step draft backend takes DECODE / IDLE)")
        return ForwardBatch(batch.forward_mode, batch.req_pool_indices, batch.seq_lens,
                            batch.out_cache_loc, spec_info=SpecInfo(draft=True))

    def init_forward_metadata(self, batch):
        """Every step's metadata of the same batch (draft-decode rows)."""
        b = self._draft(batch)
        return [s.init_forward_metadata(b) for s in self.steps]

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        for s in self.steps:
            s.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices,
                                                 seq_lens, out_cache_loc=None):
        return [s.init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, DECODE, SpecInfo(draft=True),
            out_cache_loc) for s in self.steps]

    def init_forward_metadata_replay_cuda_graph(self, bs, num_tokens, req_pool_indices,
                                                seq_lens, out_cache_loc=None):
        return [s.init_forward_metadata_replay_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, DECODE, SpecInfo(draft=True),
            out_cache_loc) for s in self.steps]

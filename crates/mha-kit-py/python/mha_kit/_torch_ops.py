"""``torch.library`` custom ops over the native calls, with fake (meta)
implementations, so that ``torch.compile`` traces the public functions as
opaque ops and CUDA-graph capture records their launches.

Registered when torch is importable (``mha_kit`` imports this module then);
``ops()`` returns ``torch.ops.mha_kit``. Every op returns nothing and names
the buffers it writes in ``mutates_args``; the fake implementations do
nothing (the outputs are the caller's tensors, already of the right shape).
"""

from typing import Optional

import torch
from torch import Tensor

from . import _api, _tensor

_NS = "mha_kit"


@torch.library.custom_op(f"{_NS}::trtllm_batch_decode",
                         mutates_args=("out", "workspace_buffer", "lse"))
def _decode(query: Tensor, k_cache: Tensor, v_cache: Tensor, workspace_buffer: Tensor,
            block_tables: Tensor, seq_lens: Tensor, out: Tensor, max_seq_len: int,
            bmm1_scale: float, bmm2_scale: float, window_left: int, sinks: Optional[Tensor],
            q_len_per_req: Optional[int], max_q_len: Optional[int],
            cum_seq_lens_q: Optional[Tensor], kv_layout: str, lse: Optional[Tensor],
            skip: Optional[float], dcp_rank: int, dcp_world_size: int,
            unit_order: Optional[Tensor]) -> None:
    dcp = None if dcp_world_size == 1 and dcp_rank == 0 else (dcp_rank, dcp_world_size)
    _api._decode_impl(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                      max_seq_len, bmm1_scale, bmm2_scale, window_left, sinks, q_len_per_req,
                      max_q_len, cum_seq_lens_q, kv_layout, lse, skip, dcp, unit_order)


@_decode.register_fake
def _decode_fake(*args) -> None:
    return None


@torch.library.custom_op(f"{_NS}::write_decode_unit_order", mutates_args=("unit_order",))
def _unit_order(seq_lens: Tensor, unit_order: Tensor) -> None:
    _api._unit_order_impl(seq_lens, unit_order)


@_unit_order.register_fake
def _unit_order_fake(*args) -> None:
    return None


@torch.library.custom_op(f"{_NS}::trtllm_batch_context",
                         mutates_args=("out", "workspace_buffer", "lse"))
def _context(query: Tensor, k_cache: Tensor, v_cache: Tensor, workspace_buffer: Tensor,
             block_tables: Tensor, seq_lens: Tensor, out: Tensor, max_q_len: int,
             max_kv_len: int, bmm1_scale: float, bmm2_scale: float, batch_size: int,
             cum_seq_lens_q: Tensor, cum_seq_lens_kv: Optional[Tensor], window_left: int,
             sinks: Optional[Tensor], kv_layout: str, lse: Optional[Tensor]) -> None:
    _api._context_impl(query, k_cache, v_cache, workspace_buffer, block_tables, seq_lens, out,
                       max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size,
                       cum_seq_lens_q, cum_seq_lens_kv, window_left, sinks, kv_layout, lse)


@_context.register_fake
def _context_fake(*args) -> None:
    return None


@torch.library.custom_op(f"{_NS}::build_page_table", mutates_args=("page_table", "swa_page_table"))
def _page_table(req_to_token: Tensor, req_pool_indices: Tensor, cache_seqlens: Tensor,
                page_table: Tensor, page_size: int, swa_page_table: Optional[Tensor],
                full_to_swa: Optional[Tensor]) -> None:
    _api._page_table_impl(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
                          swa_page_table, full_to_swa)


@_page_table.register_fake
def _page_table_fake(*args) -> None:
    return None


@torch.library.custom_op(
    f"{_NS}::update_graph_metadata",
    mutates_args=("cache_seqlens", "cu_seqlens_k", "page_table", "swa_page_table",
                  "swa_out_cache_loc", "cu_seqlens_q"),
)
def _graph(req_pool_indices: Tensor, seq_lens: Tensor, req_to_token: Tensor,
           cache_seqlens: Tensor, cu_seqlens_k: Tensor, page_table: Tensor, bs: int,
           seqlen_offset: int, max_seq_pages: int, page_size: int,
           swa_mapping: Optional[Tensor], swa_page_table: Optional[Tensor],
           out_cache_loc: Optional[Tensor], swa_out_cache_loc: Optional[Tensor],
           cu_seqlens_q: Optional[Tensor], qlens: Optional[Tensor], q_stride: int,
           q_mode: int) -> None:
    _api._graph_impl(req_pool_indices, seq_lens, req_to_token, cache_seqlens, cu_seqlens_k,
                     page_table, bs, seqlen_offset, max_seq_pages, page_size, swa_mapping,
                     swa_page_table, out_cache_loc, swa_out_cache_loc, cu_seqlens_q, qlens,
                     q_stride, q_mode)


@_graph.register_fake
def _graph_fake(*args) -> None:
    return None


@torch.library.custom_op(f"{_NS}::fused_fp8_set_kv_buffer", mutates_args=("k_cache", "v_cache"))
def _kv_write(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, cache_loc: Tensor,
              k_scale: Optional[float], v_scale: Optional[float], page_size: int) -> None:
    _api._kv_write_impl(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size)


@_kv_write.register_fake
def _kv_write_fake(*args) -> None:
    return None


@torch.library.custom_op(f"{_NS}::merge_states", mutates_args=("out", "lse_out"))
def _merge(v: Tensor, s: Tensor, out: Tensor, lse_out: Tensor, sinks: Optional[Tensor]) -> None:
    _api._merge_impl(v, s, out, lse_out, sinks)


@_merge.register_fake
def _merge_fake(*args) -> None:
    return None


@torch.library.custom_op(f"{_NS}::set_kv_buffer", mutates_args=("k_cache", "v_cache"))
def _set_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, cache_loc: Tensor,
            kv_layout: str) -> None:
    _api._set_kv_impl(k, v, k_cache, v_cache, cache_loc, kv_layout)


@_set_kv.register_fake
def _set_kv_fake(*args) -> None:
    return None


def ops():
    """``torch.ops.mha_kit`` (the ops above)."""
    return torch.ops.mha_kit


_api._TORCH_OPS = torch.ops.mha_kit
_api._compiling = torch.compiler.is_compiling
# The describe hot path's torch.Tensor / dtype table, from the first call on.
_tensor._torch_dtype_map(torch)

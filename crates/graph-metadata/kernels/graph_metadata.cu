// mha-kit kernel family graph-metadata: ONE launch that rebuilds every
// per-replay metadata buffer of a CUDA-graph bucket (cache_seqlens,
// cu_seqlens_k, cu_seqlens_q, page table, SWA page table, SWA write
// locations). Semantics: shared/spec/graph-metadata.md §2-§5 with
// DECISIONS.md D1, D2, D9, D11. Params struct and per-entry rules live in
// graph_metadata.cuh (shared with the bench-only unfused baseline).
#include "graph_metadata.cuh"

// Grid (1-D), THREADS threads per block:
//   block 0                              : scan block (gm::scan_rows)
//   blocks 1 .. bs*page_chunks           : page tables, row (b-1)/page_chunks,
//                                          chunk (b-1)%page_chunks
//   the next swa_blocks blocks           : swa_out_cache_loc (grid-stride)
// No block depends on another: page rows recompute their own length, so one
// launch suffices without inter-block synchronisation.

namespace {

// Unroll depth of the page loop: loads of UNROLL pages are issued before any
// of them is used.
constexpr int UNROLL = 4;

MHA_KIT_DEVICE void page_rows(const GraphMetadataParams& p, i64 idx) {
    const i64 row = idx / p.page_chunks;
    const i64 chunk = idx % p.page_chunks;
    // Row-level events are reported once, by the first thread of chunk 0.
    const bool reporter = chunk == 0 && threadIdx.x == 0;

    const i64 r = p.req_pool_indices[row];
    if (r < 0 || r >= p.req_to_token_rows) {
        if (reporter) mha_kit::report_error(p.errors, GM_BAD_REQUEST_INDEX);
        return;
    }
    bool bad_len;  // reported by the scan block
    const i32 len = gm::cache_len(p, row, &bad_len);
    u32 row_flags;
    const i64 n = gm::live_pages(p, len, &row_flags);
    if (reporter) {
        if (row_flags & GM_ROW_CLAMPED) mha_kit::report_error(p.errors, GM_ROW_CLAMPED);
        if (row_flags & GM_ROW_PAST_WIDTH) mha_kit::report_error(p.errors, GM_ROW_PAST_WIDTH);
    }

    const i64 P = p.page_size;
    const i32* src = p.req_to_token + r * p.req_to_token_stride;
    i32* dst = p.page_table + row * p.page_table_stride;
    i32* swa_dst = p.swa_page_table != nullptr ? p.swa_page_table + row * p.swa_page_table_stride : nullptr;
    const i64 step = (i64)p.page_chunks * gm::THREADS;
    i64 page = chunk * gm::THREADS + threadIdx.x;

    // Main loop: UNROLL pages per iteration; every load (slots, then map
    // entries) is issued before any result is stored or any event counted.
    for (; page + (UNROLL - 1) * step < n; page += UNROLL * step) {
        i64 slot[UNROLL];
        i64 s2[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) slot[k] = __ldg(src + (page + k * step) * P);
        if (swa_dst != nullptr) {
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) s2[k] = gm::swa_map_load(p, slot[k]);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) dst[page + k * step] = gm::full_page(p, slot[k]);
        if (swa_dst != nullptr) {
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) swa_dst[page + k * step] = gm::swa_page(p, slot[k], s2[k]);
        }
    }
    for (; page < n; page += step) {
        const i64 slot = __ldg(src + page * P);
        const i64 s2 = swa_dst != nullptr ? gm::swa_map_load(p, slot) : 0;
        dst[page] = gm::full_page(p, slot);
        if (swa_dst != nullptr) swa_dst[page] = gm::swa_page(p, slot, s2);
    }
}

MHA_KIT_DEVICE void swa_out_locs(const GraphMetadataParams& p, i64 idx) {
    const i64 step = (i64)p.swa_blocks * gm::THREADS;
    for (i64 j = idx * gm::THREADS + threadIdx.x; j < p.n_swa; j += step) {
        p.swa_out_cache_loc[j] = gm::swa_out_loc(p, j);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_update(const __grid_constant__ GraphMetadataParams p) {
    const i64 b = blockIdx.x;
    if (b == 0) {
        gm::scan_rows(p);
        return;
    }
    const i64 page_blocks = (i64)p.bs * p.page_chunks;
    if (b <= page_blocks) {
        page_rows(p, b - 1);
        return;
    }
    swa_out_locs(p, b - 1 - page_blocks);
}

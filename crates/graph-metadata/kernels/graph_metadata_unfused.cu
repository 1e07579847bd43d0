// mha-kit graph-metadata, BENCH-ONLY baseline: the same metadata as
// graph_metadata_update, built the unfused way — one simple kernel per
// output, six launches per replay. Used only by benches/graph_metadata.rs to
// report the fused/unfused ratio; no library code launches these.
// Entries share the params struct and per-entry rules (graph_metadata.cuh).
#include "graph_metadata.cuh"

// 1. cache_seqlens[i] = seq_lens[i] + offset. Grid: ceil(bs / THREADS).
extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_unfused_cache_seqlens(const __grid_constant__ GraphMetadataParams p) {
    const i64 i = (i64)blockIdx.x * gm::THREADS + threadIdx.x;
    if (i >= p.bs) return;
    bool bad;
    p.cache_seqlens[i] = gm::cache_len(p, i, &bad);
}

// 2. cu_seqlens_k = [0, cumsum(cache_seqlens)], reading cache_seqlens back.
// Grid: 1 block.
extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_unfused_cu_seqlens_k(const __grid_constant__ GraphMetadataParams p) {
    const i64 bs = p.bs;
    const i64 per = (bs + gm::THREADS - 1) / gm::THREADS;
    const i64 begin = (i64)threadIdx.x * per;
    const i64 end = begin + per < bs ? begin + per : bs;
    i64 local = 0;
    for (i64 i = begin; i < end; ++i) local += p.cache_seqlens[i];
    i64 total;
    i64 run = gm::block_exclusive_scan(local, &total);
    for (i64 i = begin; i < end; ++i) {
        run += p.cache_seqlens[i];
        p.cu_seqlens_k[i + 1] = (i32)(u32)(u64)run;
    }
    if (threadIdx.x == 0) p.cu_seqlens_k[0] = 0;
}

// 3. cu_seqlens_q[i] = i * q_stride. Grid: ceil((bs + 1) / THREADS).
extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_unfused_cu_seqlens_q(const __grid_constant__ GraphMetadataParams p) {
    const i64 i = (i64)blockIdx.x * gm::THREADS + threadIdx.x;
    if (i > p.bs) return;
    p.cu_seqlens_q[i] = (i32)(i * (i64)p.q_stride);
}

// 4./5. One page table per launch (the SWA one re-reads req_to_token), from
// the cache_seqlens written by kernel 1. Grid: (bs, page_chunks).
template <bool SWA>
MHA_KIT_DEVICE void unfused_table(const GraphMetadataParams& p) {
    const i64 row = blockIdx.x;
    const i64 r = p.req_pool_indices[row];
    if (r < 0 || r >= p.req_to_token_rows) return;
    u32 flags;
    const i64 n = gm::live_pages(p, p.cache_seqlens[row], &flags);
    const i32* src = p.req_to_token + r * p.req_to_token_stride;
    const i64 step = (i64)gridDim.y * gm::THREADS;
    for (i64 page = (i64)blockIdx.y * gm::THREADS + threadIdx.x; page < n; page += step) {
        const i64 slot = __ldg(src + page * p.page_size);
        if (SWA) {
            p.swa_page_table[row * p.swa_page_table_stride + page] =
                p.swa_page_map != nullptr ? gm::swa_page_paged(p, slot)
                                          : gm::swa_page(p, slot, gm::swa_map_load(p, slot));
        } else {
            p.page_table[row * p.page_table_stride + page] = gm::full_page(p, slot);
        }
    }
}

extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_unfused_page_table(const __grid_constant__ GraphMetadataParams p) {
    unfused_table<false>(p);
}

extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_unfused_swa_page_table(const __grid_constant__ GraphMetadataParams p) {
    unfused_table<true>(p);
}

// 6. swa_out_cache_loc: translate, zero tail. Grid: ceil(n_swa / THREADS).
extern "C" __global__ void __launch_bounds__(gm::THREADS)
graph_metadata_unfused_swa_out_cache_loc(const __grid_constant__ GraphMetadataParams p) {
    const i64 j = (i64)blockIdx.x * gm::THREADS + threadIdx.x;
    if (j >= p.n_swa) return;
    p.swa_out_cache_loc[j] = gm::swa_out_loc(p, j);
}

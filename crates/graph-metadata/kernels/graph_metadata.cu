// mha-kit kernel family graph-metadata: ONE launch that rebuilds every
// per-replay metadata buffer of a CUDA-graph bucket (cache_seqlens,
// cu_seqlens_k, cu_seqlens_q, page table, SWA page table, SWA write
// locations). Semantics: SEMANTICS.md §graph-metadata.2-5 with
// DESIGN.md D1, D2, D9, D11. Params struct and per-entry rules live in
// graph_metadata.cuh (shared with the bench-only unfused baseline); the page
// loop here restates full_page / swa_page / swa_page_paged in 32-bit
// arithmetic (same values, same error events) because it is the hot path.

#include "graph_metadata.cuh"

// Grid (1-D), THREADS threads per block:
//   block 0                              : scan block (gm::scan_rows)
//   blocks 1 .. bs*page_chunks           : page tables, one task per warp
//   the next swa_blocks blocks           : swa_out_cache_loc (grid-stride)
// No block depends on another: page tasks recompute their row's length, so
// one launch suffices without inter-block synchronisation.
//
// Page tasks: warp `t = (block - 1) * WARPS + warp` (t < bs * WARPS *
// page_chunks) serves row `t % bs`, part `t / bs`; lane l of part j writes
// the row's pages j*32 + l + i*step, step = page_chunks * THREADS. Taking
// the row as the fast index spreads every row over many blocks (so SMs get
// similar shares of live pages when row lengths differ) while each warp
// still writes 32 consecutive entries per store.

namespace {


// Division of non-negative values by P: a shift when P is a power of two
// (every practical page size), else 32-bit division where the value fits.
template <bool POW2>
struct PageDiv {
    u32 p;   // P
    u32 sh;  // log2(P) when POW2
    MHA_KIT_DEVICE u32 div(u32 x) const { return POW2 ? x >> sh : x / p; }
    // x >= 0, any magnitude.
    MHA_KIT_DEVICE i64 div64(i64 x) const {
        if (POW2) return x >> sh;
        return x <= 0xffffffffLL ? (i64)((u32)x / p) : x / (i64)p;
    }
};

// Which SWA page table a page task writes (uniform over the grid).
enum SwaTable : int {
    SWA_NONE = 0,  // no SWA page table bound
    SWA_SLOT = 1,  // through the full->SWA slot map: swa_mapping[slot] / P
    SWA_PAGE = 2,  // through the full page->SWA page map: swa_page_map[slot / P]
};

// Pages of one warp task (see the grid comment). `row < bs`, `part <
// WARPS * page_chunks`, `page_chunks <= 1056` (launch_config), so every
// page index below stays far inside u32.
template <bool POW2, int SWA_MODE>
MHA_KIT_DEVICE void page_task(const GraphMetadataParams& p, u32 row, u32 part) {
    constexpr bool SWA = SWA_MODE != SWA_NONE;
    const u32 P = (u32)p.page_size;
    const PageDiv<POW2> d{P, (u32)(__ffs(p.page_size) - 1)};
    const u32 lane = threadIdx.x & 31;
    // Row-level events are reported once, by lane 0 of the row's part 0.
    const bool reporter = part == 0 && lane == 0;

    // Independent loads first: request index and length in one round trip.
    const i64 r = p.req_pool_indices[row];
    bool bad_len;  // reported by the scan block
    const i32 len = gm::cache_len(p, row, &bad_len);
    if (r < 0 || r >= p.req_to_token_rows) {
        if (reporter) mha_kit::report_error(p.errors, GM_BAD_REQUEST_INDEX);
        return;
    }
    // Live pages (gm::live_pages in 32 bits): len + P - 1 < 2^32.
    u32 n = d.div((u32)len + P - 1);
    u32 row_flags = 0;
    if (n > (u32)p.max_seq_pages) {
        n = (u32)p.max_seq_pages;
        row_flags |= GM_ROW_CLAMPED;
    }
    const i64 readable = d.div64(p.req_to_token_width + (P - 1));
    if ((i64)n > readable) {
        n = (u32)readable;
        row_flags |= GM_ROW_PAST_WIDTH;
    }
    if (reporter && row_flags != 0) {
        if (row_flags & GM_ROW_CLAMPED) mha_kit::report_error(p.errors, GM_ROW_CLAMPED);
        if (row_flags & GM_ROW_PAST_WIDTH) mha_kit::report_error(p.errors, GM_ROW_PAST_WIDTH);
    }

    // Slot bounds as u32 limits: a negative slot reads as >= 2^31, past both.
    // slot >= pool_slots (when checked) <=> (u32)slot >= pool_lim;
    // slot <  N_map - 1                  <=> (u32)slot <  map_lim.
    const u32 pool_lim = (p.pool_slots > 0 && p.pool_slots < 0x80000000LL)
                             ? (u32)p.pool_slots : 0x80000000u;
    const u32 map_lim = SWA_MODE == SWA_SLOT
                            ? (p.swa_mapping_len - 1 < 0x80000000LL
                                   ? (u32)(p.swa_mapping_len - 1) : 0x80000000u)
                            : 0u;
    // Page-map path: slot / P < swa_page_map_len <=> page < page_lim (pages
    // of non-negative i32 slots are < 2^31).
    const u32 page_lim = SWA_MODE == SWA_PAGE
                             ? (p.swa_page_map_len < 0x80000000LL
                                    ? (u32)p.swa_page_map_len : 0x80000000u)
                             : 0u;

    const i32* __restrict__ src = p.req_to_token + r * p.req_to_token_stride;
    i32* __restrict__ dst = p.page_table + (i64)row * p.page_table_stride;
    i32* __restrict__ swa_dst =
        SWA ? p.swa_page_table + (i64)row * p.swa_page_table_stride : nullptr;
    const i64* __restrict__ map = p.swa_mapping;
    const i32* __restrict__ page_map = p.swa_page_map;
    const u32 step = (u32)p.page_chunks * gm::THREADS;
    // Pages each thread keeps in flight: all UNROLL slot loads, then all map
    // loads, are issued before any result is stored or any event counted.
    // With an SWA table a page holds a slot and a map entry (64-bit from
    // the slot map, 32-bit from the page map) plus a second output row, so 2
    // pages fit the 32 registers without spills (8 blocks of 256 threads per
    // SM still keep 4096 pages in flight per SM, more than L2 throughput
    // needs; the headline bucket has at most 2 pages per thread anyway).
    constexpr int UNROLL = SWA_MODE == SWA_NONE ? 4 : 2;

    // Per-entry events are summed in registers and added to the error word
    // once per thread (same final [count, flags] as one report per event).
    u32 ev_count = 0;
    u32 ev_flags = 0;
    for (u32 base = part * 32 + lane; base < n; base += UNROLL * step) {
        i32 slot[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const u32 page = base + k * step;
            // (n - 1) * P < W: the position fits in the row.
            slot[k] = page < n ? __ldg(src + (u64)page * P) : 0;
        }
        i64 s2[UNROLL];
        if constexpr (SWA_MODE == SWA_SLOT) {
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const u32 page = base + k * step;
                s2[k] = page < n && (u32)slot[k] < map_lim ? __ldg(map + (u32)slot[k]) : 0;
            }
        }
        i32 sp2[UNROLL];
        if constexpr (SWA_MODE == SWA_PAGE) {
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const u32 page = base + k * step;
                // Every index loaded is < page_lim <= swa_page_map_len; a
                // negative slot may load an (in-bounds) entry that is ignored.
                const u32 fp = d.div((u32)slot[k]);
                sp2[k] = page < n && fp < page_lim ? __ldg(page_map + fp) : 0;
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            const u32 page = base + k * step;
            if (page >= n) break;
            const i32 s = slot[k];
            i32 full;
            if (s < 0) {
                full = 0;
                ev_count += 1;
                ev_flags |= GM_NEGATIVE_SLOT;
            } else if ((u32)s >= pool_lim) {
                full = 0;
                ev_count += 1;
                ev_flags |= GM_SLOT_OUTSIDE_POOL;
            } else {
                full = (i32)d.div((u32)s);
            }
            dst[page] = full;
            if constexpr (SWA_MODE == SWA_PAGE) {
                i32 sp;
                if (s < 0) {
                    sp = -1;
                } else if (d.div((u32)s) >= page_lim) {
                    sp = 0;
                    ev_count += 1;
                    ev_flags |= GM_SLOT_OUTSIDE_MAP;
                } else {
                    sp = sp2[k] < 0 ? -1 : sp2[k];
                }
                swa_dst[page] = sp;
            }
            if constexpr (SWA_MODE == SWA_SLOT) {
                i32 sp;
                if (s < 0) {
                    sp = -1;
                } else if ((u32)s >= map_lim) {
                    sp = 0;
                    ev_count += 1;
                    ev_flags |= GM_SLOT_OUTSIDE_MAP;
                } else {
                    const i64 v = s2[k];
                    // Low 32 bits of v / P (as gm::swa_page), 32-bit where v fits.
                    sp = v < 0 ? -1
                       : v <= gm::I32_MAX ? (i32)d.div((u32)v)
                       : (i32)d.div64(v);
                }
                swa_dst[page] = sp;
            }
        }
    }
    if (ev_count != 0 && p.errors != nullptr) {
        atomicAdd(&p.errors[0], ev_count);
        atomicOr(&p.errors[1], ev_flags);
    }
}

// The whole of cache_seqlens, cu_seqlens_k (entry 0 included, D1) and, when
// bound, cu_seqlens_q (= i * q_stride, D1, D2; ragged verify: the prefix sum
// of the clamped qlens), by one block of THREADS threads: gm::scan_rows with
// 32-bit row indices and the row events summed per thread (one atomic pair
// per thread), so that it fits the page loop's 32 registers. Each thread
// owns ceil(bs / THREADS) consecutive rows; block scans join them.
MHA_KIT_DEVICE void scan_rows(const GraphMetadataParams& p) {
    const u32 bs = (u32)p.bs;
    const u32 per = (bs + gm::THREADS - 1) / gm::THREADS;
    // threadIdx.x * per < bs + THREADS: no u32 overflow.
    const u32 begin = threadIdx.x * per;
    const u32 end = begin + per < bs ? begin + per : bs;
    u32 ev_count = 0;
    u32 ev_flags = 0;
    i64 local = 0;
    i32 local_q = 0;  // bs * max_q_len fits in i32 (host validation)
    for (u32 i = begin; i < end; ++i) {
        bool bad;
        const i32 len = gm::cache_len(p, i, &bad);
        if (bad) {
            ev_count += 1;
            ev_flags |= GM_SEQLEN_OUT_OF_RANGE;
        }
        local_q += gm::q_len(p, i, &bad);
        if (bad) {
            ev_count += 1;
            ev_flags |= GM_QLEN_OUT_OF_RANGE;
        }
        p.cache_seqlens[i] = len;
        local += len;
    }
    i64 total;
    i64 run = gm::block_exclusive_scan(local, &total);
    if (threadIdx.x == 0) {
        p.cu_seqlens_k[0] = 0;
        if (total > gm::I32_MAX) {
            ev_count += 1;
            ev_flags |= GM_SUM_OVERFLOW;
        }
    }
    // 32-bit sums (SEMANTICS.md §graph-metadata.5): keep the low 32 bits (overflow counted above).
    u32 run32 = (u32)(u64)run;
    for (u32 i = begin; i < end; ++i) {
        bool bad;
        run32 += (u32)gm::cache_len(p, i, &bad);
        p.cu_seqlens_k[i + 1] = (i32)run32;
    }
    if (p.cu_seqlens_q != nullptr) {
        if (p.qlens != nullptr) {
            i64 total_q;
            i32 run_q = (i32)gm::block_exclusive_scan(local_q, &total_q);
            for (u32 i = begin; i < end; ++i) {
                bool bad;
                run_q += gm::q_len(p, i, &bad);
                p.cu_seqlens_q[i + 1] = run_q;
            }
            if (threadIdx.x == 0) p.cu_seqlens_q[0] = 0;
        } else {
            // bs * q_stride fits in i32 (host validation).
            for (u32 i = threadIdx.x; i <= bs; i += gm::THREADS) {
                p.cu_seqlens_q[i] = (i32)(i * (u32)p.q_stride);
            }
        }
    }
    if (ev_count != 0 && p.errors != nullptr) {
        atomicAdd(&p.errors[0], ev_count);
        atomicOr(&p.errors[1], ev_flags);
    }
}

// The page work of warp task `t`, dispatched on P (power of two or not)
// and on whether and how an SWA page table is bound (all uniform over the
// grid): none, through the slot map, or through the page map.
MHA_KIT_DEVICE void page_rows(const GraphMetadataParams& p, u32 block_idx) {
    const u32 warp = threadIdx.x >> 5;
    const u32 bs = (u32)p.bs;
    u32 row;
    u32 part;
    if (block_idx < (1u << 28)) {
        const u32 t = block_idx * gm::WARPS + warp;
        row = t % bs;
        part = t / bs;
    } else {
        const u64 t = (u64)block_idx * gm::WARPS + warp;
        row = (u32)(t % bs);
        part = (u32)(t / bs);
    }
    const bool pow2 = (p.page_size & (p.page_size - 1)) == 0;
    const int swa = p.swa_page_table == nullptr ? SWA_NONE
                  : p.swa_page_map != nullptr   ? SWA_PAGE
                                                : SWA_SLOT;
    if (pow2) {
        if (swa == SWA_PAGE) page_task<true, SWA_PAGE>(p, row, part);
        else if (swa == SWA_SLOT) page_task<true, SWA_SLOT>(p, row, part);
        else page_task<true, SWA_NONE>(p, row, part);
    } else {
        if (swa == SWA_PAGE) page_task<false, SWA_PAGE>(p, row, part);
        else if (swa == SWA_SLOT) page_task<false, SWA_SLOT>(p, row, part);
        else page_task<false, SWA_NONE>(p, row, part);
    }
}

MHA_KIT_DEVICE void swa_out_locs(const GraphMetadataParams& p, u32 idx) {
    const i64 step = (i64)p.swa_blocks * gm::THREADS;
    for (i64 j = (i64)idx * gm::THREADS + threadIdx.x; j < p.n_swa; j += step) {
        p.swa_out_cache_loc[j] = gm::swa_out_loc(p, j);
    }
}

}  // namespace

// 8 blocks of THREADS per SM (32 registers): one wave of 132 * 8 blocks on an
// H100/H200 (launch_config aims the page blocks at that).
extern "C" __global__ void __launch_bounds__(gm::THREADS, 8)
graph_metadata_update(const __grid_constant__ GraphMetadataParams p) {
    const u32 b = blockIdx.x;
    if (b == 0) {
        scan_rows(p);
        return;
    }
    const u32 page_blocks = (u32)p.bs * (u32)p.page_chunks;
    if (b <= page_blocks) {
        page_rows(p, b - 1);
        return;
    }
    swa_out_locs(p, b - 1 - page_blocks);
}

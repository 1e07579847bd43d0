// mha-kit kernel family graph-metadata: shared device definitions.
// Semantics: SEMANTICS.md §graph-metadata.2, SEMANTICS.md §page-table.3-6,
// DESIGN.md D1, D2, D9, D11.
// Included by graph_metadata.cu (the fused launch) and by
// graph_metadata_unfused.cu (bench-only baseline), so both compute every
// entry with the same code.
#pragma once
#include "mha_kit/common.cuh"
// Params struct and error flags, generated from the Rust definitions
// (src/launch.rs, src/lib.rs) by `cargo xtask abi`.
#include "graph_metadata_abi.cuh"


namespace gm {

static constexpr i64 I32_MAX = 2147483647LL;

// Ragged verify: query rows of row i, clamped into [0, max_q_len]; 0 when
// qlens is null. `*bad` is set when the clamp changed the value.
MHA_KIT_DEVICE i32 q_len(const GraphMetadataParams& p, i64 row, bool* bad) {
    if (p.qlens == nullptr) {
        *bad = false;
        return 0;
    }
    const i32 q = p.qlens[row];
    *bad = q < 0 || q > p.max_q_len;
    return q < 0 ? 0 : (q > p.max_q_len ? p.max_q_len : q);
}

// cache_seqlens[i] = seq_lens[i] + offset (+ q_len(i) in ragged verify),
// clamped into [0, i32::MAX]. `*bad` is set when the clamp changed the value.
MHA_KIT_DEVICE i32 cache_len(const GraphMetadataParams& p, i64 row, bool* bad) {
    bool bad_q;
    // |offset + q| < 2^34, so bounding seq_lens to ±2^40 first keeps the sum
    // exact on the side of [0, i32::MAX] it falls (no i64 overflow).
    const i64 LIM = 1LL << 40;
    i64 s = p.seq_lens[row];
    s = s < -LIM ? -LIM : (s > LIM ? LIM : s);
    const i64 v = s + p.seqlen_offset + q_len(p, row, &bad_q);
    *bad = v < 0 || v > I32_MAX;
    return (i32)(v < 0 ? 0 : (v > I32_MAX ? I32_MAX : v));
}

// Live pages of a row with KV length `len`: min(ceil(len/P), M), then
// clamped so that the sampled position (n-1)*P stays inside the row's W.
// Returns the count; `*flags` gets GM_ROW_CLAMPED / GM_ROW_PAST_WIDTH.
MHA_KIT_DEVICE i64 live_pages(const GraphMetadataParams& p, i32 len, u32* flags) {
    const i64 P = p.page_size;
    i64 n = mha_kit::ceil_div((i64)len, P);
    *flags = 0;
    if (n > p.max_seq_pages) {
        n = p.max_seq_pages;
        *flags |= GM_ROW_CLAMPED;
    }
    const i64 readable = mha_kit::ceil_div(p.req_to_token_width, P);
    if (n > readable) {
        n = readable;
        *flags |= GM_ROW_PAST_WIDTH;
    }
    return n;
}

// Full-table page id of a sampled slot (D9): slot / P, or 0 (counted) for a
// negative slot or one past the pool.
MHA_KIT_DEVICE i32 full_page(const GraphMetadataParams& p, i64 slot) {
    if (slot < 0) {
        mha_kit::report_error(p.errors, GM_NEGATIVE_SLOT);
        return 0;
    }
    if (p.pool_slots > 0 && slot >= p.pool_slots) {
        mha_kit::report_error(p.errors, GM_SLOT_OUTSIDE_POOL);
        return 0;
    }
    return (i32)(slot / p.page_size);
}

// The map entry a sampled slot reads, or 0 when the slot has no entry to
// read (negative, or at/past N_map - 1). No side effects, so callers may
// issue several of these loads before using any.
MHA_KIT_DEVICE i64 swa_map_load(const GraphMetadataParams& p, i64 slot) {
    return (slot >= 0 && slot < p.swa_mapping_len - 1) ? __ldg(p.swa_mapping + slot) : 0;
}

// SWA-table page id of a sampled slot (D9) given `s2 = swa_map_load(slot)`:
// -1 for a negative slot (counted by full_page already), 0 (counted) for a
// slot at or past N_map - 1, else s2 / P with a negative s2 giving -1.
MHA_KIT_DEVICE i32 swa_page(const GraphMetadataParams& p, i64 slot, i64 s2) {
    if (slot < 0) return -1;
    if (slot >= p.swa_mapping_len - 1) {
        mha_kit::report_error(p.errors, GM_SLOT_OUTSIDE_MAP);
        return 0;
    }
    return s2 < 0 ? -1 : (i32)(s2 / p.page_size);
}

// SWA-table page id of a sampled slot through the full page -> SWA page map
// (page-map path, p.swa_page_map non-null): -1 for a negative slot (counted
// by full_page already), 0 (counted) when slot / P is at or past the map's
// length, else the entry, a negative entry giving -1.
MHA_KIT_DEVICE i32 swa_page_paged(const GraphMetadataParams& p, i64 slot) {
    if (slot < 0) return -1;
    const i64 page = slot / p.page_size;
    if (page >= p.swa_page_map_len) {
        mha_kit::report_error(p.errors, GM_SLOT_OUTSIDE_MAP);
        return 0;
    }
    const i32 v = __ldg(p.swa_page_map + page);
    return v < 0 ? -1 : v;
}

// SWA write location of token j (SEMANTICS.md §graph-metadata.2, item 6): translated real tokens, -1 for a
// negative location, 0 (counted) for one at or past N_map - 1, 0 for the tail.
MHA_KIT_DEVICE i64 swa_out_loc(const GraphMetadataParams& p, i64 j) {
    const i64 n_real = p.out_cache_loc == nullptr ? 0 : (p.n_out < p.n_swa ? p.n_out : p.n_swa);
    if (j >= n_real) return 0;
    const i64 loc = __ldg(p.out_cache_loc + j);
    if (loc < 0) return -1;
    if (loc >= p.swa_mapping_len - 1) {
        mha_kit::report_error(p.errors, GM_LOC_OUTSIDE_MAP);
        return 0;
    }
    return __ldg(p.swa_mapping + loc);
}

// Threads per block of every graph-metadata kernel (src/launch.rs: BLOCK_THREADS).
static constexpr int THREADS = 256;
static constexpr int WARPS = THREADS / 32;

// Block-wide exclusive scan of one i64 per thread (blockDim.x == THREADS):
// mha_kit::block_exclusive_scan (kernel-rt's common.cuh) at this block size.
MHA_KIT_DEVICE i64 block_exclusive_scan(i64 v, i64* total) {
    return mha_kit::block_exclusive_scan<i64, THREADS>(v, total);
}

// The whole of cache_seqlens, cu_seqlens_k (entry 0 included, D1) and, when
// bound, cu_seqlens_q (= i * q_stride, D1, D2; ragged verify: the prefix sum
// of the clamped qlens), by one block of THREADS threads. Each thread owns
// ceil(bs / THREADS) consecutive rows; block scans join them. Row-level
// seq_len / q_len events are reported here (once per row).
MHA_KIT_DEVICE void scan_rows(const GraphMetadataParams& p) {
    const i64 bs = p.bs;
    const i64 per = (bs + THREADS - 1) / THREADS;
    const i64 begin = (i64)threadIdx.x * per;
    const i64 end = begin + per < bs ? begin + per : bs;
    i64 local = 0;
    i64 local_q = 0;
    for (i64 i = begin; i < end; ++i) {
        bool bad;
        const i32 len = cache_len(p, i, &bad);
        if (bad) mha_kit::report_error(p.errors, GM_SEQLEN_OUT_OF_RANGE);
        local_q += q_len(p, i, &bad);
        if (bad) mha_kit::report_error(p.errors, GM_QLEN_OUT_OF_RANGE);
        p.cache_seqlens[i] = len;
        local += len;
    }
    i64 total;
    i64 run = block_exclusive_scan(local, &total);
    for (i64 i = begin; i < end; ++i) {
        bool bad;
        run += cache_len(p, i, &bad);
        // 32-bit sums (SEMANTICS.md §graph-metadata.5): keep the low 32 bits, count the overflow.
        p.cu_seqlens_k[i + 1] = (i32)(u32)(u64)run;
    }
    if (threadIdx.x == 0) {
        p.cu_seqlens_k[0] = 0;
        if (total > I32_MAX) mha_kit::report_error(p.errors, GM_SUM_OVERFLOW);
    }
    if (p.cu_seqlens_q == nullptr) return;
    if (p.qlens != nullptr) {
        // bs * max_q_len fits in i32 (host validation): no overflow.
        i64 total_q;
        i64 run_q = block_exclusive_scan(local_q, &total_q);
        for (i64 i = begin; i < end; ++i) {
            bool bad;
            run_q += q_len(p, i, &bad);
            p.cu_seqlens_q[i + 1] = (i32)run_q;
        }
        if (threadIdx.x == 0) p.cu_seqlens_q[0] = 0;
    } else {
        for (i64 i = threadIdx.x; i <= bs; i += THREADS) {
            p.cu_seqlens_q[i] = (i32)(i * (i64)p.q_stride);
        }
    }
}

}  // namespace gm

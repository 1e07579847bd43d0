// mha-kit kernel family: page table (+ SWA page table) from req_to_token.
// Semantics: SEMANTICS.md §page-table.3-6 and DESIGN.md D9, D11.
// Params structs and error flags: page_table_abi.cuh, generated from the Rust
// definitions (src/launch.rs, src/scatter.rs, src/lib.rs) by `cargo xtask abi`.
#include "mha_kit/common.cuh"
#include "page_table_abi.cuh"


// Pages each thread keeps in flight: their slot loads are all issued before
// any store (the pointers are __restrict__, so the stores cannot alias them).
#define PT_UNROLL 4

// Grid: x = batch row (bs), y = page chunk; block = blockDim.x threads. A
// thread handles pages base + k*blockDim.x (k < PT_UNROLL), then steps by
// gridDim.y*blockDim.x*PT_UNROLL.
extern "C" __global__ void __launch_bounds__(256, 8) page_table_build(const PageTableParams p) {
    const i64 row = blockIdx.x;
    if (row >= p.bs) return;
    // Independent loads first: request index and length in one round trip.
    const i64 r = p.req_pool_indices[row];
    const i64 len = p.cache_seqlens[row];
    // Row-level events are reported once, by the first thread of chunk 0.
    const bool reporter = blockIdx.y == 0 && threadIdx.x == 0;
    if (r < 0 || r >= p.req_to_token_rows) {
        if (reporter) mha_kit::report_error(p.errors, PT_BAD_REQUEST_INDEX);
        return;
    }
    if (len < 0) {
        if (reporter) mha_kit::report_error(p.errors, PT_NEGATIVE_SEQLEN);
        return;
    }
    const i64 P = p.page_size;
    i64 n = mha_kit::ceil_div(len, P);
    if (n > p.max_num_pages) {
        n = p.max_num_pages;
        if (reporter) mha_kit::report_error(p.errors, PT_ROW_CLAMPED);
    }
    const i64 readable = mha_kit::ceil_div(p.req_to_token_width, P);
    if (n > readable) {
        n = readable;
        if (reporter) mha_kit::report_error(p.errors, PT_ROW_PAST_WIDTH);
    }

    const i32* __restrict__ src = p.req_to_token + r * p.req_to_token_stride;
    i32* __restrict__ dst = p.page_table + row * p.page_table_stride;
    i32* __restrict__ swa_dst =
        p.swa_page_table ? p.swa_page_table + row * p.swa_page_table_stride : nullptr;
    const i64* __restrict__ map = p.full_to_swa;
    const i32 P32 = p.page_size;
    const i64 block = blockDim.x;
    const i64 step = (i64)gridDim.y * block * PT_UNROLL;
    for (i64 base = (i64)blockIdx.y * block * PT_UNROLL + threadIdx.x; base < n; base += step) {
        i32 slot[PT_UNROLL];
#pragma unroll
        for (int k = 0; k < PT_UNROLL; ++k) {
            const i64 page = base + k * block;
            slot[k] = page < n ? __ldg(src + page * P) : 0;
        }
#pragma unroll
        for (int k = 0; k < PT_UNROLL; ++k) {
            const i64 page = base + k * block;
            if (page >= n) break;
            const i32 s = slot[k];
            i32 full_page;
            if (s < 0) {
                full_page = 0;
                mha_kit::report_error(p.errors, PT_NEGATIVE_SLOT);
            } else if (p.pool_slots > 0 && s >= p.pool_slots) {
                full_page = 0;
                mha_kit::report_error(p.errors, PT_SLOT_OUTSIDE_POOL);
            } else {
                full_page = s / P32;
            }
            dst[page] = full_page;
            if (swa_dst != nullptr) {
                i32 swa_page;
                if (s < 0) {
                    swa_page = -1;
                } else if (s >= p.full_to_swa_len - 1) {
                    swa_page = 0;
                    mha_kit::report_error(p.errors, PT_SLOT_OUTSIDE_MAP);
                } else {
                    const i64 s2 = __ldg(map + s);
                    // 32-bit division when the SWA slot fits (always, for real pools).
                    swa_page = s2 < 0 ? -1
                             : s2 <= 0x7fffffff ? (i32)s2 / P32
                             : (i32)(s2 / P);
                }
                swa_dst[page] = swa_page;
            }
        }
    }
}

// ---- req_to_token update: scatter (position, slot) entries ----
// SEMANTICS.md §page-table has no update kernel; mha-kit's crate docs (src/lib.rs,
// "Updating req_to_token") define it.


// Grid-stride over entries; 1-D grid of blockDim.x threads.
extern "C" __global__ void __launch_bounds__(256) req_to_token_scatter(const ScatterParams p) {
    const i64 total = p.req_to_token_rows * p.req_to_token_width;
    const i64 step = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step) {
        const longlong2 e = reinterpret_cast<const longlong2*>(p.entries)[i];
        const i64 pos = e.x, slot = e.y;
        if (pos < 0 || pos >= total || slot < -2147483648LL || slot > 2147483647LL) {
            mha_kit::report_error(p.errors, PT_BAD_ENTRY);
            continue;
        }
        const i64 row = pos / p.req_to_token_width;
        const i64 col = pos - row * p.req_to_token_width;
        p.req_to_token[row * p.req_to_token_stride + col] = (i32)slot;
    }
}

// mha-kit kernel family: full -> SWA index translation (hybrid full / SWA KV pool).
// Semantics: SEMANTICS.md §swa-pool.2-4, SEMANTICS.md §page-table.3-6, DESIGN.md D9, D11.
// Params structs and error flags: swa_pool_abi.cuh, generated from the Rust
// definitions (src/launch.rs, src/lib.rs) by `cargo xtask abi`.
//
// The map `full_to_swa` has N_map = size + P + 1 entries; indices [0, N_map - 1)
// are full slots, index N_map - 1 holds the -1 sentinel. A read index outside
// [0, N_map - 1) is never dereferenced.
#include "mha_kit/common.cuh"
#include "swa_pool_abi.cuh"

// Elements per thread per grid-stride step of the location kernel: four
// independent input loads, then four independent map gathers, in flight.
#define LOC_UNROLL 4


// The value written for location `loc` whose map read (at a clamped, always
// valid index) gave `gathered`: locations outside [0, limit) are never read
// through: -1 stays -1 (sentinel), anything else is counted and becomes 0.
MHA_KIT_DEVICE i64 finish_loc(i64 loc, i64 gathered, u64 limit, u32* errors) {
    if ((u64)loc < limit) return gathered;
    if (loc == -1) return -1;
    mha_kit::report_error(errors, loc < 0 ? SWA_BELOW_SENTINEL : SWA_OUTSIDE_MAP);
    return 0;
}

// One thread: LOC_UNROLL elements t + k*blockDim.x + tid of tile t (coalesced
// per k); grid-stride over tiles of blockDim.x * LOC_UNROLL elements. Full
// tiles (the common case) issue their LOC_UNROLL input loads, then their
// LOC_UNROLL map gathers, unconditionally: an index outside the map gathers
// the sentinel entry N_map - 1 (always in bounds) and is then replaced.
extern "C" __global__ void __launch_bounds__(256) swa_pool_translate_loc(const SwaLocParams p) {
    const u64 tile = (u64)blockDim.x * LOC_UNROLL;
    const u64 stride = (u64)gridDim.x * tile;
    const u64 n = (u64)p.n;
    const u64 out_len = (u64)p.out_len;
    // Valid read indices are [0, limit); limit itself is the sentinel's index.
    const u64 limit = (u64)(p.full_to_swa_len - 1);
    for (u64 t = (u64)blockIdx.x * tile; t < out_len; t += stride) {
        const u64 base = t + threadIdx.x;
        i64 loc[LOC_UNROLL];
        i64 got[LOC_UNROLL];
        if (t + tile <= n) {
#pragma unroll
            for (int k = 0; k < LOC_UNROLL; ++k) loc[k] = __ldcs(p.out_cache_loc + base + (u64)k * blockDim.x);
#pragma unroll
            for (int k = 0; k < LOC_UNROLL; ++k) {
                const u64 idx = (u64)loc[k] < limit ? (u64)loc[k] : limit;
                got[k] = __ldg(p.full_to_swa + idx);
            }
#pragma unroll
            for (int k = 0; k < LOC_UNROLL; ++k) {
                __stcs(p.swa_loc + base + (u64)k * blockDim.x, finish_loc(loc[k], got[k], limit, p.errors));
            }
        } else {
            // Last partial tile and the zero tail [n, out_len).
#pragma unroll
            for (int k = 0; k < LOC_UNROLL; ++k) {
                const u64 i = base + (u64)k * blockDim.x;
                loc[k] = i < n ? __ldcs(p.out_cache_loc + i) : 0;
            }
#pragma unroll
            for (int k = 0; k < LOC_UNROLL; ++k) {
                const u64 i = base + (u64)k * blockDim.x;
                const u64 idx = (u64)loc[k] < limit ? (u64)loc[k] : limit;
                got[k] = i < n ? __ldg(p.full_to_swa + idx) : 0;
            }
#pragma unroll
            for (int k = 0; k < LOC_UNROLL; ++k) {
                const u64 i = base + (u64)k * blockDim.x;
                if (i >= out_len) break;
                __stcs(p.swa_loc + i, i < n ? finish_loc(loc[k], got[k], limit, p.errors) : 0);
            }
        }
    }
}


// Grid: x = batch row, y = page chunk; each thread writes pages
// y*blockDim.x + tid, stepping by gridDim.y*blockDim.x.
// swa_page = full_to_swa[req_to_token[r, p*P]] / P: gathered by the full
// *token slot* of the page's first position, then divided (never by page id).
extern "C" __global__ void __launch_bounds__(256) swa_pool_translate_pages(const SwaPageParams p) {
    const i64 row = blockIdx.x;
    if (row >= p.bs) return;
    const bool reporter = blockIdx.y == 0 && threadIdx.x == 0;

    const i64 r = p.req_pool_indices[row];
    if (r < 0 || r >= p.req_to_token_rows) {
        if (reporter) mha_kit::report_error(p.errors, SWA_BAD_REQUEST_INDEX);
        return;
    }
    const i64 len = p.cache_seqlens[row];
    if (len < 0) {
        if (reporter) mha_kit::report_error(p.errors, SWA_NEGATIVE_SEQLEN);
        return;
    }
    const i64 P = p.page_size;
    i64 n = mha_kit::ceil_div(len, P);
    if (n > p.max_num_pages) {
        n = p.max_num_pages;
        if (reporter) mha_kit::report_error(p.errors, SWA_ROW_CLAMPED);
    }
    const i64 readable = mha_kit::ceil_div(p.req_to_token_width, P);
    if (n > readable) {
        n = readable;
        if (reporter) mha_kit::report_error(p.errors, SWA_ROW_PAST_WIDTH);
    }

    const i32* src = p.req_to_token + r * p.req_to_token_stride;
    i32* dst = p.swa_page_table + row * p.swa_page_table_stride;
    const i64 step = (i64)gridDim.y * blockDim.x;
    for (i64 page = (i64)blockIdx.y * blockDim.x + threadIdx.x; page < n; page += step) {
        const i64 slot = __ldg(src + page * P);
        i32 swa_page;
        if (slot < 0) {
            swa_page = -1;
            mha_kit::report_error(p.errors, SWA_NEGATIVE_SLOT);
        } else if (slot >= p.full_to_swa_len - 1) {
            swa_page = 0;
            mha_kit::report_error(p.errors, SWA_OUTSIDE_MAP);
        } else {
            const i64 s2 = __ldg(p.full_to_swa + slot);
            swa_page = s2 < 0 ? -1 : (i32)(s2 / P);
        }
        dst[page] = swa_page;
    }
}

// ---- map update: apply (full_page, swa_page) entries ----
// SEMANTICS.md §swa-pool has no update kernel; the crate docs (src/lib.rs,
// "Updating the map on the device") define it.

// One thread per map element (entry e, offset o), grid-stride; 1-D grid.
extern "C" __global__ void __launch_bounds__(256) swa_pool_update_pages(const SwaUpdateParams p) {
    const i64 P = p.page_size;
    const i64 total = p.n * P;
    const i64 step = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const i64 e = i / P;
        const i64 o = i - e * P;
        const longlong2 ent = reinterpret_cast<const longlong2*>(p.entries)[e];
        const i64 page = ent.x, swa = ent.y;
        if (page < 0 || page >= p.num_full_pages || swa < 0 || swa >= p.num_swa_pages) {
            if (o == 0) mha_kit::report_error(p.errors, SWA_BAD_UPDATE);
            continue;
        }
        p.full_to_swa[page * P + o] = swa == 0 ? 0 : swa * P + o;
        if (o == 0 && p.page_map != nullptr) p.page_map[page] = (i32)swa;
    }
}

// mha-kit paged-attention: what the two context kernels share — the params
// struct and the error flags (`ContextParams` and `PAC_*` in the generated
// paged_attention_abi.cuh: src/context.rs and src/lib.rs define them, `cargo
// xtask abi` writes it), the ragged rule and the once-per-request bad-page
// count. Included by paged_attention_context.cu (compute_90,
// mma.sync) and paged_attention_context_sm90.cu (compute_90a, wgmma).
#pragma once
#include "pa_common.cuh"
#include "paged_attention_abi.cuh"


namespace pac {

struct Geom {
    i32 row_start, n, len;
    bool skip;
};

// The ragged rule (src/lib.rs docs), identical to the decode kernel:
// request b is processed only when 0 <= cu[b] <= cu[b+1] <= num_tokens,
// cu[b+1] - cu[b] <= max_q_len and cu[b] >= cu[k] for every k < b
// (`overlap`: some earlier cu[k] > cu[b]); otherwise skipped (rows
// untouched) and counted once (`report`).
MHA_KIT_DEVICE Geom request_geom_of(const ContextParams& p, int b, i32 s, i32 e, bool overlap, bool report) {
    Geom g;
    g.skip = false;
    u32 flag = 0;
    if (s < 0 || e < s || e > p.num_tokens || overlap) {
        flag = PAC_BAD_CU_SEQLENS;
    } else if (e - s > p.max_q_len) {
        flag = PAC_Q_LEN_TOO_LONG;
    }
    if (flag != 0) {
        if (report) mha_kit::report_error(p.errors, flag);
        g.skip = true;
        g.row_start = 0;
        g.n = 0;
        g.len = 0;
        return g;
    }
    g.row_start = s;
    g.n = e - s;
    i32 len = p.cache_seqlens[b];
    if (len < 0) {
        len = 0;
        if (report) mha_kit::report_error(p.errors, PAC_NEGATIVE_SEQLEN);
    }
    g.len = len;
    return g;
}

// request_geom_of with the overlap scan shared by the block
// (__syncthreads_or: every thread of the block calls it).
MHA_KIT_DEVICE Geom request_geom(const ContextParams& p, int b, bool report) {
    const i32 s = p.cu_seqlens_q[b], e = p.cu_seqlens_q[b + 1];
    int later = 0;
    for (int k = threadIdx.x; k < b; k += blockDim.x) later |= p.cu_seqlens_q[k] > s ? 1 : 0;
    const bool overlap = __syncthreads_or(later) != 0;
    return request_geom_of(p, b, s, e, overlap, report);
}

// request_geom_of with the overlap scan shared by one warp (every lane of
// the warp calls it; warps decide alone, with the same answer).
MHA_KIT_DEVICE Geom request_geom_warp(const ContextParams& p, int b, bool report) {
    const i32 s = p.cu_seqlens_q[b], e = p.cu_seqlens_q[b + 1];
    bool later = false;
    for (int k = (int)(threadIdx.x & 31); k < b; k += 32) later = later || p.cu_seqlens_q[k] > s;
    const bool overlap = __any_sync(0xffffffffu, later);
    return request_geom_of(p, b, s, e, overlap, report);
}

// D10: the reporter CTA of a request counts bad entries among its needed
// pages once (threads tid, tid + nt, ...).
MHA_KIT_DEVICE void report_bad_pages(const ContextParams& p, const Geom& g, int b, int tid, int nt) {
    if (g.n <= 0) return;
    const i32 k_lo_req = p.window_left >= 0 ? max(g.len - g.n - p.window_left, 0) : 0;
    if (k_lo_req >= g.len) return;
    const i32 p_first = k_lo_req / p.page_size;
    const i32 p_last = (g.len - 1) / p.page_size;
    for (i32 pg = p_first + tid; pg <= p_last; pg += nt) {
        bool bad = pg >= p.max_num_pages;
        if (!bad) {
            const i32 id = __ldg(p.page_table + (i64)b * p.page_table_stride + pg);
            bad = id < 0 || id >= p.num_pages;
        }
        if (bad) mha_kit::report_error(p.errors, PAC_BAD_PAGE);
    }
}

// O += P V on CUDA cores for KEYS keys, skipping zero weights: the path of a
// tile whose V holds NaN/Inf next to keys masked for some rows (a tensor-core
// product would give 0 * NaN = NaN there). One warp, its 16 rows: P in the
// m16n8k16 A layout (pa[k16 step][4]: rows gr / gr + 8, keys 2qd.. and
// 8 + 2qd..), O in the accumulator layout (o(n8 block, 2 * half-row + e)).
// `vrow(key, chunk)` is the shared-memory address of 16-byte chunk `chunk`
// (columns 8 chunk ..) of V row `key`.
template <int QT, int KEYS, int D, typename OAcc, typename VRow>
MHA_KIT_DEVICE void pv_scalar(const u32 (&pa)[KEYS / 16][4], int lane, OAcc&& o, VRow&& vrow) {
    const int qd = lane & 3;
#pragma unroll 1
    for (int key = 0; key < KEYS; ++key) {
        const int kk = key >> 4;
        const int half = (key >> 3) & 1;
        const int src = (lane & ~3) | ((key >> 1) & 3);
        float pk[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            u32 w = 0;
#pragma unroll
            for (int i = 0; i < KEYS / 16; ++i) w = i == kk ? (half ? pa[i][2 + hr] : pa[i][hr]) : w;
            w = __shfl_sync(0xffffffffu, w, src);
            pk[hr] = (key & 1) ? half_hi<QT>(w) : half_lo<QT>(w);
        }
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            const u32 vw = *reinterpret_cast<const u32*>(vrow(key, j) + qd * 4);
            const float v0 = half_lo<QT>(vw);
            const float v1 = half_hi<QT>(vw);
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                if (pk[hr] != 0.f) {
                    o(j, 2 * hr) += pk[hr] * v0;
                    o(j, 2 * hr + 1) += pk[hr] * v1;
                }
            }
        }
    }
}

}  // namespace pac

// mha-kit kernel family: paged-KV attention, decode and multi-token verify.
// Semantics: SEMANTICS.md §attention.2-7, SEMANTICS.md §fp8-kv.4, DESIGN.md D4-D6,
// D10, D12, D13. Two kernels:
// paged_attention_decode_* (CUDA cores, every D/dtype; described here) and
// paged_attention_mma_* (tensor cores, D 64-512; see "tensor-core path" below).
//
// Work item = (split s, KV head h x row tile rt, request b). A row tile packs up
// to 16 query rows (token j, head g) of the G heads sharing KV head h,
// token-major (r -> j = r / G, g = r % G), so one CTA reads each KV byte of its
// range once for all of them. KV tiles of 32 tokens stream through a
// cp.async (16 B, L2-only) ring of NST stages; page ids are loaded one tile
// ahead of their use. Online softmax in f32 with exp2 (scale_log2 =
// bmm1_scale * log2 e). Splits write unnormalised partials (O, m, d) to the
// caller's workspace; the last CTA of a work item to arrive (a self-resetting
// atom.inc counter per item in the workspace) folds them in a fixed order and
// writes the rows (merge_last): one launch, deterministic, graph-safe (the
// counters are zero again after every launch).
//
// Params struct and error flags: paged_attention_abi.cuh, generated from the
// Rust definitions (src/launch.rs, src/lib.rs) by `cargo xtask abi`.
#include "mha_kit/common.cuh"
#include "pa_common.cuh"
#include "paged_attention_abi.cuh"


namespace pa {

// Device helpers shared with the context kernel (pa_common.cuh).
using pac::cp_async16;
using pac::cp_async_commit;
using pac::cp_async_wait;
using pac::ex2;
using pac::f16_to_f32;
using pac::ldsm_x4;
using pac::ldsm_x4_t;
using pac::mma16816;
using pac::pack2;
using pac::out_scale;
using pac::row_lse;
using pac::row_max_update;
using pac::smem_u32;
using pac::sum2;

constexpr int T = 32;        // tokens per KV tile (= lanes)
constexpr int NT = 128;      // threads per CTA
constexpr int ROWS = 16;     // query rows per CTA
constexpr int PSTRIDE = T + 1;
constexpr float LOG2E = 1.4426950408889634f;

#define NEG_INF __int_as_float(0xff800000)



MHA_KIT_DEVICE u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

MHA_KIT_DEVICE float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

MHA_KIT_DEVICE u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// QT: 0 = bf16, 1 = f16.
template <int QT>
MHA_KIT_DEVICE float half_to_f32(u16 h) { return QT == 0 ? bf16_to_f32(h) : f16_to_f32(h); }
template <int QT>
MHA_KIT_DEVICE u16 f32_to_half(float f) { return QT == 0 ? f32_to_bf16(f) : f32_to_f16(f); }

// Two e4m3 bytes (low byte = first element) -> two f16 (exact), then f32.
MHA_KIT_DEVICE void e4m3x2_to_f32(u16 b, float& lo, float& hi) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(b));
    lo = f16_to_f32((u16)(h2 & 0xffffu));
    hi = f16_to_f32((u16)(h2 >> 16));
}

// KV: 0 = bf16, 1 = f16, 2 = e4m3. Loads 8 consecutive elements from shared
// memory (16 B, or 8 B for e4m3) and widens them to f32.
template <int KV>
MHA_KIT_DEVICE void load8(const u8* p, float* f) {
    if constexpr (KV == 2) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const u32 w[2] = {u.x, u.y};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            e4m3x2_to_f32((u16)(w[i] & 0xffffu), f[4 * i], f[4 * i + 1]);
            e4m3x2_to_f32((u16)(w[i] >> 16), f[4 * i + 2], f[4 * i + 3]);
        }
    } else {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (KV == 0) {
                f[2 * i] = __uint_as_float(w[i] << 16);
                f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                f[2 * i] = f16_to_f32((u16)(w[i] & 0xffffu));
                f[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
            }
        }
    }
}


// 16-byte async copy global -> shared; src_size 0 zero-fills.

MHA_KIT_DEVICE float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
MHA_KIT_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- programmatic dependent launch (PagedAttentionKernel::set_pdl) ----
// Every entry waits (griddepcontrol.wait) before its first global memory
// access, so a launch with the PDL attribute may start while the previous
// kernel of the stream runs and still reads only what that kernel finished;
// without the attribute the wait returns at once. Each CTA lets the next
// PDL launch start (launch_dependents) once its KV loop is done, so that
// launch's CTAs do not take this grid's SM slots while it still streams KV.
MHA_KIT_DEVICE void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
MHA_KIT_DEVICE void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// ---- geometry shared by both kernels (reference.rs mirrors it) ----
struct Geom {
    i32 row_start, n, len;
    bool skip;
};

// Ragged rule (src/lib.rs docs): request b is processed only when
//   0 <= cu[b] <= cu[b+1] <= num_tokens,  cu[b+1] - cu[b] <= max_q_len,
//   cu[b] >= cu[k] for every k < b (prefix maximum: processed requests never overlap);
// otherwise it is skipped (rows untouched) and counted once. Block-cooperative:
// every thread of the CTA must call it (uses __syncthreads_or).
MHA_KIT_DEVICE Geom request_geom(const PagedAttentionParams& p, int b, bool report) {
    Geom g;
    g.skip = false;
    if (p.cu_seqlens_q != nullptr) {
        const i32 s = p.cu_seqlens_q[b], e = p.cu_seqlens_q[b + 1];
        int later = 0;
        for (int k = threadIdx.x; k < b; k += blockDim.x) later |= p.cu_seqlens_q[k] > s ? 1 : 0;
        const bool overlap = __syncthreads_or(later) != 0;
        u32 flag = 0;
        if (s < 0 || e < s || e > p.num_tokens || overlap) {
            flag = PA_BAD_CU_SEQLENS;
        } else if (e - s > p.q_len) {
            flag = PA_Q_LEN_TOO_LONG;
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
    } else {
        g.row_start = b * p.q_len;
        g.n = p.q_len;
    }
    i32 len = p.cache_seqlens[b];
    if (len < 0) {
        len = 0;
        if (report) mha_kit::report_error(p.errors, PA_NEGATIVE_SEQLEN);
    }
    g.len = len;
    return g;
}

// ---- length order (p.length_order != 0, PagedAttentionKernel::set_length_order) ----
// The CTAs (x, y, z) of a launch serve the work units (request, split) in
// longest-first order: v = x + S_max z numbers the units of the requests in
// descending order of their length bucket k = ceil(cache_seqlens / 128)
// (capped at LO_BUCKETS - 1; a length <= 0 is bucket 0; ties by request
// index), ub(k) consecutive units a request, split s = 0 .. ub(k) - 1, and y
// keeps the KV head and row tile. ub(k) bounds the splits tile_split can
// give any request of bucket k: its needed keys are at most 128 k, so
// n = ceil(leff / fixed_chunk) <= ceil(128 k / fixed_chunk) (Auto: nb <=
// ceil(leff / 128) <= k), never more than S_max, and at least 1 (a request
// without keys still writes its rows); bucket LO_BUCKETS - 1 takes S_max.
// Units v past the last request's are empty and come last in grid order,
// so the block scheduler, which starts CTAs in grid order, starts the
// longest requests first and runs the empty CTAs at the launch's tail
// instead of between the work (longest processing time first). Every
// (request, split < nb) is still served by exactly one CTA per (head, row
// tile), with the same key range, partials and fold: results are
// bit-identical to the grid order. Not for the cluster fold (its cluster
// must be the splits of one item).
// Block-cooperative (every thread calls it, before any other use of
// `scratch`: LO_WORDS u32 of shared memory, free again on return). Cost:
// one pass over cache_seqlens (bs / NT loads a thread, issued together up to
// bs 512) and three barriers, and for a CTA with work a second pass (L1
// hits) and three more.
// Not inlined: its registers stay out of the kernels' budgets (inlined, the
// CUDA-core D 64 entries spilled 8 bytes).
constexpr int LO_BUCKETS = 256;
constexpr int LO_WORDS = LO_BUCKETS + NT / 32 + 3;

// Length bucket of request j in descending order: 0 holds the longest.
MHA_KIT_DEVICE int lo_rank_bucket(const i32* cache_seqlens, int j) {
    const i32 len = cache_seqlens[j];
    const i32 k = len <= 0 ? 0 : min((len >> 7) + ((len & 127) != 0 ? 1 : 0), LO_BUCKETS - 1);
    return LO_BUCKETS - 1 - k;
}

// ub(k): splits tile_split can give a request of length bucket k (see above).
MHA_KIT_DEVICE u32 lo_splits_bound(int k, int smax, int fixed_chunk) {
    if (k >= LO_BUCKETS - 1) return (u32)smax;
    const u32 keys = (u32)k * 128u;
    const u32 n = fixed_chunk > 0 ? (keys + (u32)fixed_chunk - 1u) / (u32)fixed_chunk : (u32)k;
    return max(1u, min(n, (u32)smax));
}

// The unit (request, split) of CTA (x, z), or request -1 for an empty CTA.
__device__ __noinline__ int2 unit_in_length_order(const i32* cache_seqlens, int bs, int smax, int fixed_chunk,
                                                  int x, int z, u32* scratch) {
    u32* hist = scratch;               // [LO_BUCKETS] requests per bucket (descending)
    u32* wsum = scratch + LO_BUCKETS;  // [NT / 32] per-warp counts of one pass
    u32* sel = wsum + NT / 32;         // bucket (or ~0: empty), rank inside it, split
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const u32 v = (u32)x + (u32)smax * (u32)z;
    for (int i = tid; i < LO_BUCKETS; i += NT) hist[i] = 0u;
    __syncthreads();
    constexpr int LO_LOADS = 4;  // lengths a thread loads at once (one round trip up to bs 512)
    for (int base = 0; base < bs; base += NT * LO_LOADS) {
        int k[LO_LOADS];
#pragma unroll
        for (int u = 0; u < LO_LOADS; ++u) {
            const int j = base + u * NT + tid;
            k[u] = j < bs ? lo_rank_bucket(cache_seqlens, j) : -1;
        }
        // One shared atomic per distinct bucket of a warp (the batch's
        // requests share few buckets: same-address atomics would serialize).
#pragma unroll
        for (int u = 0; u < LO_LOADS; ++u) {
            const u32 same = __match_any_sync(0xffffffffu, k[u]);
            if (k[u] >= 0 && (same & ((1u << lane) - 1u)) == 0u) atomicAdd(&hist[k[u]], (u32)__popc(same));
        }
    }
    __syncthreads();
    if (warp == 0) {
        // Lane l scans rank buckets PER l .. PER l + PER - 1, each holding
        // hist * ub units; the bucket holding unit v (if any).
        constexpr int PER = LO_BUCKETS / 32;
        u32 c[PER];
        u32 sum = 0u;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            c[i] = hist[PER * lane + i];
            if (c[i] != 0u) c[i] *= lo_splits_bound(LO_BUCKETS - 1 - (PER * lane + i), smax, fixed_chunk);
            sum += c[i];
        }
        u32 incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        if (lane == 31 && v >= incl) sel[0] = ~0u;  // past the last unit
        u32 start = incl - sum;
        int hit = -1;
        u32 hit_start = 0u;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            if (v >= start && v < start + c[i]) {
                hit = i;
                hit_start = start;
            }
            start += c[i];
        }
        if (hit >= 0) {
            const int d = PER * lane + hit;
            const u32 ub = lo_splits_bound(LO_BUCKETS - 1 - d, smax, fixed_chunk);
            const u32 off = v - hit_start;
            sel[0] = (u32)d;
            sel[1] = off / ub;
            sel[2] = off - (off / ub) * ub;
        }
    }
    __syncthreads();
    const u32 d = sel[0];
    if (d == ~0u) {
        __syncthreads();  // every thread has read sel before the caller reuses scratch
        return make_int2(-1, 0);
    }
    const u32 r = sel[1];
    const int split = (int)sel[2];
    // The r-th request (by index) of rank bucket d, NT requests a pass.
    u32 seen = 0u;
    for (int base = 0; base < bs; base += NT) {
        const int j = base + tid;
        const bool f = j < bs && lo_rank_bucket(cache_seqlens, j) == (int)d;
        const u32 bal = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wsum[warp] = (u32)__popc(bal);
        __syncthreads();
        u32 before = seen + (u32)__popc(bal & ((1u << lane) - 1u));
        u32 total = 0u;
#pragma unroll
        for (int q = 0; q < NT / 32; ++q) {
            before += q < warp ? wsum[q] : 0u;
            total += wsum[q];
        }
        if (f && before == r) sel[0] = (u32)j;
        seen += total;
        __syncthreads();
        if (seen > r) break;  // CTA-uniform
    }
    const int b = (int)sel[0];
    __syncthreads();  // every thread has read sel before the caller reuses scratch
    return make_int2(b, split);
}

// The unit (request, split) of this CTA, or request -1 for an empty one:
// grid order (z, x), or with `p.length_order` longest requests first (the
// block's shared memory as scratch, L::BYTES of it). An ordered launch of
// one split given the batch's order (`p.unit_order`, written once per batch
// by paged_attention_unit_order below) reads its request there: unit v = z,
// the same unit unit_in_length_order gives, without the ranking. Every
// thread loads the same word (one request, uniform across the CTA); an
// entry outside [0, bs) empties the CTA and is counted once (its y = 0 CTA).
template <class L, class Params>
MHA_KIT_DEVICE int2 decode_unit(const Params& p, u8* smem) {
    static_assert(L::BYTES >= LO_WORDS * 4, "length order scratch");
    if (p.length_order != 0 && p.unit_order != nullptr && p.max_splits == 1) {
        const i32 b = p.unit_order[blockIdx.z];
        if (b < 0 || b >= p.bs) {
            if (threadIdx.x == 0 && blockIdx.y == 0) mha_kit::report_error(p.errors, PA_BAD_UNIT_ORDER);
            return make_int2(-1, 0);
        }
        return make_int2(b, 0);
    }
    return p.length_order != 0 ? unit_in_length_order(p.cache_seqlens, p.bs, p.max_splits, p.fixed_chunk, blockIdx.x,
                                                      blockIdx.z, reinterpret_cast<u32*>(smem))
                               : make_int2((int)blockIdx.z, (int)blockIdx.x);
}

// ---- the batch's length order, once (PagedAttentionKernel::write_unit_order) ----
// order[0 .. bs) = the requests in descending length bucket
// (lo_rank_bucket), ties by index: the order unit_in_length_order gives one
// split a request. One CTA of LO_BUCKETS threads: a histogram of the
// buckets, its exclusive scan (each bucket's first position), then a stable
// scatter, UO_NT requests a round: a request's position is its bucket's
// next position plus the requests of its bucket before it in the round
// (earlier warps' counts, then earlier lanes' by __match_any_sync).
constexpr int UO_NT = LO_BUCKETS;
MHA_KIT_DEVICE void unit_order_body(const i32* cache_seqlens, int bs, i32* order) {
    __shared__ u32 first[LO_BUCKETS];              // next position of each bucket
    __shared__ u32 cnt[UO_NT / 32][LO_BUCKETS];    // a round's count by warp and bucket
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const u32 lt = (1u << lane) - 1u;
    first[tid] = 0u;
    __syncthreads();
    for (int base = 0; base < bs; base += UO_NT) {
        const int j = base + tid;
        const int k = j < bs ? lo_rank_bucket(cache_seqlens, j) : -1;
        const u32 same = __match_any_sync(0xffffffffu, k);
        if (k >= 0 && (same & lt) == 0u) atomicAdd(&first[k], (u32)__popc(same));
    }
    __syncthreads();
    // Exclusive scan of first[] (thread d holds bucket d; every thread has
    // read its own bucket before the scan's barriers, and writes only it).
    u32 all;
    first[tid] = mha_kit::block_exclusive_scan<u32, UO_NT>(first[tid], &all);
    for (int base = 0; base < bs; base += UO_NT) {
        for (int i = tid; i < (UO_NT / 32) * LO_BUCKETS; i += UO_NT) (&cnt[0][0])[i] = 0u;
        __syncthreads();
        const int j = base + tid;
        const int k = j < bs ? lo_rank_bucket(cache_seqlens, j) : -1;
        const u32 same = __match_any_sync(0xffffffffu, k);
        if (k >= 0 && (same & lt) == 0u) cnt[warp][k] = (u32)__popc(same);
        __syncthreads();
        if (k >= 0) {
            u32 pos = first[k] + (u32)__popc(same & lt);
            for (int q = 0; q < warp; ++q) pos += cnt[q][k];
            // In range unless the lengths changed between the two passes
            // (a writer racing this launch): never written past the end.
            if (pos < (u32)bs) order[pos] = j;
        }
        __syncthreads();
        u32 add = 0u;
#pragma unroll
        for (int q = 0; q < UO_NT / 32; ++q) add += cnt[q][tid];
        first[tid] += add;
        __syncthreads();  // cnt read before the next round zeroes it
    }
}

// ---- decode context parallelism: page interleave (p.cp_ranks > 1) ----
// Rank p.cp_rank of p.cp_ranks holds every request's pages e with
// e mod N = rank, as its local pages e div N: local key k sits at global
// position ((k div P) N + rank) P + k mod P (reference.rs `Interleave`,
// block = P). cache_seqlens and the rows' positions stay global; keys and
// pages are indexed locally.
// How many of this rank's keys sit at global positions < g (0 for g <= 0):
// the local index of its first key at a position >= g.
MHA_KIT_DEVICE i32 cp_count_below(const PagedAttentionParams& p, i32 g) {
    if (g <= 0) return 0;
    const i32 cycle = p.cp_ranks * p.page_size;
    return (g / cycle) * p.page_size + min(max(g % cycle - p.cp_rank * p.page_size, 0), p.page_size);
}

// Key range [k_lo, k_hi) of a row tile and its split partition.
struct Split {
    i32 rows;        // rows in this tile (0 = none)
    i32 k_lo, k_hi;  // needed keys of the tile
    i32 chunk;       // tokens per split
    i32 nb;          // splits used (>= 1 when rows > 0)
};

MHA_KIT_DEVICE Split tile_split(const PagedAttentionParams& p, const Geom& g, int rt) {
    Split s;
    const i32 total = g.n * p.group;
    const i32 r0 = rt * ROWS;
    s.rows = total > r0 ? min(ROWS, total - r0) : 0;
    s.k_lo = 0;
    s.k_hi = 0;
    s.chunk = 1;
    s.nb = 1;
    if (s.rows == 0) return s;
    const i32 j_min = r0 / p.group;
    const i32 j_max = (r0 + s.rows - 1) / p.group;
    const i32 x_min = g.len - g.n + j_min;
    const i32 x_max = g.len - g.n + j_max;
    s.k_hi = max(x_max + 1, 0);
    s.k_lo = p.window_left >= 0 ? max(x_min - p.window_left, 0) : 0;
    if (p.cp_ranks > 1) {
        // Local keys of the tile's global range.
        s.k_hi = cp_count_below(p, x_max + 1);
        s.k_lo = p.window_left >= 0 ? cp_count_below(p, x_min - p.window_left) : 0;
    }
    const i32 leff = s.k_hi > s.k_lo ? s.k_hi - s.k_lo : 0;
    if (leff == 0) {
        s.k_hi = s.k_lo;
        return s;
    }
    if (p.fixed_chunk > 0) {
        s.chunk = p.fixed_chunk;
        i32 nb = (leff + s.chunk - 1) / s.chunk;
        if (nb > p.max_splits) {
            s.chunk *= (nb + p.max_splits - 1) / p.max_splits;
        }
    } else {
        const i32 want = min(p.max_splits, (leff + 127) / 128);
        const i32 c = (leff + want - 1) / want;
        const i32 tt = p.tile_tokens > 0 ? p.tile_tokens : T;
        s.chunk = (c + tt - 1) / tt * tt;
    }
    s.nb = (leff + s.chunk - 1) / s.chunk;
    return s;
}


// D10 for the tensor-core entries: count bad entries among request b's
// needed pages once, shared by the `nb` splits of row tile 0 of KV head 0
// (split `part` walks the part-th of nb equal page ranges), so no CTA walks
// a long request's whole page table alone (PERF.md session 31: at bs 1 x 32k
// the single walker landed its first K/V tile ~40 us after the others).
// Needed pages: from the window start of the request's first row to its
// last key; under the page interleave this rank's local pages, read at their
// page-table columns. Out-of-range columns and ids are counted, never read
// through.
MHA_KIT_DEVICE void count_bad_pages(const PagedAttentionParams& p, int b, const Geom& g, int part, int nb,
                                    int tid, int nt) {
    i32 k_lo_req = p.window_left >= 0 ? max(g.len - g.n - p.window_left, 0) : 0;
    i32 k_end = g.len;
    if (p.cp_ranks > 1) {
        k_lo_req = p.window_left >= 0 ? cp_count_below(p, g.len - g.n - p.window_left) : 0;
        k_end = cp_count_below(p, g.len);
    }
    if (k_lo_req >= k_end) return;
    const i32 p_first = k_lo_req / p.page_size;
    const i32 npages = (k_end - 1) / p.page_size - p_first + 1;
    const i32 per = (npages + nb - 1) / nb;
    const i32 lo = p_first + (i32)part * per;
    const i32 hi = p_first + min((i32)(part + 1) * per, npages);  // exclusive
    for (i32 pg = lo + tid; pg < hi; pg += nt) {
        const i32 col = pg * p.cp_ranks + p.cp_rank;
        bool bad = col >= p.max_num_pages;
        if (!bad) {
            const i32 id = __ldg(p.page_table + (i64)b * p.page_table_stride + col);
            bad = id < 0 || id >= p.num_pages;
        }
        if (bad) mha_kit::report_error(p.errors, PA_BAD_PAGE);
    }
}

// ---- fused split merge (last-arriving CTA of a work item) ----
// Workspace: ws_o [items, S_max, 16, D] f32, ws_ml [items, S_max, 16, 2] f32,
// then one u32 arrival counter per item (items = bs * Hkv * row_tiles). The
// counters must be zero before the first launch; every launch leaves them
// zero: atom.inc wraps to 0 on the last of the nb arrivals.
MHA_KIT_DEVICE u32* split_counters(const PagedAttentionParams& p) {
    const i64 items = (i64)p.bs * p.num_kv_heads * p.row_tiles;
    return reinterpret_cast<u32*>(p.ws_ml + items * p.max_splits * ROWS * 2);
}

// The fold of nb split partials of one work item (nrows rows of D), by
// every thread of the CTA, in a fixed order (split s -> lane s mod 32 for
// the row statistics, sequential s for each output element): the result
// depends only on the partials. `ml(rr, s)` and `o(rr, s, c4)` read split
// s's (m, d) of row rr and its four dims 4 c4.. of O. Writes the output
// elements [u_lo, u_hi) of the nrows D / 4 four-dim groups (and the row
// LSE with a row's first group). `scratch`: `cap` f32 (>= 2 ROWS + 4) of
// shared memory no thread still reads; the (m, d) of every (row, split)
// are held there when 2 nb nrows of them fit and SMEM (otherwise re-read
// per use).
template <int QT, int D, bool SMEM, class ML, class O>
MHA_KIT_DEVICE void fold_splits(const PagedAttentionParams& p, const Geom& g, int nb, int nrows, int r0, int h,
                                float* scratch, int cap, int u_lo, int u_hi, ML ml_at, O o_at) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Per (row, split) statistics in shared memory when they fit: m at
    // sm_m[rr nb + s] (overwritten by the weight 2^(m - M)), d at sm_d.
    float* sm_m = scratch + 2 * ROWS + 4;
    float* sm_d = sm_m + nb * nrows;
    const bool in_smem = SMEM && 2 * ROWS + 4 + 2 * nb * nrows <= cap;
    // Row statistics: M = max m over splits with d > 0, den = sum d 2^(m - M).
    for (int rr = warp; rr < nrows; rr += NT / 32) {
        float mx = NEG_INF;
        for (int s = lane; s < nb; s += 32) {
            const float2 ml = ml_at(rr, s);
            if (in_smem) {
                sm_m[rr * nb + s] = ml.x;
                sm_d[rr * nb + s] = ml.y;
            }
            if (ml.y > 0.f) mx = fmaxf(mx, ml.x);
        }
        mx = warp_max(mx);
        float den = 0.f;
        if (mx != NEG_INF) {
            for (int s = lane; s < nb; s += 32) {
                const float2 ml = in_smem ? make_float2(sm_m[rr * nb + s], sm_d[rr * nb + s]) : ml_at(rr, s);
                if (ml.y > 0.f) {
                    const float w = ex2(ml.x - mx);
                    den += ml.y * w;
                    if (in_smem) sm_m[rr * nb + s] = w;
                }
            }
        }
        den = warp_sum(den);  // butterfly: every lane gets the same bits
        if (lane == 0) {
            scratch[rr] = mx;
            scratch[ROWS + rr] = den;
        }
    }
    __syncthreads();

    // Numerators: one 4-dim group of one row per thread and step.
    constexpr int C4 = D / 4;
    for (int u = u_lo + (int)threadIdx.x; u < u_hi; u += NT) {
        const int rr = u / C4, c4 = u % C4;
        const float mx = scratch[rr];
        const float den = scratch[ROWS + rr];
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (den > 0.f) {
            if (in_smem) {
                const float* wr = sm_m + rr * nb;
                const float* dr = sm_d + rr * nb;
#pragma unroll 8
                for (int s = 0; s < nb; ++s) {
                    const float4 o = o_at(rr, s, c4);
                    if (dr[s] > 0.f) {
                        const float w = wr[s];
                        acc.x = fmaf(w, o.x, acc.x);
                        acc.y = fmaf(w, o.y, acc.y);
                        acc.z = fmaf(w, o.z, acc.z);
                        acc.w = fmaf(w, o.w, acc.w);
                    }
                }
            } else {
#pragma unroll 8
                for (int s = 0; s < nb; ++s) {
                    const float2 ml = ml_at(rr, s);
                    const float4 o = o_at(rr, s, c4);
                    if (ml.y > 0.f) {
                        const float w = ex2(ml.x - mx);
                        acc.x = fmaf(w, o.x, acc.x);
                        acc.y = fmaf(w, o.y, acc.y);
                        acc.z = fmaf(w, o.z, acc.z);
                        acc.w = fmaf(w, o.w, acc.w);
                    }
                }
            }
        }
        const int rg = r0 + rr;
        const int j = rg / p.group, qh = h * p.group + rg % p.group;
        const float scale = out_scale(den, mx, p.sinks, qh, p.bmm2_scale);
        const u32 lo = f32_to_half<QT>(acc.x * scale) | ((u32)f32_to_half<QT>(acc.y * scale) << 16);
        const u32 hi = f32_to_half<QT>(acc.z * scale) | ((u32)f32_to_half<QT>(acc.w * scale) << 16);
        u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + c4 * 4;
        *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
        if (p.lse != nullptr && c4 == 0)
            p.lse[(i64)(g.row_start + j) * p.lse_stride_tok + qh] = row_lse(den, mx, p.sinks, qh);
    }
}

// Block-cooperative (every thread of the CTA calls it, after the CTA stored its
// partial for split `split` of `item` in the workspace). The CTA that arrives
// last folds the nb partials (fold_splits) and writes the final rows.
// `scratch`: `cap` f32 (>= 2 ROWS + 4) of shared memory no thread still reads.
//
// Latency (the fold is the tail of a split launch: the other CTAs are done):
// the (m, d) of every (row, split) are read from the workspace once, into
// shared memory, when they fit there; the numerator loop then loads only the
// partial outputs, several splits in flight a thread. SMEM = false (the
// CUDA-core kernel, whose D 64 entries are held to 64 registers) always
// re-reads.
template <int QT, int D, bool SMEM>
MHA_KIT_DEVICE void merge_last(const PagedAttentionParams& p, const Geom& g, i64 item, int nb, int nrows,
                               int r0, int h, float* scratch, int cap) {
    u32* flag = reinterpret_cast<u32*>(scratch + 2 * ROWS);
    __threadfence();  // this CTA's partial is visible before its arrival counts
    __syncthreads();
    if (threadIdx.x == 0) {
        const u32 old = atomicInc(split_counters(p) + item, (u32)(nb - 1));
        *flag = old == (u32)(nb - 1) ? 1u : 0u;
    }
    __syncthreads();
    if (*flag == 0u) return;
    __threadfence();

    const i64 base0 = item * p.max_splits * ROWS;  // (item, split 0, row 0)
    const float2* ws_ml2 = reinterpret_cast<const float2*>(p.ws_ml);
    const float4* ws_o4 = reinterpret_cast<const float4*>(p.ws_o);
    fold_splits<QT, D, SMEM>(
        p, g, nb, nrows, r0, h, scratch, cap, 0, nrows * (D / 4),
        [&](int rr, int s) { return __ldcg(ws_ml2 + base0 + (i64)s * ROWS + rr); },
        [&](int rr, int s, int c4) { return __ldcg(ws_o4 + (base0 + (i64)s * ROWS + rr) * (D / 4) + c4); });
}

// ---- split merge inside a thread-block cluster ----
// When the splits of a work item run as one cluster (the launcher's cluster
// dimension = gridDim.x = max_splits, so the CTA rank is the split), each CTA
// leaves its partial in its own shared memory and the cluster folds them
// over distributed shared memory: no workspace stores, no fence, no arrival
// counter, no L2 round trips at the launch's tail (H200, bs 1 x 1k: 9.3 ->
// 8.9 us, PERF.md session 22). The launcher forms clusters only where the
// whole grid fits on the GPU at once (else a second wave of clusters).
MHA_KIT_DEVICE u32 cluster_ctas() {
    u32 n;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
// Every thread of every CTA of the cluster: arrive (release), then wait (acquire).
MHA_KIT_DEVICE void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// Address `a` of this CTA's shared memory in the shared memory of cluster CTA `rank`.
MHA_KIT_DEVICE u32 cluster_map(u32 a, u32 rank) {
    u32 r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
MHA_KIT_DEVICE float2 cluster_ld2(u32 a) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}
MHA_KIT_DEVICE float4 cluster_ld4(u32 a) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
}

// Block-cooperative, called by every CTA of the cluster whose split is
// < nb, after it stored its partial at `part` (this CTA's shared memory:
// O rows f32 [ROWS][D], then (m, d) f32 [ROWS][2]); the CTAs of splits
// >= nb call cluster_sync twice instead. Rank r writes the output elements
// [r U / nb, (r + 1) U / nb) of the U = nrows D / 4 four-dim groups; every
// rank computes every row's statistics (fold_splits, as merge_last: the
// rows are bit-identical to the workspace fold).
// `scratch`: `cap` f32 (>= 2 ROWS + 4 + 2 nb ROWS) apart from `part`.
template <int QT, int D>
MHA_KIT_DEVICE void merge_cluster(const PagedAttentionParams& p, const Geom& g, int rank, int nb, int nrows,
                                  int r0, int h, const float* part, float* scratch, int cap) {
    cluster_sync();  // every partial of the cluster is stored and visible
    const u32 o_at = smem_u32(part);
    const u32 ml_at = o_at + ROWS * D * 4;
    const int units = nrows * (D / 4);
    fold_splits<QT, D, true>(
        p, g, nb, nrows, r0, h, scratch, cap, rank * units / nb, (rank + 1) * units / nb,
        [&](int rr, int s) { return cluster_ld2(cluster_map(ml_at + rr * 8, (u32)s)); },
        [&](int rr, int s, int c4) { return cluster_ld4(cluster_map(o_at + (rr * D + 4 * c4) * 4, (u32)s)); });
    cluster_sync();  // no CTA leaves (its shared memory) while another reads it
}

// Shared-memory layout (bytes); src/launch.rs `smem_bytes` mirrors it.
template <int D, int KV, int NST>
struct Smem {
    static constexpr int ES = KV == 2 ? 1 : 2;
    static constexpr int RB = D * ES;       // bytes per head row
    static constexpr int SRB = RB + 16;     // padded row stride: conflict-free row reads
    static constexpr int CPR = RB / 16;     // 16-byte chunks per row
    static constexpr int Q_OFF = 0;                              // f32 [ROWS][D]
    static constexpr int K_OFF = Q_OFF + ROWS * D * 4;           // [NST][T][SRB]
    static constexpr int V_OFF = K_OFF + NST * T * SRB;
    static constexpr int P_OFF = V_OFF + NST * T * SRB;          // f32 [ROWS][PSTRIDE]
    static constexpr int A_OFF = P_OFF + ROWS * PSTRIDE * 4;     // f32 alpha [ROWS]
    static constexpr int M_OFF = A_OFF + ROWS * 4;               // f32 m [ROWS]
    static constexpr int DN_OFF = M_OFF + ROWS * 4;              // f32 d [ROWS]
    static constexpr int VAL_OFF = DN_OFF + ROWS * 4;            // u32 valid [NST]
    static constexpr int BYTES = (VAL_OFF + NST * 4 + 15) / 16 * 16;
};

template <int QT, int KV, int D>
MHA_KIT_DEVICE void decode_body(const PagedAttentionParams& p) {
    constexpr int NST = D <= 128 ? 3 : 2;
    using L = Smem<D, KV, NST>;
    constexpr int ES = L::ES;
    constexpr int SRB = L::SRB;
    constexpr int CPR = L::CPR;
    constexpr int NCH = D / 8;           // 8-element chunks per row (phase 3)
    constexpr int RPT = ROWS * NCH / NT; // rows per thread in phase 3 = D / 64
    constexpr int LOAD_ITERS = T * CPR / NT;
    static_assert(LOAD_ITERS >= 1 && (T * CPR) % NT == 0, "tile load split");
    static_assert(RPT >= 1, "rows per thread");

    extern __shared__ __align__(16) u8 smem[];
    float* qs = reinterpret_cast<float*>(smem + L::Q_OFF);
    u8* ks = smem + L::K_OFF;
    u8* vs = smem + L::V_OFF;
    float* ps = reinterpret_cast<float*>(smem + L::P_OFF);
    float* alpha_s = reinterpret_cast<float*>(smem + L::A_OFF);
    float* m_s = reinterpret_cast<float*>(smem + L::M_OFF);
    float* d_s = reinterpret_cast<float*>(smem + L::DN_OFF);
    u32* valid_s = reinterpret_cast<u32*>(smem + L::VAL_OFF);

    const int h = blockIdx.y % p.num_kv_heads;
    const int rt = p.row_tile_base + blockIdx.y / p.num_kv_heads;
    const int2 unit = decode_unit<L>(p, smem);
    if (unit.x < 0) return;  // length order: past the last unit
    const int split = unit.y;
    const int b = unit.x;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;

    const bool reporter_cta = split == 0 && h == 0 && rt == 0;
    const Geom g = request_geom(p, b, reporter_cta && tid == 0);
    if (g.skip) return;

    // D10: count bad entries among the request's needed pages, once.
    if (reporter_cta && g.n > 0) {
        const i32 k_lo_req = p.window_left >= 0 ? max(g.len - g.n - p.window_left, 0) : 0;
        if (k_lo_req < g.len) {
            const i32 p_first = k_lo_req / p.page_size;
            const i32 p_last = (g.len - 1) / p.page_size;
            for (i32 pg = p_first + tid; pg <= p_last; pg += NT) {
                bool bad = pg >= p.max_num_pages;
                if (!bad) {
                    const i32 id = __ldg(p.page_table + (i64)b * p.page_table_stride + pg);
                    bad = id < 0 || id >= p.num_pages;
                }
                if (bad) mha_kit::report_error(p.errors, PA_BAD_PAGE);
            }
        }
    }

    const Split sp = tile_split(p, g, rt);
    if (sp.rows == 0 || split >= sp.nb) return;
    const i32 ks0 = sp.k_lo + split * sp.chunk;
    const i32 ke = min(ks0 + sp.chunk, sp.k_hi);  // ks0 == ke only when the tile has no key
    const int ntiles = ke > ks0 ? (ke - ks0 + T - 1) / T : 0;
    const int nrows = sp.rows;
    const int r0 = rt * ROWS;

    // Q rows -> f32 shared memory (rows >= nrows zero).
    for (int c = tid; c < ROWS * NCH; c += NT) {
        const int r = c / NCH, ch = c % NCH;
        float f[8];
        if (r < nrows) {
            const int rg = r0 + r;
            const int j = rg / p.group, gq = rg % p.group;
            const u16* src = p.q + (i64)(g.row_start + j) * p.q_stride_tok +
                             (i64)(h * p.group + gq) * p.q_stride_head + ch * 8;
            const uint4 u = mha_kit::load16(src);
            const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                f[2 * i] = half_to_f32<QT>((u16)(w[i] & 0xffffu));
                f[2 * i + 1] = half_to_f32<QT>((u16)(w[i] >> 16));
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) f[i] = 0.f;
        }
        float4* dst = reinterpret_cast<float4*>(qs + r * D + ch * 8);
        dst[0] = make_float4(f[0], f[1], f[2], f[3]);
        dst[1] = make_float4(f[4], f[5], f[6], f[7]);
    }

    const i32* pt_row = p.page_table + (i64)b * p.page_table_stride;
    const i64 k_head = (i64)h * p.k_stride_head;
    const i64 v_head = (i64)h * p.v_stride_head;

    // Page lookup of token (tile ti, lane): loaded one iteration before use.
    i32 pf_id = 0, pf_off = 0;
    bool pf_ok = false;
    auto lookup = [&](int ti) {
        const i32 k = ks0 + ti * T + lane;
        pf_ok = ti < ntiles && k < ke;
        const i32 pg = pf_ok ? k / p.page_size : 0;
        pf_off = k - pg * p.page_size;
        pf_ok = pf_ok && pg < p.max_num_pages;
        pf_id = pf_ok ? __ldg(pt_row + pg) : 0;
    };
    auto issue = [&](int ti) {
        if (ti >= ntiles) return;
        const int stage = ti % NST;
        const bool ok = pf_ok && pf_id >= 0 && pf_id < p.num_pages;
        const i64 koff = ok ? ((i64)pf_id * p.k_stride_page + k_head + (i64)pf_off * p.k_stride_tok) * ES : 0;
        const i64 voff = ok ? ((i64)pf_id * p.v_stride_page + v_head + (i64)pf_off * p.v_stride_tok) * ES : 0;
        const u32 mask = __ballot_sync(0xffffffffu, ok);
        if (tid == 0) valid_s[stage] = mask;
        const u32 kdst = smem_u32(ks + stage * T * SRB);
        const u32 vdst = smem_u32(vs + stage * T * SRB);
#pragma unroll
        for (int it = 0; it < LOAD_ITERS; ++it) {
            const int c = tid + it * NT;
            const int tt = c / CPR, cc = c % CPR;
            const i64 ko = __shfl_sync(0xffffffffu, koff, tt);
            const i64 vo = __shfl_sync(0xffffffffu, voff, tt);
            const bool tok = (mask >> tt) & 1u;
            const u32 sz = tok ? 16u : 0u;
            cp_async16(kdst + tt * SRB + cc * 16, p.k_cache + (tok ? ko + cc * 16 : 0), sz);
            cp_async16(vdst + tt * SRB + cc * 16, p.v_cache + (tok ? vo + cc * 16 : 0), sz);
        }
    };

    // Pipeline prologue: tiles 0 .. NST-2 in flight, ids of tile NST-1 loading.
#pragma unroll
    for (int s = 0; s < NST - 1; ++s) {
        lookup(s);
        issue(s);
        cp_async_commit();
    }
    lookup(NST - 1);

    // Phase-1 rows of this warp: r = warp + 4 q.
    float m_r[4], d_r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        m_r[q] = NEG_INF;
        d_r[q] = 0.f;
    }
    const int nq = nrows > warp ? (nrows - warp + 3) / 4 : 0;
    // Phase-3 mapping: rows rg3*RPT + i, dims ch*8 .. ch*8+7.
    const int rg3 = tid / NCH, ch = tid % NCH;
    const bool p3_active = rg3 * RPT < nrows;
    float o[RPT][8];
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[i][e] = 0.f;

    const i32 x_base = g.len - g.n;  // position of row j is x_base + j
    for (int i = 0; i < ntiles; ++i) {
        cp_async_wait<NST - 2>();
        __syncthreads();
        issue(i + NST - 1);
        cp_async_commit();
        lookup(i + NST);

        const int stage = i % NST;
        // ---- phase 1: scores for the warp's rows, lane = token ----
        const i32 k = ks0 + i * T + lane;
        const bool kval = (valid_s[stage] >> lane) & 1u;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        bool masked_loaded = false;  // a loaded key this tile that some row must not see
        const u8* krow = ks + stage * T * SRB + lane * SRB;
#pragma unroll 4
        for (int d0 = 0; d0 < D; d0 += 8) {
            float kf[8];
            load8<KV>(krow + d0 * ES, kf);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                if (q < nq) {
                    const float4* qp = reinterpret_cast<const float4*>(qs + (warp + 4 * q) * D + d0);
                    const float4 a = qp[0], c = qp[1];
                    float s = acc[q];
                    s = fmaf(a.x, kf[0], s);
                    s = fmaf(a.y, kf[1], s);
                    s = fmaf(a.z, kf[2], s);
                    s = fmaf(a.w, kf[3], s);
                    s = fmaf(c.x, kf[4], s);
                    s = fmaf(c.y, kf[5], s);
                    s = fmaf(c.z, kf[6], s);
                    s = fmaf(c.w, kf[7], s);
                    acc[q] = s;
                }
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (q < nq) {
                const int r = warp + 4 * q;
                const i32 x = x_base + (r0 + r) / p.group;
                const bool vis = kval && k <= x && (p.window_left < 0 || k >= x - p.window_left);
                masked_loaded = masked_loaded || (kval && !vis);
                const float sc = vis ? acc[q] * p.scale_log2 : NEG_INF;
                const float mnew = fmaxf(m_r[q], warp_max(sc));
                float alpha, pr;
                if (mnew == NEG_INF) {
                    alpha = 1.f;
                    pr = 0.f;
                } else {
                    alpha = ex2(m_r[q] - mnew);
                    pr = vis ? ex2(sc - mnew) : 0.f;
                }
                d_r[q] = d_r[q] * alpha + warp_sum(pr);
                m_r[q] = mnew;
                ps[r * PSTRIDE + lane] = pr;
                if (lane == 0) alpha_s[r] = alpha;
            }
        }
        // Whether a loaded key of this tile is masked for some row (verify:
        // the causal diagonal, the window edge; never in a q_len 1 decode,
        // whose rows share one position). Such a tile skips zero weights in
        // P V: a masked V holding NaN/Inf must not reach a row as 0 * NaN.
        const bool partial = __syncthreads_or(masked_loaded) != 0;
        // ---- phase 3: O = O * alpha + P V ----
        if (p3_active) {
#pragma unroll
            for (int ii = 0; ii < RPT; ++ii) {
                const int rr = rg3 * RPT + ii;
                const float a = rr < nrows ? alpha_s[rr] : 1.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) o[ii][e] *= a;
            }
            const u8* vbase = vs + stage * T * SRB + ch * 8 * ES;
            auto pv = [&](const bool careful) {  // inlined twice: careful is a constant
#pragma unroll 4
                for (int t = 0; t < T; ++t) {
                    float vf[8];
                    load8<KV>(vbase + t * SRB, vf);
#pragma unroll
                    for (int ii = 0; ii < RPT; ++ii) {
                        const int rr = rg3 * RPT + ii;
                        if (rr < nrows) {
                            const float pr = ps[rr * PSTRIDE + t];
                            if (careful && pr == 0.f) continue;
#pragma unroll
                            for (int e = 0; e < 8; ++e) o[ii][e] = fmaf(pr, vf[e], o[ii][e]);
                        }
                    }
                }
            };
            if (partial) {
                pv(true);
            } else {
                pv(false);
            }
        }
    }
    cp_async_wait<0>();
    pdl_launch_dependents();

    // Row statistics to shared memory.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        if (q < nq && lane == 0) {
            m_s[warp + 4 * q] = m_r[q];
            d_s[warp + 4 * q] = d_r[q];
        }
    }
    __syncthreads();

    if (!p3_active) {
        // no rows of this thread
    } else if (sp.nb == 1) {
        // Final write: sink joins the denominator once (raw logit), bmm2, D13 zeros.
#pragma unroll
        for (int ii = 0; ii < RPT; ++ii) {
            const int rr = rg3 * RPT + ii;
            if (rr >= nrows) continue;
            const int rg = r0 + rr;
            const int j = rg / p.group, qh = h * p.group + rg % p.group;
            const float m = m_s[rr], d = d_s[rr];
            if (p.lse != nullptr && ch == 0)
                p.lse[(i64)(g.row_start + j) * p.lse_stride_tok + qh] = row_lse(d, m, p.sinks, qh);
            const float scale = out_scale(d, m, p.sinks, qh, p.bmm2_scale);
            u32 packed[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 lo = f32_to_half<QT>(o[ii][2 * e] * scale);
                const u32 hi = f32_to_half<QT>(o[ii][2 * e + 1] * scale);
                packed[e] = lo | (hi << 16);
            }
            u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + ch * 8;
            mha_kit::store16(dst, make_uint4(packed[0], packed[1], packed[2], packed[3]));
        }
    } else {
        const i64 item = ((i64)b * p.num_kv_heads + h) * p.row_tiles + rt;
        const i64 base = (item * p.max_splits + split) * ROWS;
#pragma unroll
        for (int ii = 0; ii < RPT; ++ii) {
            const int rr = rg3 * RPT + ii;
            if (rr >= nrows) continue;
            float4* dst = reinterpret_cast<float4*>(p.ws_o + (base + rr) * D + ch * 8);
            dst[0] = make_float4(o[ii][0], o[ii][1], o[ii][2], o[ii][3]);
            dst[1] = make_float4(o[ii][4], o[ii][5], o[ii][6], o[ii][7]);
            if (ch == 0) {
                p.ws_ml[(base + rr) * 2] = m_s[rr];
                p.ws_ml[(base + rr) * 2 + 1] = d_s[rr];
            }
        }
    }
    if (sp.nb > 1) {
        const i64 item = ((i64)b * p.num_kv_heads + h) * p.row_tiles + rt;
        merge_last<QT, D, false>(p, g, item, sp.nb, nrows, r0, h, qs, ROWS * D);
    }
}

// ======================= tensor-core path (mma.sync) =======================
// Same work items, split rule and workspace format as decode_body, with
// 64-token CTA tiles (p.tile_tokens = 64; 32 at D 512, where the warps work
// in pairs, MmaSmem::DH). Each of the 4 warps owns a
// 16-token slice of every tile and runs its own cp.async ring of NST slots:
// it loads and consumes only its own tokens, so the main loop has no CTA
// barrier. Per slice:
//   S[16 rows x 16 tokens] = Q_A (registers) . K^T  (ldmatrix, m16n8k16, f32)
//   online softmax on S (rows g and g+8 per thread, quad shuffles)
//   O[16 x D] += P (bf16/f16 from S, A layout) . V (ldmatrix.trans)
// e4m3 KV: f16 MMAs (bf16 Q scaled per row by a power of two, exact), K and
// V bytes read from the raw ring straight into B fragments (permuted k / n
// orders, each element converted once by cvt.rn.f16x2.e4m3x2, V pairs
// formed by byte permutes): no converted copy in shared memory.
// Warps keep their own (m, d, O); they are merged through shared memory at
// the end and written like decode_body (final rows or split partials).
// Smem rows of 16-bit K/V are XOR-swizzled by 16-byte chunk (chunk ^ (row & 7)):
// conflict-free ldmatrix without padding.

constexpr int MW = 4;         // warps per CTA
constexpr int MWT = 16;       // tokens per warp slice

template <int D, int KV, int XV = 0>
struct MmaSmem {
    static constexpr int ES = KV == 2 ? 1 : 2;
    // Experiment XV & 8: Q in shared memory — e4m3 KV: its A-fragments
    // (Q8_SMEM), 16-bit KV: its rows, read by ldmatrix (Q_SMEM, as D 256) —
    // and a ring of 4 (e4m3) / 2 (16-bit) slots, so that three CTAs fit an
    // SM (registers <= 168, shared memory <= 76 KB a CTA).
    static constexpr bool X8 = (XV & 8) != 0;
    static constexpr bool Q8_SMEM = KV == 2 && X8;
    static constexpr int NST = KV == 2 ? (X8 ? 4 : 6) : (X8 ? 2 : 3);  // ring slots per warp
    // D 512 (16-bit KV) and e4m3 KV at D 256 / 512: the warps work in
    // groups of DH, warp w on slice w / DH of the tile and dims
    // [DW (w % DH), DW (w % DH) + DW) of every K / V row it loads (DW = 256
    // dims a warp for 16-bit KV, as at D 256; 128 for e4m3, as at D 128): O
    // splits across the group (the accumulators a thread of those head
    // dims) and each warp's S over its share of the dims is summed with the
    // others' through shared memory (XS), so each K / V byte is still read
    // once. A tile is then NSL = 4 / DH slices of 16 keys (TT = 16 NSL).
    static constexpr int DH = KV == 2 ? (D > 128 ? D / 128 : 1) : (D >= 512 ? 2 : 1);
    static constexpr int DW = D / DH;                  // dims a warp loads and accumulates
    static constexpr int NSL = MW / DH;                // warp slices a tile
    static constexpr int TT = NSL * MWT;               // tokens a CTA tile
    static constexpr int RRB = DW * ES;                // raw (loaded) ring row bytes
    static constexpr int CPR = RRB / 16;               // 16-byte chunks per raw row
    static constexpr int HRB = DW * 2;                 // 16-bit ring row bytes
    static constexpr int QRB = D * 2;                  // Q row bytes (Q_SMEM)
    static constexpr int SLOT = MWT * RRB * 2;         // K rows then V rows
    static constexpr int WRING = NST * SLOT;           // per warp
    static constexpr int RING = MW * WRING;
    static constexpr int OS = D + 8;                   // merge scratch row stride (f32)
    static constexpr int MERGE = NSL * ROWS * OS * 4;  // aliases the ring after the loop
    static constexpr int ST_OFF = RING;                // f32 m[MW][16], d[MW][16]
    static constexpr int VM_OFF = ST_OFF + 2 * MW * ROWS * 4;  // u32 [MW][NST][2] valid masks
    // DH > 1: the groups' partial S, f32 [NSL][2 parities][DH][32 lanes][8]
    // (double-buffered by slice parity: one group barrier a slice).
    static constexpr int XS_OFF = VM_OFF + MW * NST * 2 * 4;
    static constexpr int XS_BYTES = DH > 1 ? NSL * 2 * DH * 32 * 8 * 4 : 0;
    // D 256: Q A-fragments are read from shared memory each slice (16 rows
    // of D 16-bit values, 16-byte chunks XOR-swizzled by row & 7) instead of
    // being held in 4 D / 16 registers a thread, which with the 2 D / 8
    // accumulators would spill.
    static constexpr bool Q_SMEM = KV != 2 && (D >= 256 || X8);
    static constexpr int Q_OFF = (XS_OFF + XS_BYTES + 15) / 16 * 16;
    // Q8_SMEM: u32 [D / 16 k-steps][32 lanes][4] (each lane's A-fragment of
    // a k-step as one 16-byte word), after the rows of Q_SMEM (never both).
    static constexpr int Q8_OFF = Q_OFF + (Q_SMEM ? ROWS * D * 2 : 0);
    static constexpr int BYTES = Q8_OFF + (Q8_SMEM ? (D / 16) * 32 * 16 : 0);
    static_assert(MERGE <= RING, "merge scratch fits in the ring");
    static_assert(DH == 1 || (XV == 0 && (KV == 2 || Q_SMEM)), "dim groups: production entries only");
    static_assert(DW == 128 || DW == 256 || DH == 1, "dim groups of 128 (e4m3) or 256 (16-bit) dims");
    static_assert(XS_OFF % 16 == 0, "pair exchange aligned");
    // The cluster fold: this CTA's partial (O rows, (m, d)) after the merge
    // scratch, then the fold's scratch (CLUSTER_CAP f32: the statistics of
    // up to 8 splits).
    static constexpr int CLUSTER_CAP = 2 * ROWS + 4 + 2 * 8 * ROWS;
    static_assert(MERGE + (ROWS * D + 2 * ROWS + CLUSTER_CAP) * 4 <= RING, "cluster fold scratch fits in the ring");
    static_assert(CPR % 4 == 0, "4 lanes per token row");
};



// Two f32 -> packed 16-bit pair (lo in the low half), round to nearest even.
// Sum of the two 16-bit values of a packed pair, in f32.

// e4m3 pair in the low / high 16 bits of w -> packed f16x2 (exact).
MHA_KIT_DEVICE u32 e4m3x2_lo(u32 w) {
    u32 r;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\t}" : "=r"(r) : "r"(w));
    return r;
}
MHA_KIT_DEVICE u32 e4m3x2_hi(u32 w) {
    u32 r;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, h;\n\t}" : "=r"(r) : "r"(w));
    return r;
}

// e4m3 smem rows (tensor-core path) are read straight into MMA fragments; the
// 16-byte chunk swizzles keep those reads conflict-free (see mma_body).
template <int CPR>
MHA_KIT_DEVICE int k8_swz(int row) { return CPR >= 8 ? (row & 1) : 0; }
template <int CPR>
MHA_KIT_DEVICE int v8_swz(int row) { return row & 6 & (CPR - 1); }

// Page lookup of the two tokens (lt, lt + 8) a lane loads in one slice.
struct Look {
    i32 id0, off0, id1, off1;
    bool ok0, ok1;
};

// K/V copies. 16-bit KV: one warp instruction copies 32 / CPR whole token
// rows (lane = 16-byte chunk), the rows' page addresses passed by shuffles,
// so that a row reaches the L2 as one request, with no L2 prefetch hint
// (H200, bs 64 x 8k bf16, session 10: 499.2 us; with the hint 535.7; the
// lane-quad layout below with the hint, session 9's copy, 558.4). e4m3 KV
// at D 128 (the XA entries) the same, 4 rows of 128 bytes an instruction
// (H100, FP8 bs 64 x 8k, session 42: 400.2 -> 395.6 us; the lane quads
// with the hint had the L2 78.6% busy at 79% of the DRAM peak). Other
// e4m3 entries: each lane quad copies 64-byte parts of rows lt and lt + 8
// and asks the L2 for the row's whole 128-byte block (`.L2::128B`).
// XV: the form of an entry, all with correct results (the entries' table
// at the end of this file). XV & 8: Q read from shared memory each slice
// and a shorter ring (MmaSmem::X8); XV & 16: a per-CTA trace (below); XV &
// 32: the cluster fold; XV & 64: lean copy addresses (below, `XA`; the D 128
// entries' form since session 31); XV & 256: the half-row loop (`H`); XV &
// 1024: the e4m3 copies of the XA entries before W (`LQ`). (Sessions
// 9-10's copy-layout experiments x1-x5 — the L2 prefetch hint toggled,
// lane-quad copies of 16-bit rows, whole-row copies of e4m3 rows — were
// measured, docs/PERF.md sessions 9-10, and their entries dropped in
// session 23 for room.)
template <int QT, int KV, int D, int XV = 0>
MHA_KIT_DEVICE void mma_body(const PagedAttentionParams& p) {
    using L = MmaSmem<D, KV, XV>;
    constexpr int NST = L::NST;
    constexpr int ES = L::ES;
    constexpr int RRB = L::RRB;
    constexpr int HRB = L::HRB;
    constexpr int CPR = L::CPR;
    constexpr int DH = L::DH;
    constexpr int DW = L::DW;
    constexpr int TT = L::TT;
    constexpr int KSTEPS = DW / 16;  // k-steps of this warp's S (its dims)
    constexpr int NT8 = DW / 8;      // n8 tiles of this warp's O
    constexpr int MT = KV == 2 ? 1 : QT;  // MMA input type: e4m3 KV runs f16 MMAs
    constexpr int NCH = D / 8;            // epilogue: 8-dim chunks per row
    constexpr int RPT = ROWS * NCH / NT;  // epilogue: rows per thread
    static_assert(RPT >= 1 && RPT * NT == ROWS * NCH, "epilogue mapping");

    extern __shared__ __align__(16) u8 smem[];
    float* ms = reinterpret_cast<float*>(smem + L::ST_OFF);
    float* dsum = ms + MW * ROWS;
    u32* vm_s = reinterpret_cast<u32*>(smem + L::VM_OFF);

    const int h = blockIdx.y % p.num_kv_heads;
    const int rt = p.row_tile_base + blockIdx.y / p.num_kv_heads;

    // Timing experiment XV & 16: a per-CTA trace in place of the skip
    // counter (8 u64 a CTA, linear CTA order): %smid in the low word and the
    // length order's ranking in ns (`decode_unit`; 0 in grid order) in the
    // high word, then %globaltimer at entry (before the ranking), length
    // read, first K/V tile landed, loop end, partial or rows written, exit;
    // the last word: 1 = this CTA folded the splits, 2 = no work (an empty
    // CTA of the length order: entry and exit only). The launcher requires
    // 16 u32 a CTA of `skipped_slices`.
    constexpr bool TR = (XV & 16) != 0;
    unsigned long long* trace = nullptr;
    auto now = []() {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
    };
    if constexpr (TR) {
        if (p.skip_counter != nullptr && threadIdx.x == 0) {
            const i64 cta = blockIdx.x + (i64)gridDim.x * (blockIdx.y + (i64)gridDim.y * blockIdx.z);
            trace = reinterpret_cast<unsigned long long*>(p.skip_counter) + 8 * cta;
            trace[1] = now();
            trace[7] = 0;
        }
    }
    auto stamp = [&](int k) {
        if constexpr (TR) {
            if (trace != nullptr) trace[k] = now();
        }
    };
    auto no_work = [&]() {
        if constexpr (TR) {
            if (trace != nullptr) {
                for (int k = 2; k < 6; ++k) trace[k] = 0;
                stamp(6);
                trace[7] = 2;
            }
        }
    };
    const int2 unit = decode_unit<L>(p, smem);
    if constexpr (TR) {
        if (trace != nullptr) {
            u32 sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            trace[0] = (unsigned long long)sm | ((now() - trace[1]) << 32);
        }
    }
    if (unit.x < 0) {  // length order: past the last unit
        no_work();
        return;
    }
    const int split = unit.y;
    const int b = unit.x;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    // D 512 (DH = 2): warp slice ws of the tile, dim half hf (L::DH).
    const int ws = warp / DH;
    const int hf = warp % DH;

    const bool reporter_cta = split == 0 && h == 0 && rt == 0;
    // Per-request events once over the ranks (rank 0); page events by the
    // rank that holds the page.
    const Geom g = request_geom(p, b, reporter_cta && tid == 0 && p.cp_rank == 0);
    if (g.skip) {
        no_work();
        return;
    }
    stamp(2);

    const Split sp = tile_split(p, g, rt);
    // XV & 32 (the `_cf` entries): the splits of an item fold inside their
    // cluster (merge_cluster) when the launcher made them one; sp is the
    // same for every CTA of a cluster (same request, head and row tile).
    // Separate entries: the path costs the other entries registers (e4m3
    // D 128: 201 -> 232) and 3-7% of their bandwidth (PERF.md session 22).
    constexpr bool CF = (XV & 32) != 0;
    const bool in_cluster = CF && cluster_ctas() > 1 && sp.nb > 1;
    if (sp.rows == 0 || split >= sp.nb) {
        if (in_cluster && sp.rows > 0) {
            cluster_sync();  // merge_cluster's two barriers
            cluster_sync();
        }
        no_work();
        return;
    }
    const i32 ks0 = sp.k_lo + split * sp.chunk;
    const i32 ke = min(ks0 + sp.chunk, sp.k_hi);
    const int ntiles = ke > ks0 ? (ke - ks0 + TT - 1) / TT : 0;
    const int nrows = sp.rows;
    const int r0 = rt * ROWS;

    // XV & 64 (XA; session 28's experiment 64, the D 128 entries' form since
    // session 31): the copies' per-slice address work cut down
    // (SASS, e4m3 D 128: ~75 of the loop's ~560 instructions a slice formed
    // four row addresses from sign-extended 64-bit products): each row
    // address is two `mad.wide.u32` (ids, offsets and strides are
    // non-negative and fit i32 where a row is loaded), the lane's chunk is
    // folded into its base once (the second chunk an immediate), an
    // unloaded row keeps the lane's base (a zero-size copy reads nothing),
    // the ring slot is a counter instead of `t % NST`, and the page-table
    // row pointer is held, not rebuilt from the parameters every lookup.
    constexpr bool XA = (XV & 64) != 0;
    // LQ (XV & 1024, timing experiment of the e4m3 XA entry): K/V copied as
    // before W (session 42), each lane quad 64-byte parts of rows lt and
    // lt + 8 with the L2 asked for the row's whole 128-byte block, instead
    // of W's whole rows without the hint. W read -1.2% on an H100; on the
    // H200 of session 44 the FP8 rows read 3.5-5% slower than on the H200s
    // before W (PERF.md session 44): this entry measures W there.
    constexpr bool LQ = (XV & 1024) != 0;
    static_assert(!LQ || (XA && KV == 2), "LQ: the e4m3 XA entries");
    const i32* pt_row = p.page_table + (i64)b * p.page_table_stride;
    if constexpr (XA) pt_row = pac::opaque_ptr(pt_row);
    // DH = 2: this warp's dim half starts DW elements into each row.
    const i64 k_head = (i64)h * p.k_stride_head + (DH > 1 ? hf * DW : 0);
    const i64 v_head = (i64)h * p.v_stride_head + (DH > 1 ? hf * DW : 0);
    const u8* k_base = p.k_cache + k_head * ES;
    const u8* v_base = p.v_cache + v_head * ES;
    // Page and token strides in bytes; i32 by the launcher's rule
    // (`mma_strides_fit`), so each row address is 32 x 32 -> 64-bit products.
    const i32 ksp_b = (i32)(p.k_stride_page * ES), kst_b = (i32)(p.k_stride_tok * ES);
    const i32 vsp_b = (i32)(p.v_stride_page * ES), vst_b = (i32)(p.v_stride_tok * ES);

    // ---- loader: lane loads tokens lt and lt + 8 of the warp slice, chunks cq + 4 i ----
    const int lt = lane >> 2;
    const int cq = lane & 3;
    const i32 slice0 = ks0 + ws * MWT;  // first key of this warp's slice in tile 0
    u8* ring = smem + warp * L::WRING;
    const u32 ring_u32 = smem_u32(ring);
    // XA: the lane's copy base, the row start (the XA entries copy whole
    // rows: each lane adds its own chunk after the shuffle of a row address).
    const u8* k_lane = k_base;
    const u8* v_lane = v_base;
    if constexpr (XA) {
        k_lane = pac::opaque_ptr(k_lane);
        v_lane = pac::opaque_ptr(v_lane);
    }
    // XA, e4m3 KV: the lane's fragment read offsets, held instead of rebuilt
    // from the lane index every slice: K rows gr (+ 8 RRB for gr + 8), words
    // c at xk_rd[c]; V rows 2qd, 2qd + 1, 2qd + 8, 2qd + 9 share one
    // swizzled chunk: xv_rd + {0, 1, 8, 9} RRB.
    u32 xk_rd[KV == 2 ? D / 64 : 1], xv_rd = 0;
    if constexpr (XA && KV == 2) {
        const int gr_ = lane >> 2, qd_ = lane & 3;
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
            xk_rd[c] = pac::opaque_u32(gr_ * RRB + (((qd_ * (D / 64) + c) ^ k8_swz<CPR>(gr_)) << 4));
        const int vbyte = gr_ * (D / 8);
        xv_rd = pac::opaque_u32(2 * qd_ * RRB + ((((vbyte >> 4) ^ v8_swz<CPR>(2 * qd_))) << 4) + (vbyte & 15));
    }

    // Page cursor: tiles are looked up in order (t = 0, 1, 2, ...), so the
    // (page, offset) of this lane's tokens k0 = slice0 + t TT + lt and k0 + 8
    // advance by (TT / P, TT % P) with one carry: two divisions per thread
    // in place of two per slice (FP8 bs 64 x 8k, session 18: ~45 of the
    // loop's ~680 instructions a slice were the divisions).
    // Under the page interleave the cursor holds page-table columns (local
    // page i is column i N + rank): a carry steps N columns.
    const i32 psz = p.page_size;
    const i32 cpn = p.cp_ranks;
    const i32 adv_pg = TT / psz;
    const i32 adv_off = TT - adv_pg * psz;
    const i32 adv_col = adv_pg * cpn;
    i32 cur_pg0 = (slice0 + lt) / psz;
    i32 cur_off0 = slice0 + lt - cur_pg0 * psz;
    i32 cur_pg1 = (slice0 + lt + 8) / psz;
    i32 cur_off1 = slice0 + lt + 8 - cur_pg1 * psz;
    cur_pg0 = cur_pg0 * cpn + p.cp_rank;
    cur_pg1 = cur_pg1 * cpn + p.cp_rank;
    auto lookup = [&](Look& lk, int t) {
        const i32 k0 = slice0 + t * TT + lt;
        const i32 k1 = k0 + 8;
        const bool in = t < ntiles;
        const i32 pg0 = cur_pg0, pg1 = cur_pg1;
        lk.off0 = cur_off0;
        lk.off1 = cur_off1;
        lk.ok0 = in && k0 < ke && pg0 < p.max_num_pages;
        lk.ok1 = in && k1 < ke && pg1 < p.max_num_pages;
        lk.id0 = lk.ok0 ? __ldg(pt_row + pg0) : 0;
        lk.id1 = lk.ok1 ? __ldg(pt_row + pg1) : 0;
        cur_off0 += adv_off;
        cur_pg0 += adv_col;
        if (cur_off0 >= psz) {
            cur_off0 -= psz;
            cur_pg0 += cpn;
        }
        cur_off1 += adv_off;
        cur_pg1 += adv_col;
        if (cur_off1 >= psz) {
            cur_off1 -= psz;
            cur_pg1 += cpn;
        }
    };
    // xs: the slot under XA (t % NST otherwise).
    auto issue = [&](const Look& lk, int t, int xs) {
        if (t >= ntiles) return;  // warp-uniform
        const int slot = XA ? xs : t % NST;
        const bool ok0 = lk.ok0 && lk.id0 >= 0 && lk.id0 < p.num_pages;
        const bool ok1 = lk.ok1 && lk.id1 >= 0 && lk.id1 < p.num_pages;
        const u32 m0 = __ballot_sync(0xffffffffu, ok0);
        const u32 m1 = __ballot_sync(0xffffffffu, ok1);
        if (lane == 0) {
            vm_s[(warp * NST + slot) * 2] = m0;
            vm_s[(warp * NST + slot) * 2 + 1] = m1;
        }
        // Token row addresses: two 32 x 32 -> 64-bit multiply-adds each (the
        // launcher sends this kernel page / token byte strides that fit i32).
        const u8* k0p = XA ? k_lane : p.k_cache;
        const u8* v0p = XA ? v_lane : p.v_cache;
        const u8* k1p = XA ? k_lane : p.k_cache;
        const u8* v1p = XA ? v_lane : p.v_cache;
        auto rows = [&](const u8*& kp, const u8*& vp, i32 id, i32 off) {
            if constexpr (XA) {
                kp = pac::mad_wide_u32(off, kst_b, pac::mad_wide_u32(id, ksp_b, k_lane));
                vp = pac::mad_wide_u32(off, vst_b, pac::mad_wide_u32(id, vsp_b, v_lane));
            } else {
                kp = k_base + (i64)id * ksp_b + (i64)off * kst_b;
                vp = v_base + (i64)id * vsp_b + (i64)off * vst_b;
            }
        };
        if (ok0) rows(k0p, v0p, lk.id0, lk.off0);
        if (ok1) rows(k1p, v1p, lk.id1, lk.off1);
        const u32 sz0 = ok0 ? 16u : 0u;
        const u32 sz1 = ok1 ? 16u : 0u;
        const u32 kdst = ring_u32 + slot * L::SLOT;
        const u32 vdst = kdst + MWT * RRB;
        // 16-byte copy; with HINT (the lane-quad e4m3 copies) the L2 is
        // asked for the row's whole 128/256-byte block.
        auto cp = [&](u32 dst, const u8* src, u32 sz) {
            constexpr bool HINT = KV == 2 && (!XA || LQ);
            if constexpr (!HINT || RRB < 128) {
                cp_async16(dst, src, sz);
            } else if constexpr (RRB >= 256) {
                pac::cp_async16_l2_256(dst, src, sz);
            } else {
                pac::cp_async16_l2_128(dst, src, sz);
            }
        };
        if constexpr (KV != 2 || (XA && !LQ)) {
            // Whole rows (16-bit KV; e4m3 KV in the XA entries).
            // Instruction j: tokens j (32 / CPR) + lane / CPR, chunk lane % CPR.
            // Token t's page address lives in lane 4 (t & 7) (k0p for t < 8,
            // k1p after): tokens of the first CPR / 4 instructions are < 8.
            constexpr int TPI = 32 / CPR;
            static_assert(TPI >= 1 && MWT % TPI == 0, "whole rows per instruction");
#pragma unroll
            for (int j = 0; j < MWT / TPI; ++j) {
                const int t = j * TPI + lane / CPR;
                const int c = lane % CPR;
                const bool hi = j >= MWT / TPI / 2;
                const int src = 4 * (t & 7);
                const u8* kp = reinterpret_cast<const u8*>(__shfl_sync(
                    0xffffffffu, reinterpret_cast<unsigned long long>(hi ? k1p : k0p), src));
                const u8* vp = reinterpret_cast<const u8*>(__shfl_sync(
                    0xffffffffu, reinterpret_cast<unsigned long long>(hi ? v1p : v0p), src));
                const bool ok = (((hi ? m1 : m0) >> src) & 1u) != 0u;
                const u32 sz = ok ? 16u : 0u;
                // 16-bit rows: chunk ^ (row & 7) for ldmatrix; e4m3 rows: the
                // K / V swizzles of the register-direct reads (as below).
                const int kc = KV == 2 ? c ^ k8_swz<CPR>(t) : c ^ (t & 7);
                const int vc = KV == 2 ? c ^ v8_swz<CPR>(t) : kc;
                if constexpr (XA) {
                    cp(kdst + t * RRB + kc * 16, kp + c * 16, sz);
                    cp(vdst + t * RRB + vc * 16, vp + c * 16, sz);
                } else {
                    cp(kdst + t * RRB + kc * 16, kp + (ok ? c * 16 : 0), sz);
                    cp(vdst + t * RRB + vc * 16, vp + (ok ? c * 16 : 0), sz);
                }
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < CPR / 4; ++i) {
            const int cc = cq + 4 * i;
            // 16-bit rows: chunk ^ (row & 7) for ldmatrix; e4m3 rows: the
            // K / V swizzles of the register-direct reads.
            int kc0 = cc ^ (lt & 7), kc1 = cc ^ ((lt + 8) & 7), vc0 = kc0, vc1 = kc1;
            if constexpr (KV == 2) {
                kc0 = cc ^ k8_swz<CPR>(lt);
                kc1 = cc ^ k8_swz<CPR>(lt + 8);
                vc0 = cc ^ v8_swz<CPR>(lt);
                vc1 = cc ^ v8_swz<CPR>(lt + 8);
            }
            // e4m3 outside the XA entries and under LQ (16-bit K/V and the
            // other XA entries returned above). Row addresses are row starts
            // in both (an unloaded row's is a valid base, copied with size 0).
            cp(kdst + lt * RRB + kc0 * 16, k0p + (ok0 ? cc * 16 : 0), sz0);
            cp(vdst + lt * RRB + vc0 * 16, v0p + (ok0 ? cc * 16 : 0), sz0);
            cp(kdst + (lt + 8) * RRB + kc1 * 16, k1p + (ok1 ? cc * 16 : 0), sz1);
            cp(vdst + (lt + 8) * RRB + vc1 * 16, v1p + (ok1 ? cc * 16 : 0), sz1);
        }
    };

    // P2 (XV & 4096, the `_pair` entries of bf16 Q with e4m3 K/V): a step
    // takes two consecutive tiles of the warp (slices of 16 keys, TT keys
    // apart) with one softmax over their 32 keys: four independent S chains
    // instead of two, one row-max exchange, rescale and set of votes for 32
    // keys instead of 16, and P V as two k-steps (session 45; the FP8
    // decode is latency-bound at two warps a scheduler, PERF.md session
    // 42). The ring then keeps NST - 2 tiles in flight beyond the pair.
    constexpr bool P2 = (XV & 4096) != 0;
    static_assert(!P2 || (KV == 2 && XA && !L::Q8_SMEM && DH == 1 && NST >= 4), "P2: the e4m3 D 128 XA entries");

    // ---- pipeline: ids two tiles ahead of their issue, data NST-1 tiles ahead ----
    // (P2: NST - 2 tiles ahead.)
    // All prologue page ids are requested before the first issue waits on one.
    constexpr int PRO = P2 ? NST - 2 : NST - 1;
    Look pro[PRO];
    Look la, lb;
    auto prologue = [&]() {
#pragma unroll
        for (int s = 0; s < PRO; ++s) lookup(pro[s], s);
        lookup(la, PRO);
        lookup(lb, PRO + 1);
#pragma unroll
        for (int s = 0; s < PRO; ++s) {
            issue(pro[s], s, s);
            cp_async_commit();
        }
    };

    // ---- Q A-fragments (rows g and g + 8 of the tile), positions, stats ----
    const int gr = lane >> 2;  // fragment row group
    const int qd = lane & 3;   // thread in quad
    constexpr bool QS = L::Q_SMEM;
    static_assert(!QS || KV != 2, "e4m3 KV keeps Q in registers");
    u32 qa[QS ? 1 : KSTEPS][4];
    i32 xr[2], xlo[2];
    float rs[2];  // per-row factor turning raw S into log2 units
    const i32 x_base = g.len - g.n;
    // Skip-softmax (DecodeArgs::skip_softmax): a slice whose logits all sit
    // below every row's running max by log2(f / L) or more is skipped;
    // -inf: off (the comparison below is then never true).
    const bool skip_on = p.skip_log2_factor > NEG_INF && g.len > 0;
    const float skip_thr = skip_on ? p.skip_log2_factor - __log2f((float)g.len) : NEG_INF;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int row = gr + 8 * hr;
        const bool valid = row < nrows;
        const int rg = r0 + row;
        const int j = valid ? rg / p.group : 0;
        const int gq = valid ? rg % p.group : 0;
        const u16* src = p.q + (i64)(g.row_start + j) * p.q_stride_tok + (i64)(h * p.group + gq) * p.q_stride_head;
        rs[hr] = p.scale_log2;
        if constexpr (KV == 2) {
            // e4m3 KV runs f16 MMAs. K-dim order: k-step kk, logical dims
            // (2qd, 2qd+1 | 2qd+8, 2qd+9) = physical dims qd*D/4 + 4kk + (0,1 | 2,3)
            // (the K fragments read the same bytes). bf16 Q becomes f16 exactly
            // after a per-row power-of-two scale 2^e (row max in [2^14, 2^15)),
            // undone in rs; f16 Q is used as is.
            // DH > 1: this warp's DW dims, the same order inside them.
            u32 w[DW / 8];
            const u16* hsrc = src + (DH > 1 ? hf * DW : 0);
#pragma unroll
            for (int c = 0; c < DW / 32; ++c) {
                const uint4 u = valid ? mha_kit::load16(hsrc + qd * (DW / 4) + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
                w[4 * c] = u.x;
                w[4 * c + 1] = u.y;
                w[4 * c + 2] = u.z;
                w[4 * c + 3] = u.w;
            }
            if constexpr (QT == 0) {
                float amax = 0.f;
#pragma unroll
                for (int c = 0; c < DW / 8; ++c) {
                    amax = fmaxf(amax, fabsf(__uint_as_float(w[c] << 16)));
                    amax = fmaxf(amax, fabsf(__uint_as_float(w[c] & 0xffff0000u)));
                }
                if constexpr (DH > 1) {
                    // The row's scale is the whole row's, the same in every
                    // warp of the group: this thread's share of the other
                    // warps' dims too.
                    for (int oh = 0; oh < DH; ++oh) {
                        if (oh == hf || !valid) continue;
#pragma unroll
                        for (int c = 0; c < DW / 32; ++c) {
                            const uint4 u = mha_kit::load16(src + oh * DW + qd * (DW / 4) + 8 * c);
                            const u32 uw[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                amax = fmaxf(amax, fabsf(__uint_as_float(uw[e] << 16)));
                                amax = fmaxf(amax, fabsf(__uint_as_float(uw[e] & 0xffff0000u)));
                            }
                        }
                    }
                }
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const int e = (int)((__float_as_uint(amax) >> 23) & 0xffu);
                const int sh = (amax == 0.f || e == 255) ? 0 : min(141 - e, 64);  // >= -113
                const float up = __uint_as_float((u32)(127 + sh) << 23);
                rs[hr] = p.scale_log2 * __uint_as_float((u32)(127 - sh) << 23);
#pragma unroll
                for (int c = 0; c < DW / 8; ++c) {
                    w[c] = pack2<1>(__uint_as_float(w[c] << 16) * up, __uint_as_float(w[c] & 0xffff0000u) * up);
                }
            }
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                qa[kk][hr] = w[2 * kk];
                qa[kk][2 + hr] = w[2 * kk + 1];
            }
        } else if constexpr (!QS) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                qa[kk][hr] = valid ? *reinterpret_cast<const u32*>(src + kk * 16 + 2 * qd) : 0u;
                qa[kk][2 + hr] = valid ? *reinterpret_cast<const u32*>(src + kk * 16 + 8 + 2 * qd) : 0u;
            }
        }
        // Padding rows see no key (x = -1).
        xr[hr] = valid ? x_base + j : -1;
        xlo[hr] = p.window_left >= 0 ? xr[hr] - p.window_left : (i32)0x80000000;
        if (p.cp_ranks > 1 && valid) {
            // The row's global range [x - W, x] in local keys (xr = -1: none here).
            const i32 x = x_base + j;
            xr[hr] = cp_count_below(p, x + 1) - 1;
            xlo[hr] = p.window_left >= 0 ? cp_count_below(p, x - p.window_left) : (i32)0x80000000;
        }
    }

    // Experiment XV & 8: the e4m3 path's A-fragments (the same in every
    // warp) stored once by warp 0, read back each slice; `qa` dies here.
    if constexpr (L::Q8_SMEM) {
        if (warp == 0) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                *reinterpret_cast<uint4*>(smem + L::Q8_OFF + (kk * 32 + lane) * 16) =
                    make_uint4(qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);
            }
        }
        __syncthreads();
    }

    // D 256: the tile's Q rows into shared memory (rows >= nrows zero), read
    // by every warp's S = Q K^T (ldmatrix, A layout).
    const u32 q_smem = smem_u32(smem + L::Q_OFF);
    if constexpr (QS) {
        for (int c = tid; c < ROWS * (D / 8); c += NT) {
            const int row = c / (D / 8), ch = c % (D / 8);
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (row < nrows) {
                const int rg = r0 + row;
                const int j = rg / p.group, gq = rg % p.group;
                u = mha_kit::load16(p.q + (i64)(g.row_start + j) * p.q_stride_tok +
                                    (i64)(h * p.group + gq) * p.q_stride_head + ch * 8);
            }
            *reinterpret_cast<uint4*>(smem + L::Q_OFF + row * L::QRB + ((ch ^ (row & 7)) << 4)) = u;
        }
        __syncthreads();
    }

    float o[NT8][4];
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF};
    float drow[2] = {0.f, 0.f};

    prologue();

    // D10: count bad entries among the request's needed pages, once, shared
    // by the splits of row tile 0 of KV head 0 (they all run: tile 0 has
    // rows when g.n > 0, and every split < sp.nb reaches here); after the
    // prologue so its loads overlap the first KV tiles.
    if (h == 0 && rt == 0 && g.n > 0) count_bad_pages(p, b, g, split, sp.nb, tid, NT);

    // Per-lane ldmatrix offsets (bytes inside a 16-row block).
    const int mi = lane >> 3;
    const int mr = lane & 7;
    const int k_row = (mi >> 1) * 8 + mr;  // K: matrices (t0-7,c0) (t0-7,c1) (t8-15,c0) (t8-15,c1)
    const int k_cb = mi & 1;
    const int v_row = (mi & 1) * 8 + mr;   // V: matrices (t0-7,c0) (t8-15,c0) (t0-7,c1) (t8-15,c1)
    const int v_cb = mi >> 1;

    // Whether V of a slice (16 rows, zero-filled where not loaded) holds a
    // NaN/Inf (warp-wide): the exponent field all ones, i.e. adding its
    // lowest bit carries into the sign bit (e4m3: NaN is S.1111.111, no Inf).
    auto slice_nonfinite = [&](const u8* vraw) {
        constexpr u32 E2 = KV == 2 ? 0x7F7F7F7Fu : (KV == 0 ? 0x7F807F80u : 0x7C007C00u);
        constexpr u32 INC2 = KV == 2 ? 0x01010101u : (KV == 0 ? 0x00800080u : 0x04000400u);
        constexpr u32 SIGN = KV == 2 ? 0x80808080u : 0x80008000u;
        u32 acc = 0;
#pragma unroll
        for (int off = lane * 16; off < MWT * RRB; off += 32 * 16) {
            const uint4 u = *reinterpret_cast<const uint4*>(vraw + off);
            acc |= (((u.x & E2) + INC2) | ((u.y & E2) + INC2)) | (((u.z & E2) + INC2) | ((u.w & E2) + INC2));
        }
        return __any_sync(0xffffffffu, (acc & SIGN) != 0u);
    };
    // O += P V of one slice on CUDA cores, skipping zero weights. P in the
    // m16n8k16 A layout (pa[2t + hr]: row gr + 8 hr, keys 8t + 2qd, +1), O in
    // the accumulator layout; O column (n, c) of this thread is dim
    // 8n + 2qd + c (16-bit V) or (D / 8)(2qd + c) + n (e4m3 V, see below).
    auto pv_scalar_slice = [&](const u8* vraw, const u32 (&pa)[4]) {
#pragma unroll 1
        for (int key = 0; key < MWT; ++key) {
            const int src = (lane & ~3) | ((key >> 1) & 3);
            float pk[2];
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const u32 w = __shfl_sync(0xffffffffu, (key >> 3) ? pa[2 + hr] : pa[hr], src);
                pk[hr] = (key & 1) ? pac::half_hi<MT>(w) : pac::half_lo<MT>(w);
            }
            const u8* vrow = vraw + key * RRB;
#pragma unroll
            for (int n = 0; n < NT8; ++n) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    float v;
                    if constexpr (KV == 2) {
                        const int dim = NT8 * (2 * qd + c) + n;
                        const u8 byte = vrow[(((dim >> 4) ^ v8_swz<CPR>(key)) << 4) + (dim & 15)];
                        float hi_unused;
                        e4m3x2_to_f32((u16)byte, v, hi_unused);
                    } else {
                        const int dim = 8 * n + 2 * qd + c;
                        const u16 hv = *reinterpret_cast<const u16*>(
                            vrow + (((dim >> 3) ^ (key & 7)) << 4) + (dim & 7) * 2);
                        v = half_to_f32<MT>(hv);
                    }
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr) {
                        if (pk[hr] != 0.f) o[n][2 * hr + c] += pk[hr] * v;
                    }
                }
            }
        }
    };

    // O += P V of one warp slice (its V rows at vraw / vbase; P in the
    // m16n8k16 A layout).
    auto pv_slice = [&](const u8* vraw, u32 vbase, const u32 (&pa)[4]) {
        if constexpr (KV == 2) {
            // Thread (gr, qd) reads bytes [gr*D/8, (gr+1)*D/8) of V rows (tokens)
            // 2qd, 2qd+1 (-> b0) and 2qd+8, 2qd+9 (-> b1); byte jn of them is
            // n8 tile jn, column gr: O column (jn, n) is physical dim n*D/8 + jn.
            constexpr int VW = DW / 32;  // words per row (of this warp's dims)
            u32 va[VW], vb[VW], vc[VW], vd[VW];
            auto vload = [&](u32* dst, int row) {
                const int byte = gr * (DW / 8);
                const u8* src;
                if constexpr (XA) {
                    src = vraw + xv_rd + (row - 2 * qd) * RRB;  // row - 2 qd: 0, 1, 8 or 9
                } else {
                    src = vraw + row * RRB + (((byte >> 4) ^ v8_swz<CPR>(row)) << 4) + (byte & 15);
                }
                if constexpr (VW == 4) {
                    const uint4 u = *reinterpret_cast<const uint4*>(src);
                    dst[0] = u.x;
                    dst[1] = u.y;
                    dst[2] = u.z;
                    dst[3] = u.w;
                } else {
                    const uint2 u = *reinterpret_cast<const uint2*>(src);
                    dst[0] = u.x;
                    dst[1] = u.y;
                }
            };
            vload(va, 2 * qd);
            vload(vb, 2 * qd + 1);
            vload(vc, 2 * qd + 8);
            vload(vd, 2 * qd + 9);
#pragma unroll
            for (int wi = 0; wi < VW; ++wi) {
                const u32 ab01 = __byte_perm(va[wi], vb[wi], 0x5140);  // a0 b0 a1 b1
                const u32 ab23 = __byte_perm(va[wi], vb[wi], 0x7362);  // a2 b2 a3 b3
                const u32 cd01 = __byte_perm(vc[wi], vd[wi], 0x5140);
                const u32 cd23 = __byte_perm(vc[wi], vd[wi], 0x7362);
                mma16816<MT>(o[4 * wi], pa, e4m3x2_lo(ab01), e4m3x2_lo(cd01));
                mma16816<MT>(o[4 * wi + 1], pa, e4m3x2_hi(ab01), e4m3x2_hi(cd01));
                mma16816<MT>(o[4 * wi + 2], pa, e4m3x2_lo(ab23), e4m3x2_lo(cd23));
                mma16816<MT>(o[4 * wi + 3], pa, e4m3x2_hi(ab23), e4m3x2_hi(cd23));
            }
        } else {
#pragma unroll
            for (int dn = 0; dn < DW / 16; ++dn) {
                u32 r[4];
                ldsm_x4_t(r, vbase + v_row * HRB + (((2 * dn + v_cb) ^ (v_row & 7)) * 16));
                mma16816<MT>(o[2 * dn], pa, r[0], r[1]);
                mma16816<MT>(o[2 * dn + 1], pa, r[2], r[3]);
            }
        }
    };
    // S = Q K^T over one warp slice (the ring slot at kraw / kbase): two
    // n8 tiles (tokens 0-7, 8-15).
    auto s_slice = [&](float (&s)[2][4], const u8* kraw, u32 kbase) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[t][e] = 0.f;
        if constexpr (L::Q8_SMEM) {
            // As below, k-step by k-step: each A-fragment read from shared
            // memory once a slice and used for both n8 tiles.
#pragma unroll
            for (int c = 0; c < D / 64; ++c) {
                uint4 u[2];
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const int row = gr + 8 * t;
                    if constexpr (XA) {
                        u[t] = *reinterpret_cast<const uint4*>(kraw + xk_rd[c] + 8 * t * RRB);
                    } else {
                        u[t] = *reinterpret_cast<const uint4*>(
                            kraw + row * RRB + (((qd * (D / 64) + c) ^ k8_swz<CPR>(row)) * 16));
                    }
                }
#pragma unroll
                for (int wi = 0; wi < 4; ++wi) {
                    const uint4 qv = *reinterpret_cast<const uint4*>(
                        smem + L::Q8_OFF + ((4 * c + wi) * 32 + lane) * 16);
                    const u32 a[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
                    for (int t = 0; t < 2; ++t) {
                        const u32 w = wi == 0 ? u[t].x : (wi == 1 ? u[t].y : (wi == 2 ? u[t].z : u[t].w));
                        mma16816<MT>(s[t], a, e4m3x2_lo(w), e4m3x2_hi(w));
                    }
                }
            }
        } else if constexpr (KV == 2) {
            // Thread (gr, qd) reads bytes [qd*DW/4, (qd+1)*DW/4) of K rows gr
            // and gr + 8 (of this warp's DW dims): word kk -> (b0, b1) of
            // k-step kk, converted once.
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int row = gr + 8 * t;
#pragma unroll
                for (int c = 0; c < DW / 64; ++c) {
                    uint4 u;
                    if constexpr (XA) {
                        u = *reinterpret_cast<const uint4*>(kraw + xk_rd[c] + 8 * t * RRB);
                    } else {
                        u = *reinterpret_cast<const uint4*>(
                            kraw + row * RRB + (((qd * (DW / 64) + c) ^ k8_swz<CPR>(row)) * 16));
                    }
                    const u32 wv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                    for (int wi = 0; wi < 4; ++wi) {
                        mma16816<MT>(s[t], qa[4 * c + wi], e4m3x2_lo(wv[wi]), e4m3x2_hi(wv[wi]));
                    }
                }
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                u32 r[4];
                ldsm_x4(r, kbase + k_row * HRB + (((2 * kk + k_cb) ^ (k_row & 7)) * 16));
                if constexpr (QS) {
                    // Matrices (rows 0-7 | 8-15) x (k chunk 2kk | 2kk + 1): a0..a3.
                    const int qrow = lane & 15;
                    u32 a[4];
                    ldsm_x4(a, q_smem + qrow * L::QRB + (((hf * (DW / 8) + 2 * kk + (lane >> 4)) ^ (qrow & 7)) * 16));
                    mma16816<MT>(s[0], a, r[0], r[1]);
                    mma16816<MT>(s[1], a, r[2], r[3]);
                } else {
                    mma16816<MT>(s[0], qa[kk], r[0], r[1]);
                    mma16816<MT>(s[1], qa[kk], r[2], r[3]);
                }
            }
        }
    };
    // XA: the ring slot of tile i, counted (i % NST otherwise).
    int cslot = 0;
    // H (XV & 256): rows gr + 8 are all padding (the entry takes this
    // instantiation when q_len · G <= 8): their masks, maxima, exponentials
    // and sums are skipped (P = 0 there).
    constexpr bool H = (XV & 256) != 0;
    constexpr int NHR = H ? 1 : 2;  // row halves computed
    auto step = [&](Look& lk, int i) {
        int xslot = 0;
        if constexpr (XA) {
            xslot = cslot;
            cslot = cslot == NST - 1 ? 0 : cslot + 1;
        }
        cp_async_wait<NST - 2>();
        if (i == 0) stamp(3);
        __syncwarp();
        // Tile i + NST - 1 goes to the slot tile i - 1 left.
        issue(lk, i + NST - 1, xslot == 0 ? NST - 1 : xslot - 1);
        cp_async_commit();
        lookup(lk, i + NST + 1);

        const int slot = XA ? xslot : i % NST;
        const u32 kbase = ring_u32 + slot * L::SLOT;
        const u32 vbase = kbase + MWT * RRB;
        const u8* kraw = ring + slot * L::SLOT;  // e4m3: read straight into fragments
        const u8* vraw = kraw + MWT * RRB;

        float s[2][4];
        s_slice(s, kraw, kbase);
        if constexpr (DH > 1) {
            // Dim groups: the slice's S over all dims = the sum of the
            // group's partials (each warp's over its DW dims). Each stores
            // its partial, one group barrier, each sums all DH in the same
            // order, the same bits in every warp, so all run the same
            // softmax (same maxima, P, skips) on their own dims of O.
            // Buffers by slice parity: a warp rewrites one only after every
            // warp of its group passed the next slice's barrier, i.e. after
            // they read it.
            float* xs = reinterpret_cast<float*>(smem + L::XS_OFF) + (ws * 2 + (i & 1)) * DH * 256;
            float4* mine = reinterpret_cast<float4*>(xs + hf * 256);
            mine[lane] = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
            mine[32 + lane] = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
            asm volatile("bar.sync %0, %1;" ::"r"(1 + ws), "n"(32 * DH) : "memory");
            // Sum in warp order (((p0 + p1) + p2) + p3): the same in every
            // warp of the group (its own partial read back like the others).
            float acc[2][4];
#pragma unroll
            for (int hh = 0; hh < DH; ++hh) {
                const float4* part = reinterpret_cast<const float4*>(xs + hh * 256);
                const float4 a = part[lane], c = part[32 + lane];
                const float v[2][4] = {{a.x, a.y, a.z, a.w}, {c.x, c.y, c.z, c.w}};
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[t][e] = hh == 0 ? v[t][e] : acc[t][e] + v[t][e];
            }
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[t][e] = acc[t][e];
        }

        // Mask, scale, online softmax (rows gr and gr + 8).
        const u32 vm0 = vm_s[(warp * NST + slot) * 2];
        const u32 vm1 = vm_s[(warp * NST + slot) * 2 + 1];
        const i32 kt = slice0 + i * TT;  // key of slice token 0
        float mx[2] = {NEG_INF, NEG_INF};
        bool masked_loaded = false;  // a loaded key of the slice that a valid row must not see
        // Every key of the slice loaded and inside every valid row's range (a
        // decode away from the window edge): one test per row, not per score,
        // with the same outcome as the general path below.
        auto sees_slice = [&](int hr) { return (xr[hr] < 0) | ((kt + MWT - 1 <= xr[hr]) & (kt >= xlo[hr])); };
        bool whole;
        if constexpr (H) {
            whole = ((vm0 & vm1) == 0xffffffffu) & sees_slice(0);
        } else {
            whole = ((vm0 & vm1) == 0xffffffffu) & sees_slice(0) & sees_slice(1);
        }
        if (__all_sync(0xffffffffu, whole)) {
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int e = 0; e < 2 * NHR; ++e) {
                    const int hr = e >> 1;
                    s[t][e] = xr[hr] >= 0 ? s[t][e] * rs[hr] : NEG_INF;
                    mx[hr] = fmaxf(mx[hr], s[t][e]);
                }
        } else {
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const u32 vm = t == 0 ? vm0 : vm1;
#pragma unroll
                for (int e = 0; e < 2 * NHR; ++e) {
                    const int tk = 2 * qd + (e & 1);  // token inside the n8 tile
                    const i32 k = kt + 8 * t + tk;
                    const int hr = e >> 1;
                    const bool loaded = (vm >> (4 * tk)) & 1u;
                    const bool vis = loaded && k <= xr[hr] && k >= xlo[hr];
                    masked_loaded = masked_loaded || (loaded && !vis && xr[hr] >= 0);
                    s[t][e] = vis ? s[t][e] * rs[hr] : NEG_INF;
                    mx[hr] = fmaxf(mx[hr], s[t][e]);
                }
            }
        }
        float alpha[2];
        const bool had0 = mrow[0] != NEG_INF, had1 = mrow[1] != NEG_INF;
        if (skip_on) {
            // Per-thread partial maxima: all of them below the threshold iff
            // every row's slice max is. A row that saw no key yet, or sees
            // one here for the first time, never lets the slice go.
            const bool low0 = mx[0] == NEG_INF || (had0 && mx[0] - mrow[0] < skip_thr);
            const bool low1 = mx[1] == NEG_INF || (had1 && mx[1] - mrow[1] < skip_thr);
            if (__all_sync(0xffffffffu, low0 && low1)) {
                if (!TR && lane == 0 && p.skip_counter != nullptr) atomicAdd(p.skip_counter, 1u);
                return;
            }
        }
        row_max_update<NHR>(mx, mrow, alpha);
        u32 pa[4];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            pa[2 * t] = pack2<MT>(ex2(s[t][0] - mx[0]), ex2(s[t][1] - mx[0]));
            if constexpr (H) {
                pa[2 * t + 1] = 0u;
            } else {
                pa[2 * t + 1] = pack2<MT>(ex2(s[t][2] - mx[1]), ex2(s[t][3] - mx[1]));
            }
        }
        // The denominator sums the rounded P the numerator uses.
        drow[0] = drow[0] * alpha[0] + (sum2<MT>(pa[0]) + sum2<MT>(pa[2]));
        if constexpr (!H) drow[1] = drow[1] * alpha[1] + (sum2<MT>(pa[1]) + sum2<MT>(pa[3]));
        // O is rescaled only when some row's max moved (alpha != 1): a row
        // that has seen no key yet holds O = 0 (alpha 0 there is a no-op),
        // and x * 1 == x, so the skip is exact; after the first tiles of a
        // decode the max rarely moves (64 FMULs a slice at D 128).
        if (__any_sync(0xffffffffu, (had0 && alpha[0] != 1.f) || (had1 && alpha[1] != 1.f))) {
#pragma unroll
            for (int n = 0; n < NT8; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                if constexpr (!H) {
                    o[n][2] *= alpha[1];
                    o[n][3] *= alpha[1];
                }
            }
        }
        // A slice with a loaded key masked for some row (verify: the causal
        // diagonal, the window edge; a q_len 1 decode never has one) whose V
        // holds NaN/Inf: P V on CUDA cores, skipping zero weights (the MMA
        // would give 0 * NaN = NaN in the masked row).
        if (__any_sync(0xffffffffu, masked_loaded) && slice_nonfinite(vraw)) {
            pv_scalar_slice(vraw, pa);
            return;
        }
        pv_slice(vraw, vbase, pa);
    };

    // P2: tiles i and i + 1 (slots cslot, cslot + 1) in one step; the
    // tiles NST - 2 and NST - 1 ahead go to the slots tiles i - 2 and i - 1
    // left. A last odd tile runs alone (u = false: the second slot's S, P V
    // and masks are not touched; its data may be stale).
    auto step2 = [&](int i) {
        const int sa = cslot;
        const int sb = sa == NST - 1 ? 0 : sa + 1;
        const int f1 = sa == 0 ? NST - 1 : sa - 1;  // tile i - 1's slot
        const int f2 = f1 == 0 ? NST - 1 : f1 - 1;  // tile i - 2's slot
        cslot = sb == NST - 1 ? 0 : sb + 1;
        cp_async_wait<NST - 4>();  // tiles i and i + 1 landed
        if (i == 0) stamp(3);
        __syncwarp();
        issue(la, i + NST - 2, f2);
        cp_async_commit();
        issue(lb, i + NST - 1, f1);
        cp_async_commit();
        lookup(la, i + NST);
        lookup(lb, i + NST + 1);
        const bool u = i + 1 < ntiles;  // warp-uniform: the second tile exists
        const u8* kra = ring + sa * L::SLOT;
        const u8* krb = ring + sb * L::SLOT;
        const u8* vra = kra + MWT * RRB;
        const u8* vrb = krb + MWT * RRB;
        float s[4][4];  // n8 tiles 0, 1: tile i; 2, 3: tile i + 1
        {
            float sx[2][4], sy[2][4];
            s_slice(sx, kra, 0u);
            if (u) {
                s_slice(sy, krb, 0u);
            } else {
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sy[t][e] = 0.f;
            }
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[t][e] = sx[t][e];
                    s[2 + t][e] = sy[t][e];
                }
        }
        // Valid-key words of the four n8 tiles (none for a missing tile).
        u32 vm[4];
        vm[0] = vm_s[(warp * NST + sa) * 2];
        vm[1] = vm_s[(warp * NST + sa) * 2 + 1];
        vm[2] = u ? vm_s[(warp * NST + sb) * 2] : 0u;
        vm[3] = u ? vm_s[(warp * NST + sb) * 2 + 1] : 0u;
        const i32 kt = slice0 + i * TT;  // key of tile i's slice token 0
        float mx[2] = {NEG_INF, NEG_INF};
        bool masked_loaded = false;
        // Both slices whole (every key loaded and visible to every valid row).
        auto sees_pair = [&](int hr) {
            return (xr[hr] < 0) | ((kt + TT + MWT - 1 <= xr[hr]) & (kt >= xlo[hr]));
        };
        bool whole = ((vm[0] & vm[1] & vm[2] & vm[3]) == 0xffffffffu) & sees_pair(0);
        if constexpr (!H) whole = whole & sees_pair(1);
        if (__all_sync(0xffffffffu, whole)) {
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int e = 0; e < 2 * NHR; ++e) {
                    const int hr = e >> 1;
                    s[t][e] = xr[hr] >= 0 ? s[t][e] * rs[hr] : NEG_INF;
                    mx[hr] = fmaxf(mx[hr], s[t][e]);
                }
        } else {
#pragma unroll
            for (int t = 0; t < 4; ++t) {
#pragma unroll
                for (int e = 0; e < 2 * NHR; ++e) {
                    const int tk = 2 * qd + (e & 1);  // token inside the n8 tile
                    const i32 k = kt + (t >> 1) * TT + 8 * (t & 1) + tk;
                    const int hr = e >> 1;
                    const bool loaded = (vm[t] >> (4 * tk)) & 1u;
                    const bool vis = loaded && k <= xr[hr] && k >= xlo[hr];
                    masked_loaded = masked_loaded || (loaded && !vis && xr[hr] >= 0);
                    s[t][e] = vis ? s[t][e] * rs[hr] : NEG_INF;
                    mx[hr] = fmaxf(mx[hr], s[t][e]);
                }
            }
        }
        float alpha[2];
        const bool had0 = mrow[0] != NEG_INF, had1 = mrow[1] != NEG_INF;
        if (skip_on) {
            // As step's test, over the pair's 32 keys (counted as its slices).
            const bool low0 = mx[0] == NEG_INF || (had0 && mx[0] - mrow[0] < skip_thr);
            const bool low1 = mx[1] == NEG_INF || (had1 && mx[1] - mrow[1] < skip_thr);
            if (__all_sync(0xffffffffu, low0 && low1)) {
                if (!TR && lane == 0 && p.skip_counter != nullptr) atomicAdd(p.skip_counter, u ? 2u : 1u);
                return;
            }
        }
        row_max_update<NHR>(mx, mrow, alpha);
        u32 pa[2][4];  // P of tile i, tile i + 1 (A layout)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            pa[t >> 1][2 * (t & 1)] = pack2<MT>(ex2(s[t][0] - mx[0]), ex2(s[t][1] - mx[0]));
            if constexpr (H) {
                pa[t >> 1][2 * (t & 1) + 1] = 0u;
            } else {
                pa[t >> 1][2 * (t & 1) + 1] = pack2<MT>(ex2(s[t][2] - mx[1]), ex2(s[t][3] - mx[1]));
            }
        }
        drow[0] = drow[0] * alpha[0] +
                  ((sum2<MT>(pa[0][0]) + sum2<MT>(pa[0][2])) + (sum2<MT>(pa[1][0]) + sum2<MT>(pa[1][2])));
        if constexpr (!H)
            drow[1] = drow[1] * alpha[1] +
                      ((sum2<MT>(pa[0][1]) + sum2<MT>(pa[0][3])) + (sum2<MT>(pa[1][1]) + sum2<MT>(pa[1][3])));
        if (__any_sync(0xffffffffu, (had0 && alpha[0] != 1.f) || (had1 && alpha[1] != 1.f))) {
#pragma unroll
            for (int n = 0; n < NT8; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                if constexpr (!H) {
                    o[n][2] *= alpha[1];
                    o[n][3] *= alpha[1];
                }
            }
        }
        // As step: a masked loaded key with NaN / Inf in V runs P V on CUDA
        // cores (zero weights skipped), here for both slices.
        if (__any_sync(0xffffffffu, masked_loaded) && (slice_nonfinite(vra) || (u && slice_nonfinite(vrb)))) {
            pv_scalar_slice(vra, pa[0]);
            if (u) pv_scalar_slice(vrb, pa[1]);
            return;
        }
        pv_slice(vra, 0u, pa[0]);
        if (u) pv_slice(vrb, 0u, pa[1]);
    };

    if constexpr (P2) {
        for (int i = 0; i < ntiles; i += 2) step2(i);
    } else {
        for (int i = 0; i < ntiles; i += 2) {
            step(la, i);
            if (i + 1 < ntiles) step(lb, i + 1);
        }
    }
    cp_async_wait<0>();
    if (ntiles == 0) stamp(3);
    stamp(4);
    pdl_launch_dependents();
    __syncthreads();  // every warp is done with its ring: reuse it as merge scratch

    // ---- merge the 4 warps' (m, d, O) (DH = 2: the 2 pairs', each pair's
    // warps holding the same (m, d) and one half of O's dims) ----
    float* osc = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        drow[hr] += __shfl_xor_sync(0xffffffffu, drow[hr], 1);
        drow[hr] += __shfl_xor_sync(0xffffffffu, drow[hr], 2);
        const int row = gr + 8 * hr;
        if (qd == 0 && hf == 0) {
            ms[ws * ROWS + row] = mrow[hr];
            dsum[ws * ROWS + row] = drow[hr];
        }
#pragma unroll
        for (int n = 0; n < NT8; ++n) {
            float* orow = osc + (ws * ROWS + row) * L::OS + hf * DW;
            if constexpr (KV == 2) {
                orow[NT8 * (2 * qd) + n] = o[n][2 * hr];
                orow[NT8 * (2 * qd + 1) + n] = o[n][2 * hr + 1];
            } else {
                *reinterpret_cast<float2*>(orow + 8 * n + 2 * qd) = make_float2(o[n][2 * hr], o[n][2 * hr + 1]);
            }
        }
    }
    __syncthreads();

    const int rg3 = tid / NCH, ch = tid % NCH;
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) {
        const int rr = rg3 * RPT + ii;
        if (rr >= nrows) continue;
        float mm = NEG_INF;
#pragma unroll
        for (int w = 0; w < L::NSL; ++w) mm = fmaxf(mm, ms[w * ROWS + rr]);
        float den = 0.f;
        float acc[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = 0.f;
#pragma unroll
        for (int w = 0; w < L::NSL; ++w) {
            const float mw = ms[w * ROWS + rr];
            const float f = mw == NEG_INF ? 0.f : ex2(mw - mm);
            den += f * dsum[w * ROWS + rr];
            const float4* src = reinterpret_cast<const float4*>(osc + (w * ROWS + rr) * L::OS + ch * 8);
            const float4 a = src[0], c = src[1];
            acc[0] += f * a.x;
            acc[1] += f * a.y;
            acc[2] += f * a.z;
            acc[3] += f * a.w;
            acc[4] += f * c.x;
            acc[5] += f * c.y;
            acc[6] += f * c.z;
            acc[7] += f * c.w;
        }
        const int rg = r0 + rr;
        const int j = rg / p.group, qh = h * p.group + rg % p.group;
        if (sp.nb == 1) {
            if (p.lse != nullptr && ch == 0)
                p.lse[(i64)(g.row_start + j) * p.lse_stride_tok + qh] = row_lse(den, mm, p.sinks, qh);
            const float scale = out_scale(den, mm, p.sinks, qh, p.bmm2_scale);
            u32 packed[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 lo = f32_to_half<QT>(acc[2 * e] * scale);
                const u32 hi = f32_to_half<QT>(acc[2 * e + 1] * scale);
                packed[e] = lo | (hi << 16);
            }
            u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + ch * 8;
            mha_kit::store16(dst, make_uint4(packed[0], packed[1], packed[2], packed[3]));
        } else if (in_cluster) {
            float* part = osc + L::MERGE / 4;
            float4* dst = reinterpret_cast<float4*>(part + rr * D + ch * 8);
            dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            if (ch == 0) *reinterpret_cast<float2*>(part + ROWS * D + 2 * rr) = make_float2(mm, den);
        } else {
            const i64 item = ((i64)b * p.num_kv_heads + h) * p.row_tiles + rt;
            const i64 base = (item * p.max_splits + split) * ROWS;
            float4* dst = reinterpret_cast<float4*>(p.ws_o + (base + rr) * D + ch * 8);
            dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            if (ch == 0) {
                p.ws_ml[(base + rr) * 2] = mm;
                p.ws_ml[(base + rr) * 2 + 1] = den;
            }
        }
    }
    stamp(5);
    if (in_cluster) {
        // The fold's statistics go after the partial (the warps' scratch
        // before it is still being read by this CTA's other threads).
        // Only the `_cf` entries instantiate it (in_cluster is false
        // elsewhere); no trace entry is one.
        if constexpr (CF) {
            merge_cluster<QT, D>(p, g, split, sp.nb, nrows, r0, h, osc + L::MERGE / 4,
                                 osc + L::MERGE / 4 + ROWS * D + 2 * ROWS, L::CLUSTER_CAP);
        }
    } else if (sp.nb > 1) {
        const i64 item = ((i64)b * p.num_kv_heads + h) * p.row_tiles + rt;
        merge_last<QT, D, true>(p, g, item, sp.nb, nrows, r0, h, osc, L::RING / 4);
        if constexpr (TR) {
            if (trace != nullptr) trace[7] = *reinterpret_cast<const u32*>(osc + 2 * ROWS);
        }
    }
    stamp(6);
}

}  // namespace pa

#define PA_DECODE(QN, QT, KVN, KV, D)                                                              \
    extern "C" __global__ void __launch_bounds__(pa::NT)                                             \
        paged_attention_decode_##QN##_kv_##KVN##_d##D(const PagedAttentionParams p) {                \
        pa::pdl_wait();                                                                            \
        pa::decode_body<QT, KV, D>(p);                                                             \
    }

#define PA_DECODE_D(QN, QT, KVN, KV) \
    PA_DECODE(QN, QT, KVN, KV, 64)   \
    PA_DECODE(QN, QT, KVN, KV, 128)  \
    PA_DECODE(QN, QT, KVN, KV, 256)  \
    PA_DECODE(QN, QT, KVN, KV, 512)

// The batch's length order (pa::unit_order_body): one CTA of pa::UO_NT
// threads; `order` `[bs]` i32. Not a PDL launch (no wait needed: it is
// launched without the attribute, so it starts after the previous kernel).
extern "C" __global__ void __launch_bounds__(pa::UO_NT)
    paged_attention_unit_order(const i32* __restrict__ cache_seqlens, int bs, i32* __restrict__ order) {
    pa::unit_order_body(cache_seqlens, bs, order);
}

PA_DECODE_D(bf16, 0, bf16, 0)
PA_DECODE_D(bf16, 0, f16, 1)
PA_DECODE_D(bf16, 0, e4m3, 2)
PA_DECODE_D(f16, 1, bf16, 0)
PA_DECODE_D(f16, 1, f16, 1)
PA_DECODE_D(f16, 1, e4m3, 2)

// Tensor-core entries: D 64 (4 CTAs/SM), 128 (2 CTAs/SM), 256 and 512 (1
// for 16-bit K/V, D 512 by warp pairs; 2 for e4m3, by groups of 2 / 4 warps
// of 128 dims each: MmaSmem::DH); Q and a 16-bit
// KV share the dtype, or KV is e4m3 (f16 MMAs, each element converted once).
// One entry, `paged_attention_mma_{QN}_kv_{KVN}_d{D}{SUFFIX}`: mma_body<QT, KV,
// D, XV> with MINB CTAs an SM.
#define PA_MMA_ENTRY(QN, QT, KVN, KV, D, SUFFIX, XV, MINB)                                         \
    extern "C" __global__ void __launch_bounds__(pa::NT, MINB)                                       \
        paged_attention_mma_##QN##_kv_##KVN##_d##D##SUFFIX(const PagedAttentionParams p) {           \
        pa::pdl_wait();                                                                            \
        pa::mma_body<QT, KV, D, XV>(p);                                                            \
    }
// D 128 entries take the lean copy addresses (XV & 64, mma_body's XA;
// session 28's experiment 64, production since session 31: on an H100 it
// tied or beat the old form on every decode row measured, PERF.md session
// 31). At D 64 the same form was not measured; D 256 / 512 keep theirs.
#define PA_XA(D) ((D) == 128 ? 64 : 0)
#define PA_MMA(QN, QT, KVN, KV, D, MINB) PA_MMA_ENTRY(QN, QT, KVN, KV, D, , PA_XA(D), MINB)
// The `_cf` twin: the same kernel folding its splits inside a thread-block
// cluster when launched as clusters (XV & 32). For bf16 Q at D 64 / 128
// (src/launch.rs `cluster_fold_variant`; each twin adds ~250 KB of PTX).
#define PA_MMA_CF(QN, QT, KVN, KV, D, MINB) PA_MMA_ENTRY(QN, QT, KVN, KV, D, _cf, 32 | PA_XA(D), MINB)

PA_MMA(bf16, 0, bf16, 0, 64, 4)
PA_MMA(bf16, 0, bf16, 0, 128, 2)
PA_MMA(bf16, 0, e4m3, 2, 64, 4)
PA_MMA(bf16, 0, e4m3, 2, 128, 2)
PA_MMA(f16, 1, f16, 1, 64, 4)
PA_MMA(f16, 1, f16, 1, 128, 2)
PA_MMA(f16, 1, e4m3, 2, 64, 4)
PA_MMA(f16, 1, e4m3, 2, 128, 2)
PA_MMA(bf16, 0, bf16, 0, 256, 1)
PA_MMA(f16, 1, f16, 1, 256, 1)
PA_MMA(bf16, 0, bf16, 0, 512, 1)
PA_MMA(f16, 1, f16, 1, 512, 1)
PA_MMA(bf16, 0, e4m3, 2, 256, 2)
PA_MMA(f16, 1, e4m3, 2, 256, 2)
PA_MMA(bf16, 0, e4m3, 2, 512, 2)
PA_MMA(f16, 1, e4m3, 2, 512, 2)
PA_MMA_CF(bf16, 0, bf16, 0, 64, 4)
PA_MMA_CF(bf16, 0, bf16, 0, 128, 2)
PA_MMA_CF(bf16, 0, e4m3, 2, 64, 4)
PA_MMA_CF(bf16, 0, e4m3, 2, 128, 2)

// Timing experiment entries (PagedAttentionKernel::set_experiment): the
// D 128 tensor-core entry of (Q, KV) under experiment XV, named `_x{XV}`,
// MINB CTAs an SM; mma_body runs XV | 64, the production form's lean copy
// addresses (XA) with the experiment's bits.
#define PA_MMA_X(QN, QT, KVN, KV, XV, MINB) PA_MMA_ENTRY(QN, QT, KVN, KV, 128, _x##XV, XV | 64, MINB)
// Experiment 8 (Q in shared memory and a shorter ring, MmaSmem::X8, three
// CTAs an SM) and 72 (8 with 64) have no entry since session 29 (measured:
// PERF.md sessions 20 and 28; the code path is kept).
// Experiment 16: the production entry with a per-CTA timestamp trace.
PA_MMA_X(bf16, 0, bf16, 0, 16, 2)
// Experiment 256: the half-row loop alone, one instantiation an entry (the
// launcher runs it only where q_len · G <= 8, the production entry
// otherwise): mma_body's H (XV & 256) computes only rows gr of each
// fragment: about 40 of the e4m3 loop's instructions a slice were the
// padding rows' masks, maxima, exponentials, packs and sums (P = 0 there;
// the MMAs still cover 16 rows, whose padding rows are never read). On the
// H200 it read 2.4-4% faster on FP8 bs 64 x 8k than production (PERF.md
// sessions 32, 44), flat on H100s. (Experiment 192, the same loop beside
// the full one in the production entry, chosen per launch at the entry:
// slower on the one-wave latency rows, faster at bs 1 x 32k, sessions 28
// and 31; dropped in session 44 for room.)
PA_MMA_X(bf16, 0, e4m3, 2, 256, 2)
PA_MMA_X(bf16, 0, bf16, 0, 256, 2)
// Experiment 1024 (e4m3): the K/V copies of the XA entries before W (lane
// quads, the L2 hint; mma_body's LQ), the production entry otherwise.
PA_MMA_X(bf16, 0, e4m3, 2, 1024, 2)
// Experiment 5376 = 4096 | 1024 | 256 (e4m3): the pair loop on half rows
// (`_pair_h`) with the K/V copies of 1024 (lane quads with the L2 hint),
// each 3-10% faster alone on the H200 (PERF.md session 45).
PA_MMA_X(bf16, 0, e4m3, 2, 5376, 2)
// (Experiments 2 and 4354, EP: the first K/V tiles' page lookups and
// copies issued before Q is read, session 47; flat on an H100, their
// entries and code dropped in session 48.)
// (Experiments 128 / 4480, PS: the production loops on a persistent grid,
// and 640 / 4992, PS1: the same with the next unit's first ring tiles
// issued before each unit's merge, session 48; on an H100 the persistent
// grid was 17-25% slower on ragged batches (static round-robin over the
// length-ordered units in place of the block scheduler's balance) and
// within 1% on uniform ones, and PS1 failed its bit-identity test against
// the ordinary grid: their entries and code dropped in session 49.)
// Experiment 4368 = 4096 | 256 | 16 (e4m3 K/V): the `_pair_h` loop with
// experiment 16's per-CTA trace, for the FP8 decode's per-CTA start and end
// costs on short requests (session 47).
PA_MMA_X(bf16, 0, e4m3, 2, 4368, 2)
// The pair loop (mma_body's P2: two tiles a step, one softmax over their 32
// keys), the default for bf16 Q with e4m3 K/V at D 128 since session 45
// (H200, FP8 bs 64 x 8k: 303.6 -> 285.2 us, and 272.1 with the half rows;
// PERF.md session 45): `_pair` for every launch of that entry that does not
// fold in clusters, `_pair_h` (the half-row loop, XV & 256) where
// q_len · G <= 8 (src/launch/kernel.rs `pair_loop`). No `_cf` twin: those
// launches fold through the workspace.
PA_MMA_ENTRY(bf16, 0, e4m3, 2, 128, _pair, 4096 | 64, 2)
PA_MMA_ENTRY(bf16, 0, e4m3, 2, 128, _pair_h, 4096 | 256 | 64, 2)

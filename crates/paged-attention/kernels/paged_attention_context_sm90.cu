// mha-kit kernel family: paged-KV attention, context / prefill / chunked
// prefill ("extend") on Hopper (compute_90a: wgmma, setmaxnreg, mbarrier).
// Same semantics, params, device checks and error word as the compute_90
// kernel (paged_attention_context.cu); design: docs/DESIGN.md "Context
// kernel on sm_90a".
//
// Work item = CTA (KV head h, request b, q tile of BM = 128 packed (token,
// head) rows, heaviest tiles launched first). Three warpgroups:
//  * producer (warpgroup 0, setmaxnreg 40): loads the Q tile once, then
//    gathers the tile's keys page by page with 16-byte cp.async into a
//    2-stage K ring and a 2-stage V ring (V one tile behind K), each stage
//    guarded by a full and an empty mbarrier. Page ids are looked up one row
//    per thread and shared through shared memory with a per-key valid mask;
//    keys outside the tile's needed range [k_lo, k_hi) or on bad pages are
//    zero-filled and masked.
//  * two consumers (warpgroups 1-2, setmaxnreg 232), 64 rows each:
//    S = Q K^T with wgmma (both operands in shared memory, 128-byte swizzle),
//    online softmax in f32 registers (exp2, scale_log2 = bmm1_scale log2 e),
//    O += P V with wgmma (P from registers, V transposed from shared memory).
//    Per tile t: issue S_t, issue P_{t-1} V_{t-1}, wait for S_t, softmax of
//    S_t under the running P V, wait, rescale O and pack P_t (the
//    denominator sums the rounded P the numerator uses). Sinks join once at
//    the end; rows that see no key output zeros.
// A key masked for a row never reaches it: masked logits are selected to
// -inf (never multiplied), and on tiles that carry masked keys the V tile is
// scanned for non-finite values; when one is present that tile's P V runs
// as a scalar loop that skips zero weights (0 * NaN would poison the row).
//
// Shared memory layout: every operand tile is stored as 64-column blocks
// ("atoms") of rows x 128 bytes, 16-byte chunk c of row r at
// ((c ^ (r & 7)) * 16): the wgmma 128-byte swizzle.
#include "context_common.cuh"
#include "wgmma_sm90.cuh"

namespace pas {

using namespace pac;

constexpr int BM = 128;        // rows per CTA: 2 consumer warpgroups x 64
constexpr int NTHREADS = 384;  // producer + 2 consumers
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;

template <int D>
struct Cfg {
    static constexpr int BN = D == 256 ? 64 : 128;  // keys per KV tile
    static constexpr int CPR = D / 8;               // 16-byte chunks per row
    static constexpr int Q_ATOM = BM * 128;         // bytes of one 64-column block of Q
    static constexpr int KV_ATOM = BN * 128;
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2;     // one K or V tile
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + Q_BYTES;   // 2 stages
    static constexpr int V_OFF = K_OFF + 2 * KV_BYTES;
    static constexpr int LK_OFF = V_OFF + 2 * KV_BYTES;  // i64 [2][BN][2]: K, V element offsets or -1
    static constexpr int VM_OFF = LK_OFF + 2 * BN * 16;  // u32 [2][BN / 32] valid-key masks
    static constexpr int BAR_OFF = VM_OFF + 2 * (BN / 32) * 4;  // 9 mbarriers
    static constexpr int BYTES = BAR_OFF + 9 * 8;
    static constexpr int ALLOC = BYTES + 1024;  // slack: the base is rounded up to 1024
    static_assert(BAR_OFF % 8 == 0, "mbarrier alignment");
    static_assert((BN * CPR) % 128 == 0 && (BM * CPR) % 128 == 0, "producer split");
};

// ---- mbarrier, named barrier, wgmma and register-budget helpers ----------------
MHA_KIT_DEVICE void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
MHA_KIT_DEVICE void mbar_arrive(u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` once every cp.async this thread issued so far has landed.
MHA_KIT_DEVICE void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
MHA_KIT_DEVICE void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred P1;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
MHA_KIT_DEVICE void named_sync(u32 id, u32 count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// OR of `v` over the `count` threads meeting at named barrier `id`.
MHA_KIT_DEVICE bool named_or(u32 id, u32 count, bool v) {
    u32 r;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(r)
        : "r"((u32)v), "r"(id), "r"(count)
        : "memory");
    return r != 0;
}
MHA_KIT_DEVICE void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MHA_KIT_DEVICE void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MHA_KIT_DEVICE void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator / fragment registers at this point of the program: values
// written by an in-flight wgmma are read only after its wait, and registers an
// in-flight wgmma reads are not reused before it.
template <int N>
MHA_KIT_DEVICE void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
MHA_KIT_DEVICE void fence_regs(u32 (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// wgmma shared-memory descriptor, 128-byte swizzle (addresses and offsets in bytes).
MHA_KIT_DEVICE u64 sdesc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 62);
}

template <int QT, int N>
MHA_KIT_DEVICE void mma_ss(float (&d)[N / 2], u64 a, u64 b, int scale_d) {
    if constexpr (QT == 0 && N == 64) wg::wgmma_ss_bf16_n64(d, a, b, scale_d);
    if constexpr (QT == 0 && N == 128) wg::wgmma_ss_bf16_n128(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 64) wg::wgmma_ss_f16_n64(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 128) wg::wgmma_ss_f16_n128(d, a, b, scale_d);
}
template <int QT, int N>
MHA_KIT_DEVICE void mma_rs(float (&d)[N / 2], const u32 (&a)[4], u64 b, int scale_d) {
    if constexpr (QT == 0 && N == 64) wg::wgmma_rs_bf16_n64(d, a, b, scale_d);
    if constexpr (QT == 0 && N == 128) wg::wgmma_rs_bf16_n128(d, a, b, scale_d);
    if constexpr (QT == 0 && N == 256) wg::wgmma_rs_bf16_n256(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 64) wg::wgmma_rs_f16_n64(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 128) wg::wgmma_rs_f16_n128(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 256) wg::wgmma_rs_f16_n256(d, a, b, scale_d);
}

// Byte offset of 16-byte chunk `ch` of row `row` in a swizzled tile of `atom` bytes per 64 columns.
MHA_KIT_DEVICE u32 swz(int row, int ch, int atom) {
    return (u32)((ch >> 3) * atom + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
}

template <int QT, int D>
MHA_KIT_DEVICE void context_sm90_body(const ContextParams& p) {
    using C = Cfg<D>;
    constexpr int BN = C::BN;
    constexpr int CPR = C::CPR;
    constexpr int NS = BN / 2;   // S accumulator registers per thread
    constexpr int NO = D / 2;    // O accumulator registers per thread
    constexpr int KSTEPS = BN / 16;
    constexpr int VMW = BN / 32;

    extern __shared__ __align__(16) u8 smem_raw[];
    const u32 raw_base = smem_u32(smem_raw);
    const u32 base = (raw_base + 1023u) & ~1023u;
    u8* smem = smem_raw + (base - raw_base);
    longlong2* lk_s = reinterpret_cast<longlong2*>(smem + C::LK_OFF);
    u32* vm_s = reinterpret_cast<u32*>(smem + C::VM_OFF);
    const u32 bar_q = base + C::BAR_OFF;
    const u32 bar_fk = bar_q + 8;   // [2] K landed
    const u32 bar_fv = bar_q + 24;  // [2] V landed
    const u32 bar_ek = bar_q + 40;  // [2] K consumed
    const u32 bar_ev = bar_q + 56;  // [2] V consumed

    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int tile = p.q_tiles - 1 - (int)blockIdx.z;  // heaviest (last) q tiles first
    const int tid = threadIdx.x;
    const int G = p.group;

    const bool reporter = tile == 0 && h == 0;
    const Geom g = request_geom(p, b, reporter && tid == 0);
    if (g.skip) return;
    if (reporter) report_bad_pages(p, g, b, tid, NTHREADS);

    const i32 rows_total = g.n * G;
    const i32 r0 = tile * BM;
    if (r0 >= rows_total) return;
    const int rows = min(BM, rows_total - r0);
    const i32 x_base = g.len - g.n;
    const i32 x_min = x_base + r0 / G;
    const i32 x_max = x_base + (r0 + rows - 1) / G;
    const i32 k_hi = max(x_max + 1, 0);
    const i32 k_lo = p.window_left >= 0 ? max(x_min - p.window_left, 0) : 0;
    const i32 t_first = k_lo / BN;
    const int ntiles = k_hi > k_lo ? (k_hi - 1) / BN - t_first + 1 : 0;

    if (tid == 0) {
        mbar_init(bar_q, 128);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            mbar_init(bar_fk + 8 * s, 256);  // 128 cp.async arrivals + 128 thread arrivals
            mbar_init(bar_fv + 8 * s, 128);
            mbar_init(bar_ek + 8 * s, 256);
            mbar_init(bar_ev + 8 * s, 256);
        }
    }
    __syncthreads();

    if (tid < 128) {
        // ================================ producer ================================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        const int pt = tid;
        // Q: packed rows r0 .. r0 + rows (zeros past `rows`).
#pragma unroll 1
        for (int c = pt; c < BM * CPR; c += 128) {
            const int row = c / CPR;
            const int ch = c % CPR;
            const bool valid = row < rows;
            const u16* src = p.q;
            if (valid) {
                const int rg = r0 + row;
                const int j = rg / G;
                const int gq = rg - j * G;
                src += (i64)(g.row_start + j) * p.q_stride_tok + (i64)(h * G + gq) * p.q_stride_head + ch * 8;
            }
            cp_async16(base + C::Q_OFF + swz(row, ch, C::Q_ATOM), src, valid ? 16u : 0u);
        }
        mbar_arrive_cp_async(bar_q);

        const i32* pt_row = p.page_table + (i64)b * p.page_table_stride;
        // Page lookup of tile t: one key row per thread; the row's K and V
        // element offsets (-1: zero-fill) and the tile's valid-key mask.
        auto lookup = [&](int t) {
            const int s = t & 1;
            named_sync(1, 128);  // every producer thread is done reading lk[s] (V of tile t - 2)
            if (pt < BN) {
                const i32 k = (t_first + t) * BN + pt;
                bool ok = k >= k_lo && k < k_hi;
                const i32 pg = ok ? k / p.page_size : 0;
                const i32 off = k - pg * p.page_size;
                ok = ok && pg < p.max_num_pages;
                const i32 id = ok ? __ldg(pt_row + pg) : -1;
                ok = ok && id >= 0 && id < p.num_pages;
                longlong2 e = make_longlong2(-1, -1);
                if (ok) {
                    e.x = (i64)id * p.k_stride_page + (i64)h * p.k_stride_head + (i64)off * p.k_stride_tok;
                    e.y = (i64)id * p.v_stride_page + (i64)h * p.v_stride_head + (i64)off * p.v_stride_tok;
                }
                lk_s[s * BN + pt] = e;
                const u32 m = __ballot_sync(0xffffffffu, ok);
                if ((pt & 31) == 0) vm_s[s * VMW + pt / 32] = m;
            }
            named_sync(1, 128);
        };
        // Copies K (or V) of tile t: thread pt copies chunk pt % CPR of rows pt / CPR + i * (128 / CPR).
        auto issue = [&](int t, bool is_v) {
            const int s = t & 1;
            const int ch = pt % CPR;
            const u16* cache = reinterpret_cast<const u16*>(is_v ? p.v_cache : p.k_cache) + ch * 8;
            const u32 dst0 = base + (is_v ? C::V_OFF : C::K_OFF) + s * C::KV_BYTES;
            const i64* offs = reinterpret_cast<const i64*>(lk_s + s * BN) + (is_v ? 1 : 0);
#pragma unroll 2
            for (int row = pt / CPR; row < BN; row += 128 / CPR) {
                const i64 e = offs[2 * row];
                const bool ok = e >= 0;
                cp_async16(dst0 + swz(row, ch, C::KV_ATOM), ok ? cache + e : cache, ok ? 16u : 0u);
            }
        };
        auto issue_v = [&](int t) {
            if (t >= 2) mbar_wait(bar_ev + 8 * (t & 1), ((t >> 1) - 1) & 1);
            issue(t, true);
            mbar_arrive_cp_async(bar_fv + 8 * (t & 1));
        };
        for (int t = 0; t < ntiles; ++t) {
            if (t >= 2) mbar_wait(bar_ek + 8 * (t & 1), ((t >> 1) - 1) & 1);
            lookup(t);
            issue(t, false);
            mbar_arrive_cp_async(bar_fk + 8 * (t & 1));
            mbar_arrive(bar_fk + 8 * (t & 1));  // releases the valid mask written by lookup
            if (t >= 1) issue_v(t - 1);
        }
        if (ntiles >= 1) issue_v(ntiles - 1);
        cp_async_wait<0>();
        return;
    }

    // ================================ consumers ================================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = tid / 128 - 1;        // consumer warpgroup 0/1
    const int ct = tid & 127;
    const int warp = ct >> 5;
    const int lane = ct & 31;
    const int gr = lane >> 2;
    const int qd = lane & 3;
    const int wrow0 = 64 * cw;           // first tile row of this warpgroup
    const bool active = wrow0 < rows;    // warpgroup-uniform
    const i32 xw_min = x_base + (r0 + wrow0) / G;
    const i32 xw_max = x_base + (r0 + min(wrow0 + 63, rows - 1)) / G;
    i32 xr[2], xlo[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int row = wrow0 + 16 * warp + gr + 8 * hr;
        xr[hr] = row < rows ? x_base + (r0 + row) / G : -1;  // padding rows see no key
        xlo[hr] = p.window_left >= 0 ? xr[hr] - p.window_left : (i32)0x80000000;
    }

    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.f;
    float s[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] = 0.f;
    u32 pa[KSTEPS][4];
#pragma unroll
    for (int i = 0; i < KSTEPS; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) pa[i][e] = 0u;
    float mrow[2] = {PAC_NEG_INF, PAC_NEG_INF};
    float drow[2] = {0.f, 0.f};
    float alpha[2] = {0.f, 0.f};

    const u32 q_addr = base + C::Q_OFF + wrow0 * 128;
    auto qk = [&](int st) {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            const u32 qa = q_addr + (ks >> 2) * C::Q_ATOM + (ks & 3) * 32;
            const u32 ka = base + C::K_OFF + st * C::KV_BYTES + (ks >> 2) * C::KV_ATOM + (ks & 3) * 32;
            mma_ss<QT, BN>(s, sdesc(qa, 16, 1024), sdesc(ka, 16, 1024), ks > 0 ? 1 : 0);
        }
        wg_commit();
    };
    auto pv = [&](int st) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            const u32 va = base + C::V_OFF + st * C::KV_BYTES + kk * 16 * 128;
            mma_rs<QT, D>(o, pa[kk], sdesc(va, C::KV_ATOM, 1024), 1);
        }
        wg_commit();
    };
    // Whether tile t needs no element mask for this warpgroup's rows.
    auto tile_full = [&](int t, const u32 (&vmw)[VMW]) {
        const i32 k0 = (t_first + t) * BN;
        bool full = k0 + BN - 1 <= xw_min && (p.window_left < 0 || k0 >= xw_max - p.window_left);
#pragma unroll
        for (int w = 0; w < VMW; ++w) full = full && vmw[w] == 0xffffffffu;
        return full;
    };
    // Mask (edge tiles), scale, running max, exponentials in place (s becomes P in f32).
    auto softmax = [&](int t, bool full, const u32 (&vmw)[VMW]) {
        const i32 k0 = (t_first + t) * BN;
        float mx[2] = {PAC_NEG_INF, PAC_NEG_INF};
        if (full) {
#pragma unroll
            for (int i = 0; i < NS; ++i) {
                s[i] *= p.scale_log2;
                mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < NS; ++i) {
                const int j = i >> 2;
                const int hr = (i >> 1) & 1;
                const int tk = 8 * j + 2 * qd + (i & 1);
                const i32 k = k0 + tk;
                const bool vis = ((vmw[j >> 2] >> (tk & 31)) & 1u) && k <= xr[hr] && k >= xlo[hr];
                s[i] = vis ? s[i] * p.scale_log2 : PAC_NEG_INF;
                mx[hr] = fmaxf(mx[hr], s[i]);
            }
        }
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
            const float mnew = fmaxf(mrow[hr], mx[hr]);
            const float msafe = mnew == PAC_NEG_INF ? 0.f : mnew;  // no (-inf) - (-inf)
            alpha[hr] = ex2(mrow[hr] - msafe);
            mrow[hr] = mnew;
            mx[hr] = msafe;
        }
#pragma unroll
        for (int i = 0; i < NS; ++i) s[i] = ex2(s[i] - mx[(i >> 1) & 1]);
    };
    // O *= alpha; P = 16-bit S; the denominator adds the rounded P.
    auto rescale_pack = [&]() {
#pragma unroll
        for (int i = 0; i < NO; ++i) o[i] *= alpha[(i >> 1) & 1];
        float dsum[2] = {0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 8 * kk + 2 * e;
                const u32 w = pack2<QT>(s[i], s[i + 1]);
                pa[kk][e] = w;
                dsum[e & 1] += sum2<QT>(w);
            }
        }
        drow[0] = drow[0] * alpha[0] + dsum[0];
        drow[1] = drow[1] * alpha[1] + dsum[1];
    };
    // Whether V of stage st holds a non-finite value (warpgroup-wide).
    auto v_nonfinite = [&](int st) {
        const u8* v = smem + C::V_OFF + st * C::KV_BYTES;
        bool bad = false;
#pragma unroll 4
        for (int off = ct * 16; off < C::KV_BYTES; off += 128 * 16) {
            const uint4 u = *reinterpret_cast<const uint4*>(v + off);
            bad = bad || nonfinite2<QT>(u.x) || nonfinite2<QT>(u.y) || nonfinite2<QT>(u.z) ||
                  nonfinite2<QT>(u.w);
        }
        return named_or(2 + cw, 128, bad);
    };
    // O += P V for stage st on CUDA cores (tiles with masked keys and non-finite V).
    auto pv_slow = [&](int st) {
        const u8* v = smem + C::V_OFF + st * C::KV_BYTES;
        pv_scalar<QT, BN, D>(
            pa, lane, [&](int j, int e) -> float& { return o[4 * j + e]; },
            [&](int key, int ch) { return v + swz(key, ch, C::KV_ATOM); });
    };

    if (ntiles > 0) {
        mbar_wait(bar_q, 0);
        u32 vmw[VMW];
        // ---- tile 0 ----
        mbar_wait(bar_fk, 0);
#pragma unroll
        for (int w = 0; w < VMW; ++w) vmw[w] = vm_s[w];
        bool prev_full = tile_full(0, vmw);
        if (active) {
            qk(0);
            wg_wait<0>();
            fence_regs(s);
        }
        mbar_arrive(bar_ek);
        if (active) {
            softmax(0, prev_full, vmw);
            rescale_pack();
        }
        // ---- tiles 1 .. ntiles - 1: S_t overlaps P_{t-1} V_{t-1} ----
#pragma unroll 1
        for (int t = 1; t < ntiles; ++t) {
            const int st = t & 1;
            const int sp = st ^ 1;
            mbar_wait(bar_fk + 8 * st, (t >> 1) & 1);
#pragma unroll
            for (int w = 0; w < VMW; ++w) vmw[w] = vm_s[st * VMW + w];
            const bool full = tile_full(t, vmw);
            mbar_wait(bar_fv + 8 * sp, ((t - 1) >> 1) & 1);
            bool slow = false;
            if (active) {
                qk(st);
                slow = !prev_full && v_nonfinite(sp);
                if (slow) {
                    wg_wait<0>();
                } else {
                    pv(sp);
                    wg_wait<1>();
                }
                fence_regs(s);
            }
            mbar_arrive(bar_ek + 8 * st);
            if (active) {
                softmax(t, full, vmw);
                if (slow) {
                    pv_slow(sp);
                } else {
                    wg_wait<0>();
                    fence_regs(o);
                    fence_regs(pa);
                }
            }
            mbar_arrive(bar_ev + 8 * sp);
            if (active) rescale_pack();
            prev_full = full;
        }
        // ---- last P V ----
        const int sl = (ntiles - 1) & 1;
        mbar_wait(bar_fv + 8 * sl, ((ntiles - 1) >> 1) & 1);
        if (active) {
            if (!prev_full && v_nonfinite(sl)) {
                pv_slow(sl);
            } else {
                pv(sl);
                wg_wait<0>();
                fence_regs(o);
                fence_regs(pa);
            }
        }
        mbar_arrive(bar_ev + 8 * sl);
    }
    if (!active) return;

    // ---- epilogue: each thread writes its two rows' columns ----
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        float den = drow[hr];
        den += __shfl_xor_sync(0xffffffffu, den, 1);
        den += __shfl_xor_sync(0xffffffffu, den, 2);
        const int row = wrow0 + 16 * warp + gr + 8 * hr;
        if (row >= rows) continue;
        const int rg = r0 + row;
        const int j = rg / G;
        const int qh = h * G + (rg - j * G);
        float scale = 0.f;
        if (den > 0.f) {
            const float mm = mrow[hr];
            if (p.sinks != nullptr) {
                const float sg = p.sinks[qh] * LOG2E;
                const float m2 = fmaxf(mm, sg);
                const float w = ex2(mm - m2);
                scale = p.bmm2_scale * w / (den * w + ex2(sg - m2));
            } else {
                scale = p.bmm2_scale / den;
            }
        }
        u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + 2 * qd;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            *reinterpret_cast<u32*>(dst + 8 * n) = pack2<QT>(o[4 * n + 2 * hr] * scale, o[4 * n + 2 * hr + 1] * scale);
        }
    }
}

}  // namespace pas

// Entries: paged_attention_context_sm90_{q}_kv_{q}_d{D} (16-bit KV of the Q dtype).
#define PAS_ENTRY(QN, QT, D)                                                                       \
    extern "C" __global__ void __launch_bounds__(pas::NTHREADS, 1)                                \
        paged_attention_context_sm90_##QN##_kv_##QN##_d##D(const ContextParams p) {               \
        pas::context_sm90_body<QT, D>(p);                                                         \
    }

PAS_ENTRY(bf16, 0, 64)
PAS_ENTRY(bf16, 0, 128)
PAS_ENTRY(bf16, 0, 256)
PAS_ENTRY(f16, 1, 64)
PAS_ENTRY(f16, 1, 128)
PAS_ENTRY(f16, 1, 256)

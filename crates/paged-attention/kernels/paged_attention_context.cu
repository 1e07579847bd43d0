// mha-kit kernel family: paged-KV attention, context / prefill / chunked
// prefill ("extend"). Semantics: SEMANTICS.md §attention.2-7 (context call
// §attention.4.2), SEMANTICS.md §fp8-kv.4, DESIGN.md D4, D10, D12, D13. Design (the
// compute_90 FA2 structure) below.
//
// Work item = CTA (KV head h, request b, q tile). The rows of request b for the
// G query heads sharing h are packed token-major (r -> token j = r / G, head
// g = r % G) and cut into tiles of BM = 16 * NW rows; warp w owns rows
// 16w .. 16w + 15 over the whole key range (no cross-warp merge). Row r sits
// at x = L - n + j and sees keys max(0, x - W) ..= x. The CTA walks 64-key
// tiles at absolute positions from the tile holding x_min - W (window) or 0 to
// the tile holding x_max: tiles past the diagonal and left of the window are
// never loaded. Only tiles crossing the diagonal, the window edge, the tile's
// needed range [k_lo, k_hi) or a bad page get per-element masks.
//
// Pipeline: NST-slot ring of K and V tiles (cp.async 16 B, L2 only, zero-fill
// for keys outside [k_lo, k_hi) or on bad pages), page ids read one tile ahead
// of their issue. 16-bit K/V rows are XOR-swizzled by 16-byte chunk
// (chunk ^ (row & 7)) for conflict-free ldmatrix; e4m3 tiles land linear and
// are converted once per CTA into one swizzled 16-bit tile of the Q dtype.
// S = Q K^T and O += P V with mma.sync m16n8k16 (f32 accumulate), online
// softmax in f32 with exp2 (scale_log2 = bmm1_scale * log2 e); the
// denominator sums the rounded P the numerator uses. Sinks are added once at
// the end. Rows with no visible key output zeros (D13).
//
// The params struct is mirrored by `ContextParams` in src/context.rs; a CPU
// test pins its size and field offsets.
#include "context_common.cuh"

namespace pac {

constexpr int BN = 64;  // keys per KV tile

template <int D, int KV>
struct Cfg {
    static constexpr int NW = D == 256 ? 8 : 4;  // warps; 16 rows each
    static constexpr int NT = 32 * NW;
    static constexpr int BM = 16 * NW;           // rows per CTA
    static constexpr int ES = KV == 2 ? 1 : 2;
    static constexpr int RRB = D * ES;           // raw row bytes
    static constexpr int CPR = RRB / 16;         // 16-byte chunks per raw row
    static constexpr int HRB = D * 2;            // 16-bit row bytes
    static constexpr int NST = D == 64 ? 4 : (D == 128 ? (KV == 2 ? 4 : 3) : 2);
    static constexpr int RAW = BN * RRB * 2;     // one ring slot: K rows then V rows
    static constexpr int CONV = KV == 2 ? BN * HRB * 2 : 0;
    static constexpr bool Q_REGS = D <= 128;     // Q fragments in registers; else re-read from smem
    static constexpr int QB = BM * HRB;
    static constexpr int CONV_OFF = NST * RAW;
    // D <= 128: Q is staged in the (not yet used) ring before the pipeline starts.
    static constexpr int Q_OFF = Q_REGS ? 0 : CONV_OFF + CONV;
    static constexpr int VM_OFF = Q_REGS ? CONV_OFF + CONV : Q_OFF + QB;  // u32 [NST][NW]
    static constexpr int BYTES = (VM_OFF + NST * NW * 4 + 15) / 16 * 16;
    static constexpr int TPR = NT / BN;          // loader threads per key row
    static constexpr int CPT = CPR / TPR;        // chunks per thread per tensor
    static_assert(TPR * BN == NT && CPT * TPR == CPR, "loader split");
    static_assert(!Q_REGS || QB <= NST * RAW, "Q staging fits in the ring");
    static_assert((2 * BN * CPR) % NT == 0, "conversion split");
    static_assert((BM * (D / 8)) % NT == 0, "Q load split");
};

// Page lookup of the key row a loader thread copies.
struct Look {
    i32 id, off;
    bool ok;
};

template <int QT, int KV, int D>
MHA_KIT_DEVICE void context_body(const ContextParams& p) {
    using C = Cfg<D, KV>;
    constexpr int NW = C::NW;
    constexpr int NT = C::NT;
    constexpr int BM = C::BM;
    constexpr int NST = C::NST;
    constexpr int ES = C::ES;
    constexpr int RRB = C::RRB;
    constexpr int HRB = C::HRB;
    constexpr int CPR = C::CPR;
    constexpr int TPR = C::TPR;
    constexpr int KSTEPS = D / 16;
    constexpr int NT8 = D / 8;
    constexpr int SUB = D == 256 ? 2 : 1;  // compute sub-steps per KV tile
    constexpr int KW = BN / SUB;            // keys per sub-step
    constexpr int NS8 = KW / 8;             // n8 tiles of S per sub-step

    extern __shared__ __align__(16) u8 smem[];
    u32* vm_s = reinterpret_cast<u32*>(smem + C::VM_OFF);
    const u32 smem_base = smem_u32(smem);

    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int tile = p.q_tiles - 1 - (int)blockIdx.z;  // heaviest (last) q tiles first
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int G = p.group;

    const bool reporter = tile == 0 && h == 0;
    const Geom g = request_geom(p, b, reporter && tid == 0);
    if (g.skip) return;

    if (reporter) report_bad_pages(p, g, b, tid, NT);

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

    const i32* pt_row = p.page_table + (i64)b * p.page_table_stride;
    const i64 k_head = (i64)h * p.k_stride_head;
    const i64 v_head = (i64)h * p.v_stride_head;

    // ---- Q: rows r0 .. r0 + rows of the tile into swizzled smem (zeros past `rows`) ----
    {
        const u32 qdst = smem_base + C::Q_OFF;
        constexpr int QCH = D / 8;  // 16-byte chunks per Q row
#pragma unroll
        for (int it = 0; it < BM * QCH / NT; ++it) {
            const int c = tid + it * NT;
            const int row = c / QCH;
            const int ch = c % QCH;
            const bool valid = row < rows;
            const int rg = r0 + row;
            const u16* src = p.q;
            if (valid) {
                const int j = rg / G;
                const int gq = rg - j * G;
                src += (i64)(g.row_start + j) * p.q_stride_tok + (i64)(h * G + gq) * p.q_stride_head + ch * 8;
            }
            cp_async16(qdst + row * HRB + ((ch ^ (row & 7)) * 16), src, valid ? 16u : 0u);
        }
        cp_async_commit();
    }

    // Per-lane ldmatrix coordinates.
    const int mi = lane >> 3;
    const int mr = lane & 7;
    const int a_row = warp * 16 + (mi & 1) * 8 + mr;  // Q (A): (r0-7,c0) (r8-15,c0) (r0-7,c1) (r8-15,c1)
    const int a_cb = mi >> 1;
    const int k_row = (mi >> 1) * 8 + mr;             // K: (t0-7,c0) (t0-7,c1) (t8-15,c0) (t8-15,c1)
    const int k_cb = mi & 1;
    const int v_row = (mi & 1) * 8 + mr;              // V: (t0-7,c0) (t8-15,c0) (t0-7,c1) (t8-15,c1)
    const int v_cb = mi >> 1;

    u32 qa[C::Q_REGS ? KSTEPS : 1][4];
    if constexpr (C::Q_REGS) {
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            ldsm_x4(qa[kk], smem_base + C::Q_OFF + a_row * HRB + (((2 * kk + a_cb) ^ (a_row & 7)) * 16));
        }
        __syncthreads();  // the ring may now overwrite the staged Q
    }

    // ---- loader: thread copies key row lrow of a tile, chunks lsub + TPR * i ----
    const int lrow = tid / TPR;
    const int lsub = tid % TPR;
    auto lookup = [&](Look& lk, int t) {
        const i32 k = (t_first + t) * BN + lrow;
        lk.ok = t < ntiles && k >= k_lo && k < k_hi;
        const i32 pg = lk.ok ? k / p.page_size : 0;
        lk.off = k - pg * p.page_size;
        lk.ok = lk.ok && pg < p.max_num_pages;
        lk.id = lk.ok ? __ldg(pt_row + pg) : 0;
    };
    auto issue = [&](const Look& lk, int t) {
        if (t >= ntiles) return;  // CTA-uniform
        const int slot = t % NST;
        const bool ok = lk.ok && lk.id >= 0 && lk.id < p.num_pages;
        const u32 m = __ballot_sync(0xffffffffu, ok);
        if (lane == 0) vm_s[slot * NW + warp] = m;
        const u8* kp = p.k_cache;
        const u8* vp = p.v_cache;
        if (ok) {
            kp += ((i64)lk.id * p.k_stride_page + k_head + (i64)lk.off * p.k_stride_tok) * ES;
            vp += ((i64)lk.id * p.v_stride_page + v_head + (i64)lk.off * p.v_stride_tok) * ES;
        }
        const u32 sz = ok ? 16u : 0u;
        const u32 kdst = smem_base + slot * C::RAW + lrow * RRB;
        const u32 vdst = kdst + BN * RRB;
#pragma unroll
        for (int i = 0; i < C::CPT; ++i) {
            const int cc = lsub + TPR * i;
            const int pc = KV == 2 ? cc : (cc ^ (lrow & 7));
            cp_async16(kdst + pc * 16, kp + (ok ? cc * 16 : 0), sz);
            cp_async16(vdst + pc * 16, vp + (ok ? cc * 16 : 0), sz);
        }
    };

    // ---- per-thread rows (fragment rows gr and gr + 8 of the warp) ----
    const int gr = lane >> 2;
    const int qd = lane & 3;
    const bool warp_active = warp * 16 < rows;
    i32 xr[2], xlo[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int row = warp * 16 + gr + 8 * hr;
        const bool valid = row < rows;
        xr[hr] = valid ? x_base + (r0 + row) / G : -1;  // padding rows see no key
        xlo[hr] = p.window_left >= 0 ? xr[hr] - p.window_left : (i32)0x80000000;
    }

    float o[NT8][4];
#pragma unroll
    for (int n = 0; n < NT8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    float mrow[2] = {PAC_NEG_INF, PAC_NEG_INF};
    float drow[2] = {0.f, 0.f};

    // ---- prologue: NST - 1 tiles in flight, the next page id requested ----
    {
        Look pro[NST - 1];
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) lookup(pro[s], s);
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            issue(pro[s], s);
            cp_async_commit();
        }
    }
    Look nxt;
    lookup(nxt, NST - 1);

    for (int t = 0; t < ntiles; ++t) {
        cp_async_wait<NST - 2>();
        __syncthreads();  // tile t landed for every thread; slot (t-1) % NST is free
        issue(nxt, t + NST - 1);
        cp_async_commit();
        lookup(nxt, t + NST);

        const int slot = t % NST;
        u32 kbase = smem_base + slot * C::RAW;
        u32 vbase = kbase + BN * RRB;
        if constexpr (KV == 2) {
            // Convert the slot once per CTA to the Q dtype (swizzled 16-bit rows).
            const u8* raw = smem + slot * C::RAW;
            u8* conv = smem + C::CONV_OFF;
#pragma unroll 2
            for (int it = 0; it < 2 * BN * CPR / NT; ++it) {
                const int c = tid + it * NT;
                const int row = c / CPR;  // 0..127 (64.. = V)
                const int c8 = c % CPR;
                const uint4 u = *reinterpret_cast<const uint4*>(raw + row * RRB + c8 * 16);
                u32 w[8];
                e4m3x4_to_half<QT>(u.x, w[0], w[1]);
                e4m3x4_to_half<QT>(u.y, w[2], w[3]);
                e4m3x4_to_half<QT>(u.z, w[4], w[5]);
                e4m3x4_to_half<QT>(u.w, w[6], w[7]);
                const int rr = row & (BN - 1);
                u8* dst = conv + row * HRB;
                *reinterpret_cast<uint4*>(dst + (((2 * c8) ^ (rr & 7)) * 16)) = make_uint4(w[0], w[1], w[2], w[3]);
                *reinterpret_cast<uint4*>(dst + (((2 * c8 + 1) ^ (rr & 7)) * 16)) = make_uint4(w[4], w[5], w[6], w[7]);
            }
            __syncthreads();
            kbase = smem_base + C::CONV_OFF;
            vbase = kbase + BN * HRB;
        }
        if (!warp_active) continue;  // warp-uniform: this warp's rows are all padding

        const i32 k0 = (t_first + t) * BN;
        bool full = k0 + BN - 1 <= x_min && (p.window_left < 0 || k0 >= x_max - p.window_left);
        if (full) {
#pragma unroll
            for (int w = 0; w < NW; ++w) full = full && vm_s[slot * NW + w] == 0xffffffffu;
        }
        // The 64-key tile in SUB sub-steps of KW keys (D 256: 2 x 32, fewer live registers).
#pragma unroll 1
        for (int sub = 0; sub < SUB; ++sub) {
            // S = Q K^T: 16 rows x KW keys (NS8 n8 tiles).
            float s[NS8][4];
#pragma unroll
            for (int n = 0; n < NS8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                u32 a[4];
                if constexpr (C::Q_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[e] = qa[kk][e];
                } else {
                    ldsm_x4(a, smem_base + C::Q_OFF + a_row * HRB + (((2 * kk + a_cb) ^ (a_row & 7)) * 16));
                }
#pragma unroll
                for (int np = 0; np < NS8 / 2; ++np) {
                    u32 r[4];
                    const int kr = sub * KW + np * 16 + k_row;
                    ldsm_x4(r, kbase + kr * HRB + (((2 * kk + k_cb) ^ (kr & 7)) * 16));
                    mma16816<QT>(s[2 * np], a, r[0], r[1]);
                    mma16816<QT>(s[2 * np + 1], a, r[2], r[3]);
                }
            }

            // Mask (edge tiles only), scale, online softmax.
            float mx[2] = {PAC_NEG_INF, PAC_NEG_INF};
            if (full) {
#pragma unroll
                for (int n = 0; n < NS8; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[n][e] *= p.scale_log2;
                        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
                    }
            } else {
#pragma unroll
                for (int n = 0; n < NS8; ++n) {
                    const u32 vmw = vm_s[slot * NW + ((sub * KW + 8 * n) * TPR) / 32];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int tk = sub * KW + 8 * n + 2 * qd + (e & 1);
                        const i32 k = k0 + tk;
                        const int hr = e >> 1;
                        const bool vis = ((vmw >> ((tk * TPR) & 31)) & 1u) && k <= xr[hr] && k >= xlo[hr];
                        s[n][e] = vis ? s[n][e] * p.scale_log2 : PAC_NEG_INF;
                        mx[hr] = fmaxf(mx[hr], s[n][e]);
                    }
                }
            }
            float alpha[2];
            row_max_update(mx, mrow, alpha);
            u32 pa[NS8 / 2][4];
            float dsum[2] = {0.f, 0.f};
#pragma unroll
            for (int n = 0; n < NS8; ++n) {
                const u32 lo = pack2<QT>(ex2(s[n][0] - mx[0]), ex2(s[n][1] - mx[0]));
                const u32 hi = pack2<QT>(ex2(s[n][2] - mx[1]), ex2(s[n][3] - mx[1]));
                pa[n >> 1][2 * (n & 1)] = lo;
                pa[n >> 1][2 * (n & 1) + 1] = hi;
                dsum[0] += sum2<QT>(lo);
                dsum[1] += sum2<QT>(hi);
            }
            // The denominator sums the rounded P the numerator uses.
            drow[0] = drow[0] * alpha[0] + dsum[0];
            drow[1] = drow[1] * alpha[1] + dsum[1];
#pragma unroll
            for (int n = 0; n < NT8; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }
            // A tile with masked keys whose V holds NaN/Inf: P V on CUDA cores,
            // skipping zero weights (the MMA would give 0 * NaN = NaN).
            bool slow = false;
            if (!full) {
                bool bad = false;
                const u8* vt = smem + (vbase - smem_base) + sub * KW * HRB;
#pragma unroll 4
                for (int off = lane * 16; off < KW * HRB; off += 32 * 16) {
                    const uint4 u = *reinterpret_cast<const uint4*>(vt + off);
                    bad = bad || nonfinite2<QT>(u.x) || nonfinite2<QT>(u.y) || nonfinite2<QT>(u.z) ||
                          nonfinite2<QT>(u.w);
                }
                slow = __any_sync(0xffffffffu, bad);
            }
            if (slow) {
                const u8* vt = smem + (vbase - smem_base);
                pv_scalar<QT, KW, D>(
                    pa, lane, [&](int j, int e) -> float& { return o[j][e]; },
                    [&](int key, int ch) {
                        const int vr = sub * KW + key;
                        return vt + vr * HRB + ((ch ^ (vr & 7)) * 16);
                    });
                continue;
            }
            // O += P V: k16 steps of 16 keys.
#pragma unroll
            for (int ks = 0; ks < NS8 / 2; ++ks) {
                const int vr = sub * KW + ks * 16 + v_row;
#pragma unroll
                for (int dn = 0; dn < D / 16; ++dn) {
                    u32 r[4];
                    ldsm_x4_t(r, vbase + vr * HRB + (((2 * dn + v_cb) ^ (vr & 7)) * 16));
                    mma16816<QT>(o[2 * dn], pa[ks], r[0], r[1]);
                    mma16816<QT>(o[2 * dn + 1], pa[ks], r[2], r[3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    if (!warp_active) return;

    // ---- epilogue: each warp owns its rows completely ----
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        float den = drow[hr];
        den += __shfl_xor_sync(0xffffffffu, den, 1);
        den += __shfl_xor_sync(0xffffffffu, den, 2);
        const int row = warp * 16 + gr + 8 * hr;
        if (row >= rows) continue;
        const int rg = r0 + row;
        const int j = rg / G;
        const int qh = h * G + (rg - j * G);
        const float scale = out_scale(den, mrow[hr], p.sinks, qh, p.bmm2_scale);
        if (p.lse != nullptr && qd == 0)
            p.lse[(i64)(g.row_start + j) * p.lse_stride_tok + qh] = row_lse(den, mrow[hr], p.sinks, qh);
        u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + 2 * qd;
#pragma unroll
        for (int n = 0; n < NT8; ++n) {
            *reinterpret_cast<u32*>(dst + 8 * n) = pack2<QT>(o[n][2 * hr] * scale, o[n][2 * hr + 1] * scale);
        }
    }
}

}  // namespace pac

// Entries: paged_attention_context_{q}_kv_{kv}_d{D}; KV is the Q dtype or e4m3.
#define PAC_ENTRY(QN, QT, KVN, KV, D, MINB)                                                            \
    extern "C" __global__ void __launch_bounds__(pac::Cfg<D, KV>::NT, MINB)                          \
        paged_attention_context_##QN##_kv_##KVN##_d##D(const ContextParams p) {                     \
        pac::context_body<QT, KV, D>(p);                                                           \
    }

#define PAC_ENTRY_D(QN, QT, KVN, KV) \
    PAC_ENTRY(QN, QT, KVN, KV, 64, 3) \
    PAC_ENTRY(QN, QT, KVN, KV, 128, 2) \
    PAC_ENTRY(QN, QT, KVN, KV, 256, 1)

PAC_ENTRY_D(bf16, 0, bf16, 0)
PAC_ENTRY_D(bf16, 0, e4m3, 2)
PAC_ENTRY_D(f16, 1, f16, 1)
PAC_ENTRY_D(f16, 1, e4m3, 2)

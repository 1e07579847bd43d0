// mha-kit paged-attention: device helpers shared by the decode/verify kernel
// (paged_attention.cu) and the context kernel (paged_attention_context.cu).
#pragma once
#include "mha_kit/common.cuh"

namespace pac {

constexpr float LOG2E = 1.4426950408889634f;

#define PAC_NEG_INF __int_as_float(0xff800000)

// 2^x, results below 2^-126 flushed to zero: one MUFU.EX2, where the
// non-.ftz form adds a range test and two multiplies around it (three of the
// decode loop's instructions per score). A weight that small is below f16's
// range and 2^-126 of the row's largest weight (1) in bf16 / f32.
MHA_KIT_DEVICE float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Online-softmax running max of the two fragment rows a thread holds (quad
// lanes 4i..4i+3 share a row): mx[hr] is this tile's max in log2 units on
// entry; on return mrow[hr] is the new running max, alpha[hr] the rescale of
// the old sums (2^(old - new), 0 when nothing was seen yet) and mx[hr] the
// max to subtract (0 for a row that has seen no key: no (-inf) - (-inf)).
// NHR = 1: row gr only (the other half all padding; its entries untouched).
template <int NHR = 2>
MHA_KIT_DEVICE void row_max_update(float (&mx)[2], float (&mrow)[2], float (&alpha)[2]) {
#pragma unroll
    for (int hr = 0; hr < NHR; ++hr) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        const float mnew = fmaxf(mrow[hr], mx[hr]);
        const float msafe = mnew == PAC_NEG_INF ? 0.f : mnew;
        alpha[hr] = ex2(mrow[hr] - msafe);
        mrow[hr] = mnew;
        mx[hr] = msafe;
    }
}

// Natural-log log-sum-exp of a finished row (src/reference.rs, RefOutput::lse):
// m is the running max in log2 units, den = sum 2^(s - m); the head's sink
// logit joins once; -inf for a row that saw no key (den = 0), sinks or not.
MHA_KIT_DEVICE float row_lse(float den, float m, const float* sinks, int qh) {
    if (!(den > 0.f)) return den != den ? den : PAC_NEG_INF;
    if (sinks != nullptr) {
        const float sg = sinks[qh] * LOG2E;
        const float m2 = fmaxf(m, sg);
        return (m2 + __log2f(den * ex2(m - m2) + ex2(sg - m2))) * 0.6931471805599453f;
    }
    return (m + __log2f(den)) * 0.6931471805599453f;
}

// Output scale of a finished row: bmm2 / den, or with the head's sink logit
// (natural log, joins the denominator once): bmm2 w / (den w + 2^(s' - m2)),
// s' = sink log2 e, m2 = max(m, s'), w = 2^(m - m2). m is the row's running
// max in log2 units; a row with den = 0 saw no key and gets 0 (D13).
MHA_KIT_DEVICE float out_scale(float den, float m, const float* sinks, int qh, float bmm2) {
    float scale = 0.f;
    if (den > 0.f) {
        if (sinks != nullptr) {
            const float sg = sinks[qh] * LOG2E;
            const float m2 = fmaxf(m, sg);
            const float w = ex2(m - m2);
            scale = bmm2 * w / (den * w + ex2(sg - m2));
        } else {
            scale = bmm2 / den;
        }
    }
    return scale;
}

MHA_KIT_DEVICE float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

MHA_KIT_DEVICE u32 smem_u32(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// 16-byte async copy global -> shared (L2 only); src_size 0 zero-fills.
MHA_KIT_DEVICE void cp_async16(u32 dst, const void* src, u32 src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
                 : "memory");
}
// cp_async16 with an L2 prefetch hint: the L2 fetches the whole aligned
// 256- / 128-byte block around the source (one DRAM access for a row that
// several lanes and instructions copy 16 bytes at a time).
MHA_KIT_DEVICE void cp_async16_l2_256(u32 dst, const void* src, u32 src_size) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
                 : "memory");
}
MHA_KIT_DEVICE void cp_async16_l2_128(u32 dst, const void* src, u32 src_size) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
                 : "memory");
}
MHA_KIT_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
MHA_KIT_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// D += A * B, m16n8k16, f32 accumulate. QT: 0 = bf16, 1 = f16.
template <int QT>
MHA_KIT_DEVICE void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    if constexpr (QT == 0) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

MHA_KIT_DEVICE void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
MHA_KIT_DEVICE void ldsm_x4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Two f32 -> packed 16-bit pair (lo in the low half), round to nearest even.
template <int QT>
MHA_KIT_DEVICE u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (QT == 0) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

// Sum of the two 16-bit values of a packed pair, in f32.
template <int QT>
MHA_KIT_DEVICE float sum2(u32 v) {
    if constexpr (QT == 0) {
        return __uint_as_float(v << 16) + __uint_as_float(v & 0xffff0000u);
    } else {
        return f16_to_f32((u16)(v & 0xffffu)) + f16_to_f32((u16)(v >> 16));
    }
}

// Four e4m3 bytes -> two packed 16-bit pairs of the Q dtype (exact: every
// e4m3 value is representable in f16 and in bf16).
template <int QT>
MHA_KIT_DEVICE void e4m3x4_to_half(u32 w, u32& lo, u32& hi) {
    u32 h0, h1;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h0) : "h"((u16)(w & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h1) : "h"((u16)(w >> 16)));
    if constexpr (QT == 1) {
        lo = h0;
        hi = h1;
    } else {
        lo = pack2<0>(f16_to_f32((u16)(h0 & 0xffffu)), f16_to_f32((u16)(h0 >> 16)));
        hi = pack2<0>(f16_to_f32((u16)(h1 & 0xffffu)), f16_to_f32((u16)(h1 >> 16)));
    }
}

// Whether a pair of 16-bit values (QT: 0 bf16, 1 f16) holds a non-finite one.
template <int QT>
MHA_KIT_DEVICE bool nonfinite2(u32 w) {
    constexpr u32 E = QT == 0 ? 0x7F80u : 0x7C00u;
    return (w & E) == E || ((w >> 16) & E) == E;
}
template <int QT>
MHA_KIT_DEVICE float half_lo(u32 w) {
    return QT == 0 ? __uint_as_float(w << 16) : f16_to_f32((u16)(w & 0xffffu));
}
template <int QT>
MHA_KIT_DEVICE float half_hi(u32 w) {
    return QT == 0 ? __uint_as_float(w & 0xffff0000u) : f16_to_f32((u16)(w >> 16));
}

// base + a * b with a, b read as unsigned 32-bit values: one wide
// multiply-add (`mad.wide.u32` in PTX, so that the compiler does not
// reassociate a chain of them into separate products and adds); for a, b in
// [0, 2^31) that is the signed product too.
MHA_KIT_DEVICE const u8* mad_wide_u32(i32 a, i32 b, const u8* base) {
    u64 r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(a), "r"(b), "l"(base));
    return reinterpret_cast<const u8*>(r);
}
// v through an empty asm: held in a register, not rebuilt at every use.
MHA_KIT_DEVICE u32 opaque_u32(u32 v) {
    asm volatile("" : "+r"(v));
    return v;
}
// p through an empty asm: the compiler holds the value in registers instead
// of rebuilding it from its operands at every use.
template <typename T>
MHA_KIT_DEVICE const T* opaque_ptr(const T* p) {
    asm volatile("" : "+l"(p));
    return p;
}

}  // namespace pac

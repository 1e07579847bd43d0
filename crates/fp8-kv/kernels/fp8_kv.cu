// mha-kit kernel family: KV-cache writes. `set_kv_buffer` (bf16/f16 rows into
// a same-dtype cache) and the fused FP8 write (quantize k·(1/k_scale),
// v·(1/v_scale) to e4m3, saturating, round-to-nearest-even, every NaN -> 0x7F).
// Semantics: SEMANTICS.md §fp8-kv.1-4 and DESIGN.md D7, D8.
// Params struct and error flags: fp8_kv_abi.cuh, generated from the Rust
// definitions (src/launch.rs, src/lib.rs) by `cargo xtask abi`.
#include "mha_kit/common.cuh"
#include "fp8_kv_abi.cuh"

// Tokens each thread keeps in flight (src/launch.rs: TOKENS_IN_FLIGHT).
#define KV_UNROLL 4


namespace {

MHA_KIT_DEVICE float f16_bits_to_f32(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}

// Exact widening of the low 16 bits of `x` (bf16 or f16) to f32.
template <bool F16>
MHA_KIT_DEVICE float widen_lo(u32 x) {
    return F16 ? f16_bits_to_f32(x & 0xFFFFu) : __uint_as_float(x << 16);
}
template <bool F16>
MHA_KIT_DEVICE float widen_hi(u32 x) {
    return F16 ? f16_bits_to_f32(x >> 16) : __uint_as_float(x & 0xFFFF0000u);
}

// e4m3 bytes of two f32: byte 0 = lo, byte 1 = hi. cvt.rn.satfinite: RNE,
// finite overflow and ±inf -> ±448 (0x7E/0xFE); NaN gives a NaN code, 0x7F or
// 0xFF (see nan_to_7f).
MHA_KIT_DEVICE u32 e4m3x2_raw(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// Every NaN byte (0x7F or 0xFF: satfinite never gives them for a number)
// becomes 0x7F, four bytes at once: x = low 7 bits of each byte; x + 1 carries
// into bit 7 of a byte exactly when x == 0x7F (no carry crosses bytes), and
// that bit clears the byte's sign.
MHA_KIT_DEVICE u32 nan_to_7f(u32 q) {
    const u32 nan = ((q & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
    return q & ~nan;
}

// Four e4m3 bytes of the four 16-bit values in (w0, w1), each times `inv`
// (one f32 rounding, no contraction).
template <bool F16>
MHA_KIT_DEVICE u32 quant4(u32 w0, u32 w1, float inv) {
    const u32 lo = e4m3x2_raw(__fmul_rn(widen_lo<F16>(w0), inv), __fmul_rn(widen_hi<F16>(w0), inv));
    const u32 hi = e4m3x2_raw(__fmul_rn(widen_lo<F16>(w1), inv), __fmul_rn(widen_hi<F16>(w1), inv));
    return nan_to_7f(lo | (hi << 16));
}

// 16 e4m3 bytes of the 16 values in (a, b).
template <bool F16>
MHA_KIT_DEVICE uint4 quant16(uint4 a, uint4 b, float inv) {
    uint4 q;
    q.x = quant4<F16>(a.x, a.y, inv);
    q.y = quant4<F16>(a.z, a.w, inv);
    q.z = quant4<F16>(b.x, b.y, inv);
    q.w = quant4<F16>(b.z, b.w, inv);
    return q;
}

// Streaming 16-byte store: the written cache lines are not read again by
// this kernel (evict-first in L1/L2).
MHA_KIT_DEVICE void store16_stream(void* p, uint4 v) {
    __stcs(reinterpret_cast<uint4*>(p), v);
}

// MODE 0: copy 16-bit rows; 1: e4m3 from bf16; 2: e4m3 from f16.
// VEC: 16-byte chunks (8 elements for MODE 0, 16 for the FP8 modes, whose
// 32 input bytes are two 16-byte loads); otherwise one element per chunk.
//
// Block = (threads_per_token, tokens_per_block) threads: threadIdx.y is the
// token row of the block, threadIdx.x the lane. Token rows of the grid are
// r = blockIdx.x * tokens_per_block + threadIdx.y, R = gridDim.x *
// tokens_per_block of them; row r handles tokens r, r + R, r + 2R, ...,
// KV_UNROLL at a time: the slot and input loads of all KV_UNROLL tokens are
// issued before any store (the pointers are __restrict__), so each thread
// keeps KV_UNROLL tokens' bytes in flight. Within a token, chunk c in
// [0, 2*Hkv*chunks_per_head) is (K or V, head, chunk); lane l handles chunks
// l, l + threads_per_token, ... (one pass when the token fits the block).
//
// PAGED: the cache is a paged view (p.page_size > 0): slot s sits at page
// s / P, token s % P. That path keeps 2 tokens in flight instead of
// KV_UNROLL (the page arithmetic's registers would spill under the
// 64-register launch bounds); the slot-linear path is unchanged.
template <int MODE, bool VEC, bool PAGED>
MHA_KIT_DEVICE void kv_write(const KvWriteParams& p) {
    constexpr int U = PAGED ? 2 : KV_UNROLL;
    constexpr i32 WIDTH = VEC ? (MODE == 0 ? 8 : 16) : 1;
    constexpr bool F16 = MODE == 2;
    const i32 tpt = p.threads_per_token;
    const i32 heads = p.num_kv_heads;
    const i32 cph = p.chunks_per_head;
    const i32 cpt = 2 * heads * cph;
    const i64 n = p.num_tokens;
    const i64 rows = (i64)gridDim.x * p.tokens_per_block;
    const i64 first = (i64)blockIdx.x * p.tokens_per_block + (i64)threadIdx.y;
    const i64* __restrict__ cache_loc = p.cache_loc;
    for (i32 c = (i32)threadIdx.x; c < cpt; c += tpt) {
        const i32 hh = (i32)((u32)c / (u32)cph);  // both ≥ 0: unsigned division
        const i32 chunk = c - hh * cph;
        const bool is_v = hh >= heads;
        const i32 h = is_v ? hh - heads : hh;
        const i64 src_token = is_v ? p.v_token_stride : p.k_token_stride;
        const u16* __restrict__ src = (is_v ? p.v : p.k) +
            ((i64)h * (is_v ? p.v_head_stride : p.k_head_stride) + (i64)chunk * WIDTH);
        const i64 dst_slot = is_v ? p.v_cache_slot_stride : p.k_cache_slot_stride;
        const i64 dst_page = PAGED ? (is_v ? p.v_cache_page_stride : p.k_cache_page_stride) : 0;
        const i64 P = PAGED ? p.page_size : 1;
        const i64 dst_off =
            (i64)h * (is_v ? p.v_cache_head_stride : p.k_cache_head_stride) + (i64)chunk * WIDTH;
        void* const dst = is_v ? p.v_cache : p.k_cache;
        const float inv = is_v ? p.inv_v_scale : p.inv_k_scale;
        for (i64 t0 = first; t0 < n; t0 += U * rows) {
            i64 loc[U];
            uint4 a[U];
            uint4 b[U];
            // Loads first, all independent: slot and input rows of every
            // token of the batch (a token with a bad slot is still in [0, n),
            // so its input is readable; it is just not written).
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const i64 t = t0 + i * rows;
                loc[i] = t < n ? mha_kit::load_ro(cache_loc + t) : -1;
            }
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const i64 t = t0 + i * rows;
                a[i] = make_uint4(0u, 0u, 0u, 0u);
                b[i] = make_uint4(0u, 0u, 0u, 0u);
                if (t < n) {
                    const u16* s = src + t * src_token;
                    if (VEC) {
                        a[i] = mha_kit::load16_stream(s);
                        if (MODE != 0) b[i] = mha_kit::load16_stream(s + 8);
                    } else {
                        a[i].x = mha_kit::load_ro(s);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const i64 t = t0 + i * rows;
                if (t >= n) break;
                const i64 s = loc[i];
                if (s < 0 || s >= p.slots) {
                    // Counted once per token, by the thread owning chunk 0.
                    if (c == 0) {
                        mha_kit::report_error(p.errors, s < 0 ? KV_NEGATIVE_SLOT : KV_SLOT_OUTSIDE_POOL);
                    }
                    continue;
                }
                // Element offset, 64-bit: page s / P, token s % P of a paged
                // view; s * slot stride of a slot-linear one.
                i64 d;
                if (PAGED) {
                    const i64 page = s / P;
                    d = page * dst_page + (s - page * P) * dst_slot + dst_off;
                } else {
                    d = s * dst_slot + dst_off;
                }
                if (MODE == 0) {
                    u16* out = static_cast<u16*>(dst) + d;
                    if (VEC) {
                        store16_stream(out, a[i]);
                    } else {
                        *out = (u16)a[i].x;
                    }
                } else {
                    u8* out = static_cast<u8*>(dst) + d;
                    if (VEC) {
                        store16_stream(out, quant16<F16>(a[i], b[i], inv));
                    } else {
                        const float x = __fmul_rn(widen_lo<F16>(a[i].x), inv);
                        *out = (u8)(nan_to_7f(e4m3x2_raw(x, 0.0f)) & 0xFFu);
                    }
                }
            }
        }
    }
}

}  // namespace

// K and V rows of n tokens copied (bit for bit) to their slots; one launch.
extern "C" __global__ void __launch_bounds__(256, 4) fp8_kv_set_kv_buffer(const KvWriteParams p) {
    if (p.page_size > 0) {
        if (p.vectorized) {
            kv_write<0, true, true>(p);
        } else {
            kv_write<0, false, true>(p);
        }
    } else if (p.vectorized) {
        kv_write<0, true, false>(p);
    } else {
        kv_write<0, false, false>(p);
    }
}

// Fused FP8 write from bf16 K/V; one launch for K and V.
extern "C" __global__ void __launch_bounds__(256, 4) fp8_kv_fused_fp8_write_bf16(const KvWriteParams p) {
    if (p.page_size > 0) {
        if (p.vectorized) {
            kv_write<1, true, true>(p);
        } else {
            kv_write<1, false, true>(p);
        }
    } else if (p.vectorized) {
        kv_write<1, true, false>(p);
    } else {
        kv_write<1, false, false>(p);
    }
}

// Fused FP8 write from f16 K/V; one launch for K and V.
extern "C" __global__ void __launch_bounds__(256, 4) fp8_kv_fused_fp8_write_f16(const KvWriteParams p) {
    if (p.page_size > 0) {
        if (p.vectorized) {
            kv_write<2, true, true>(p);
        } else {
            kv_write<2, false, true>(p);
        }
    } else if (p.vectorized) {
        kv_write<2, true, false>(p);
    } else {
        kv_write<2, false, false>(p);
    }
}

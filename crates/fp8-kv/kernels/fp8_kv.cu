// mha-kit kernel family: KV-cache writes. `set_kv_buffer` (bf16/f16 rows into
// a same-dtype cache) and the fused FP8 write (quantize k·(1/k_scale),
// v·(1/v_scale) to e4m3, saturating, round-to-nearest-even, every NaN -> 0x7F).
// Semantics: shared/spec/fp8-kv.md §1-§4 and DECISIONS.md D7, D8.
// The params struct is mirrored by `KvWriteParams` in src/launch.rs; a CPU
// test pins its size and field offsets.
#include "mha_kit/common.cuh"

typedef unsigned short u16;

// Flag bits of the fp8-kv family's device error word (src/lib.rs: ErrorFlags).
#define KV_NEGATIVE_SLOT      1u   // cache_loc[t] < 0: token skipped (K and V)
#define KV_SLOT_OUTSIDE_POOL  2u   // cache_loc[t] >= slots: token skipped (K and V)

struct KvWriteParams {
    const u16* k;                 // [n, Hkv, D] bf16/f16 bits, strides (k_token, k_head, 1)
    const u16* v;                 // [n, Hkv, D]
    const i64* cache_loc;         // [n] slots
    void* k_cache;                // [S, Hkv, D]: u16 (set_kv_buffer) or u8 (e4m3)
    void* v_cache;                // [S, Hkv, D]
    u32* errors;                  // [2] device error word
    i64 k_token_stride;           // elements
    i64 k_head_stride;
    i64 v_token_stride;
    i64 v_head_stride;
    i64 k_cache_slot_stride;
    i64 k_cache_head_stride;
    i64 v_cache_slot_stride;
    i64 v_cache_head_stride;
    i64 num_tokens;               // n
    i64 slots;                    // S: valid slots are [0, S)
    float inv_k_scale;            // f32(1 / k_scale), 1.0 for set_kv_buffer
    float inv_v_scale;
    i32 num_kv_heads;             // Hkv
    i32 head_dim;                 // D
    i32 chunks_per_head;          // D / elements per chunk
    i32 threads_per_token;        // threads sharing one token's K and V rows
    i32 tokens_per_block;         // tokens handled side by side by one block
    i32 vectorized;               // 1: 16-byte chunks (8 u16 / 16 e4m3); 0: 1 element
};

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
// finite overflow and ±inf -> ±448; NaN forced to 0x7F whatever its sign.
MHA_KIT_DEVICE u32 e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    u32 out = r;
    if (lo != lo) out = (out & 0xFF00u) | 0x007Fu;
    if (hi != hi) out = (out & 0x00FFu) | 0x7F00u;
    return out;
}

// Four e4m3 bytes of the four 16-bit values in (w0, w1), each times `inv`
// (one f32 rounding, no contraction).
template <bool F16>
MHA_KIT_DEVICE u32 quant4(u32 w0, u32 w1, float inv) {
    const u32 lo = e4m3x2(__fmul_rn(widen_lo<F16>(w0), inv), __fmul_rn(widen_hi<F16>(w0), inv));
    const u32 hi = e4m3x2(__fmul_rn(widen_lo<F16>(w1), inv), __fmul_rn(widen_hi<F16>(w1), inv));
    return lo | (hi << 16);
}

// MODE 0: copy 16-bit rows; 1: e4m3 from bf16; 2: e4m3 from f16.
// VEC: 16-byte chunks (8 elements for MODE 0, 16 for the FP8 modes, whose
// 32 input bytes are two 16-byte loads); otherwise one element per chunk.
//
// Block = tokens_per_block groups of threads_per_token threads; group g of
// block b handles tokens b*tokens_per_block + g, stepping by the grid. Within
// a token, chunk c in [0, 2*Hkv*chunks_per_head) is (K or V, head, chunk);
// lane l handles chunks l, l + threads_per_token, ...
template <int MODE, bool VEC>
MHA_KIT_DEVICE void kv_write(const KvWriteParams& p) {
    constexpr i32 WIDTH = VEC ? (MODE == 0 ? 8 : 16) : 1;
    const i32 tpt = p.threads_per_token;
    const i32 group = (i32)threadIdx.x / tpt;
    const i32 lane = (i32)threadIdx.x - group * tpt;
    if (group >= p.tokens_per_block) return;
    const i32 heads = p.num_kv_heads;
    const i32 cph = p.chunks_per_head;
    const i32 cpt = 2 * heads * cph;
    const i64 t_first = (i64)blockIdx.x * p.tokens_per_block + group;
    const i64 t_step = (i64)gridDim.x * p.tokens_per_block;
    for (i32 c = lane; c < cpt; c += tpt) {
        const i32 hh = c / cph;
        const i32 chunk = c - hh * cph;
        const bool is_v = hh >= heads;
        const i32 h = is_v ? hh - heads : hh;
        const u16* src = is_v ? p.v : p.k;
        const i64 src_token = is_v ? p.v_token_stride : p.k_token_stride;
        const i64 src_off = (i64)h * (is_v ? p.v_head_stride : p.k_head_stride) + (i64)chunk * WIDTH;
        void* dst = is_v ? p.v_cache : p.k_cache;
        const i64 dst_slot = is_v ? p.v_cache_slot_stride : p.k_cache_slot_stride;
        const i64 dst_off =
            (i64)h * (is_v ? p.v_cache_head_stride : p.k_cache_head_stride) + (i64)chunk * WIDTH;
        const float inv = is_v ? p.inv_v_scale : p.inv_k_scale;
        for (i64 t = t_first; t < p.num_tokens; t += t_step) {
            const i64 loc = mha_kit::load_ro(p.cache_loc + t);
            if (loc < 0 || loc >= p.slots) {
                // Counted once per token, by the thread owning chunk 0.
                if (c == 0) {
                    mha_kit::report_error(p.errors, loc < 0 ? KV_NEGATIVE_SLOT : KV_SLOT_OUTSIDE_POOL);
                }
                continue;
            }
            const u16* s = src + t * src_token + src_off;
            const i64 d = loc * dst_slot + dst_off;  // element offset, 64-bit
            if (MODE == 0) {
                u16* out = static_cast<u16*>(dst) + d;
                if (VEC) {
                    mha_kit::store16(out, mha_kit::load16_stream(s));
                } else {
                    *out = mha_kit::load_ro(s);
                }
            } else {
                u8* out = static_cast<u8*>(dst) + d;
                if (VEC) {
                    const uint4 a = mha_kit::load16_stream(s);
                    const uint4 b = mha_kit::load16_stream(s + 8);
                    uint4 q;
                    q.x = quant4<MODE == 2>(a.x, a.y, inv);
                    q.y = quant4<MODE == 2>(a.z, a.w, inv);
                    q.z = quant4<MODE == 2>(b.x, b.y, inv);
                    q.w = quant4<MODE == 2>(b.z, b.w, inv);
                    mha_kit::store16(out, q);
                } else {
                    const u32 x = mha_kit::load_ro(s);
                    *out = (u8)(e4m3x2(__fmul_rn(widen_lo<MODE == 2>(x), inv), 0.0f) & 0xFFu);
                }
            }
        }
    }
}

}  // namespace

// K and V rows of n tokens copied (bit for bit) to their slots; one launch.
extern "C" __global__ void __launch_bounds__(256) fp8_kv_set_kv_buffer(const KvWriteParams p) {
    if (p.vectorized) {
        kv_write<0, true>(p);
    } else {
        kv_write<0, false>(p);
    }
}

// Fused FP8 write from bf16 K/V; one launch for K and V.
extern "C" __global__ void __launch_bounds__(256) fp8_kv_fused_fp8_write_bf16(const KvWriteParams p) {
    if (p.vectorized) {
        kv_write<1, true>(p);
    } else {
        kv_write<1, false>(p);
    }
}

// Fused FP8 write from f16 K/V; one launch for K and V.
extern "C" __global__ void __launch_bounds__(256) fp8_kv_fused_fp8_write_f16(const KvWriteParams p) {
    if (p.vectorized) {
        kv_write<2, true>(p);
    } else {
        kv_write<2, false>(p);
    }
}

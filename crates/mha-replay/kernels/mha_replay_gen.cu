// mha-replay activation generator: Q/K/V rows of one layer of one pass,
// bit-identical to mha_replay::gen::Generator::element rounded to bf16
// (crates/mha-replay/src/gen.rs is the definition; this file mirrors it).
//
// Thread t of the grid-stride loop owns 8 consecutive elements (one 16-byte
// store) of one (row, head) of Q, K or V:
//   chunk = t % (D/8); head slot s = (t / (D/8)) % (Hq + 2·Hkv); row = t / (...)
//   s < Hq → Q head s; s < Hq + Hkv → K head s − Hq; else V head s − Hq − Hkv.
// Element value (gen.rs):
//   base = hash(seed; act, model, layer, req, pos, salt (Q only, else 0), head)
//   (head = the global head: local head + q_head_offset / kv_head_offset)
//   h    = mix64(base ^ d); sum = Σ_{i<4} (h >> 16i) & 0xFFFF
//   n    = (sum / 65536 − 2) · 1.7320508          (f32, round to nearest)
//   K outlier channel (hash(seed; 0x0C, model, layer, head, d) % 16 == 0):
//        ±8 + 2n, sign + when bit 8 of that hash is set
// then rounded to bf16 (round to nearest even). Intrinsics with explicit
// rounding keep the compiler from contracting into FMAs.
#include "mha_kit/common.cuh"
// GenParams: generated from mha_replay::launch::GenParams by `cargo xtask abi`.
#include "mha_replay_abi.cuh"

using namespace mha_kit;


MHA_KIT_DEVICE u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

MHA_KIT_DEVICE u16 bf16_bits_rne(float x) {
    u32 b = __float_as_uint(x);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((b >> 16) | 0x0040u);
    b += 0x7FFFu + ((b >> 16) & 1u);
    return (u16)(b >> 16);
}

// One 16-byte chunk (8 elements) of row `row`, head slot `s`, chunk `c`.
MHA_KIT_DEVICE void gen_chunk(const GenParams& p, u64 seed_h, u64 row, u64 s, u64 c) {
    // `head` indexes the output; `ghead` (head + the rank's first head) keys the hash.
    u64 act, head, ghead, salt = 0;
    u16* out;
    u64 heads;
    if (s < (u64)p.num_q_heads) {
        act = 1; head = s; salt = p.salt; heads = (u64)p.num_q_heads;
        ghead = head + (u64)p.q_head_offset;
        out = reinterpret_cast<u16*>(p.q);
    } else if (s < (u64)(p.num_q_heads + p.num_kv_heads)) {
        act = 2; head = s - p.num_q_heads; heads = (u64)p.num_kv_heads;
        ghead = head + (u64)p.kv_head_offset;
        out = reinterpret_cast<u16*>(p.k);
    } else {
        act = 3; head = s - p.num_q_heads - p.num_kv_heads; heads = (u64)p.num_kv_heads;
        ghead = head + (u64)p.kv_head_offset;
        out = reinterpret_cast<u16*>(p.v);
    }
    const u64 req = reinterpret_cast<const u64*>(p.row_req)[row];
    const u64 pos = reinterpret_cast<const u64*>(p.row_pos)[row];
    u64 base = seed_h;
    base = mix64(base ^ act);
    base = mix64(base ^ p.model);
    base = mix64(base ^ p.layer);
    base = mix64(base ^ req);
    base = mix64(base ^ pos);
    base = mix64(base ^ salt);
    base = mix64(base ^ ghead);
    u64 ch_base = 0;
    if (act == 2) {
        ch_base = mix64(seed_h ^ 0x0Cull);
        ch_base = mix64(ch_base ^ p.model);
        ch_base = mix64(ch_base ^ p.layer);
        ch_base = mix64(ch_base ^ ghead);
    }
    u32 packed[4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u64 d = c * 8 + (u64)i;
        const u64 h = mix64(base ^ d);
        const u32 sum = (u32)(h & 0xFFFFull) + (u32)((h >> 16) & 0xFFFFull) +
                        (u32)((h >> 32) & 0xFFFFull) + (u32)((h >> 48) & 0xFFFFull);
        // sum < 2^18 converts exactly; scaling by 2^-16 is exact, so this
        // multiply equals gen.rs's division by 65536 bit for bit.
        const float u = __fsub_rn(__fmul_rn((float)sum, 1.0f / 65536.0f), 2.0f);
        float x = __fmul_rn(u, 1.7320508f);
        if (act == 2) {
            const u64 ch = mix64(ch_base ^ d);
            if (ch % 16 == 0) {
                const float sign = (ch & 0x100ull) ? 1.0f : -1.0f;
                x = __fadd_rn(__fmul_rn(sign, 8.0f), __fmul_rn(2.0f, x));
            }
        }
        const u32 bits = bf16_bits_rne(x);
        if (i & 1) {
            packed[i / 2] |= bits << 16;
        } else {
            packed[i / 2] = bits;
        }
    }
    u16* dst = out + (row * heads + head) * (u64)p.head_dim + c * 8;
    store16(dst, make_uint4(packed[0], packed[1], packed[2], packed[3]));
}

extern "C" __global__ void mha_replay_gen_qkv(const GenParams p) {
    const u64 chunks = (u64)(p.head_dim / 8);
    const u64 slots = (u64)(p.num_q_heads + 2 * p.num_kv_heads);
    const u64 total = (u64)p.rows * slots * chunks;
    const u64 seed_h = mix64(p.seed);
    if (total + global_thread_count() < 0xFFFFFFFFull) {
        // 32-bit index math (64-bit division is a long software sequence).
        const u32 ch32 = (u32)chunks, sl32 = (u32)slots;
        const u32 stride = (u32)global_thread_count();
        for (u32 t = (u32)global_thread_id(); t < (u32)total; t += stride) {
            const u32 rs = t / ch32;
            gen_chunk(p, seed_h, rs / sl32, rs % sl32, t - rs * ch32);
        }
        return;
    }
    const u64 stride = global_thread_count();
    for (u64 t = global_thread_id(); t < total; t += stride) {
        const u64 rs = t / chunks;
        gen_chunk(p, seed_h, rs / slots, rs % slots, t - rs * chunks);
    }
}

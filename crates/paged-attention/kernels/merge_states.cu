// mha-kit kernel family: paged-attention, the merge of partial attention
// states. Each of `parts` partial states of the same rows holds an output
// O_i [rows, H, D] (16-bit, already scaled by bmm2) and a natural-log
// log-sum-exp LSE_i [rows, H] (f32; -inf: the part saw no key, its O is
// never read). Per (row, head), with M = max_i LSE_i:
//
//   w_i = exp(LSE_i - M)   (0 for LSE_i = -inf)
//   O   = sum_i w_i O_i / sum_i w_i,   LSE = M + ln sum_i w_i
//
// then, with sinks, the sink s_h joins once (the rule of src/merge.rs):
// LSE' = ln(exp(LSE) + exp(s_h)), O' = O exp(LSE - LSE'). Every part -inf:
// O = 0, LSE = -inf (sinks or not); a NaN LSE_i makes the row NaN. The f64
// definition is src/merge.rs; params (`MergeStatesParams`) are defined in
// src/merge_kernel.rs and generated into paged_attention_abi.cuh.
//
// One warp per (row, head), four per CTA; lane l handles the column pairs
// 2 l + 64 c. Entries: paged_attention_merge_states_{bf16,f16}.
#include "mha_kit/common.cuh"
#include "pa_common.cuh"
#include "paged_attention_abi.cuh"

namespace pam {

using namespace pac;

// exp(x) for x <= 0 (natural log units), 0 for x = -inf.
MHA_KIT_DEVICE float exp_le0(float x) { return ex2(x * LOG2E); }

template <int QT>
MHA_KIT_DEVICE void merge_body(const MergeStatesParams& p) {
    const int lane = threadIdx.x & 31;
    const i64 pair = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (pair >= (i64)p.rows * p.num_heads) return;
    const int row = (int)(pair / p.num_heads);
    const int h = (int)(pair - (i64)row * p.num_heads);
    const float* lse_rh = p.lse_parts + (i64)row * p.lse_stride_tok + h;
    // Max over the parts and NaN test, lanes striding over the parts.
    float m = PAC_NEG_INF;
    bool nan = false;
    for (int i = lane; i < p.parts; i += 32) {
        const float l = lse_rh[(i64)i * p.lse_part_stride];
        nan = nan || l != l;
        m = fmaxf(m, l);
    }
    nan = __any_sync(0xffffffffu, nan);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    u16* out = p.out + (i64)row * p.out_stride_tok + (i64)h * p.out_stride_head;
    float lse;
    if (nan || m == PAC_NEG_INF) {
        // NaN row, or no part saw a key: NaN / zeros.
        const u32 v = nan ? pack2<QT>(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000)) : 0u;
        for (int c = 2 * lane; c < p.head_dim; c += 64) *reinterpret_cast<u32*>(out + c) = v;
        lse = nan ? __int_as_float(0x7fc00000) : PAC_NEG_INF;
    } else {
        float total = 0.f;
        for (int i = 0; i < p.parts; ++i) {
            const float l = lse_rh[(i64)i * p.lse_part_stride];
            if (l != PAC_NEG_INF) total += exp_le0(l - m);
        }
        float s_w = 1.f / total;  // O = sum w_i O_i / total
        lse = m + logf(total);
        if (p.sinks != 0) {
            const float s = p.sinks[h];
            const float mx = fmaxf(lse, s);
            const float joined = mx + logf(exp_le0(lse - mx) + exp_le0(s - mx));
            s_w *= exp_le0(lse - joined);
            lse = joined;
        }
        const u16* o_rh = p.o_parts + (i64)row * p.o_stride_tok + (i64)h * p.o_stride_head;
        for (int c = 2 * lane; c < p.head_dim; c += 64) {
            float a0 = 0.f, a1 = 0.f;
            for (int i = 0; i < p.parts; ++i) {
                const float l = lse_rh[(i64)i * p.lse_part_stride];
                if (l == PAC_NEG_INF) continue;  // an empty part's O is never read
                const float w = exp_le0(l - m);
                const u32 v = *reinterpret_cast<const u32*>(o_rh + (i64)i * p.o_part_stride + c);
                float x0, x1;
                if constexpr (QT == 0) {
                    x0 = __uint_as_float(v << 16);
                    x1 = __uint_as_float(v & 0xffff0000u);
                } else {
                    x0 = f16_to_f32((u16)(v & 0xffffu));
                    x1 = f16_to_f32((u16)(v >> 16));
                }
                a0 = fmaf(w, x0, a0);
                a1 = fmaf(w, x1, a1);
            }
            *reinterpret_cast<u32*>(out + c) = pack2<QT>(a0 * s_w, a1 * s_w);
        }
    }
    if (p.lse_out != 0 && lane == 0) p.lse_out[(i64)row * p.lse_out_stride_tok + h] = lse;
}

}  // namespace pam

#define PAM_ENTRY(QN, QT)                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                             \
        paged_attention_merge_states_##QN(const MergeStatesParams p) {                            \
        pam::merge_body<QT>(p);                                                                   \
    }
PAM_ENTRY(bf16, 0)
PAM_ENTRY(f16, 1)

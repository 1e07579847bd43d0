// mha-kit shared device helpers: fixed-width types, the device error word,
// index helpers and 16-byte vector loads. Header-only; every kernel includes it.
#pragma once

typedef signed char        i8;
typedef unsigned char      u8;
typedef unsigned short     u16;
typedef int                i32;
typedef unsigned int       u32;
typedef long long          i64;
typedef unsigned long long u64;

#define MHA_KIT_DEVICE __device__ __forceinline__

namespace mha_kit {

// ---- device error word: [count, flags] (kernel-rt/src/errword.rs) ----------
// Records one skipped or clamped event of kind `flag` (a family-defined bit).
MHA_KIT_DEVICE void report_error(u32* word, u32 flag) {
    if (word != nullptr) {
        atomicAdd(&word[0], 1u);
        atomicOr(&word[1], flag);
    }
}

// ---- index helpers ------------------------------------------------------------
// ceil(a / b) for a >= 0, b > 0.
MHA_KIT_DEVICE i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }
MHA_KIT_DEVICE u32 ceil_div(u32 a, u32 b) { return (a + b - 1) / b; }

// Grid-stride loop bounds in 64-bit: element counts can exceed 2^31.
MHA_KIT_DEVICE u64 global_thread_id() {
    return (u64)blockIdx.x * (u64)blockDim.x + (u64)threadIdx.x;
}
MHA_KIT_DEVICE u64 global_thread_count() {
    return (u64)gridDim.x * (u64)blockDim.x;
}

// ---- 16-byte vector access ------------------------------------------------------
// Caller guarantees 16-byte alignment.
MHA_KIT_DEVICE uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
MHA_KIT_DEVICE void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
// Streaming load (read once, do not keep in L1).
MHA_KIT_DEVICE uint4 load16_stream(const void* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));
}
// Read-only load through the non-coherent path.
template <typename T>
MHA_KIT_DEVICE T load_ro(const T* p) { return __ldg(p); }

// ---- block-wide exclusive scan ---------------------------------------------------
// One value a thread, blockDim.x == NTHREADS (a multiple of 32, at most
// 1024). Returns the sum of the values of the threads below this one;
// `*total` gets the sum over the block. Contains __syncthreads: every thread
// must call it. Safe to call repeatedly (the leading barrier keeps a call's
// writes of warp_sums behind every read of the previous call).
template <typename T, int NTHREADS>
MHA_KIT_DEVICE T block_exclusive_scan(T v, T* total) {
    constexpr int WARPS = NTHREADS / 32;
    static_assert(NTHREADS % 32 == 0 && WARPS <= 32, "block_exclusive_scan: 32..1024 threads, whole warps");
    __shared__ T warp_sums[WARPS];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    T incl = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const T up = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += up;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T w = lane < WARPS ? warp_sums[lane] : T(0);
#pragma unroll
        for (int d = 1; d < WARPS; d <<= 1) {
            const T up = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += up;
        }
        if (lane < WARPS) warp_sums[lane] = w;
    }
    __syncthreads();
    *total = warp_sums[WARPS - 1];
    return incl - v + (warp > 0 ? warp_sums[warp - 1] : T(0));
}

}  // namespace mha_kit

// Probe (not part of any crate's build; stage `fenceprobe` of
// scripts/gpu-context.sh builds and runs it): does `fence.proxy.async.shared::cta`
// wait for the executing thread's in-flight `cp.async` copies?
//
// Why it matters (docs/PERF.md, sessions 35-36): the e4m3 producer of the
// sm_90a context kernel converts staging step s, then fences its converted
// stores against the async proxy (wgmma reads them) while the copies of step
// s + 1 are still in flight. If the fence drains those copies, every step
// waits for the next step's copies and the staging ring overlaps nothing.
//
// Each thread of one warp per CTA issues N 16-byte `cp.async` copies from a
// global buffer that a 256 MiB memset has just pushed out of L2 (so the
// copies go to DRAM), then times, with `clock64`:
//   mode 0: the fence with the copies in flight;
//   mode 1: `cp.async.wait_all`, then the fence (the fence alone, copies done);
//   mode 2: `cp.async.wait_all` alone (the copies' remaining latency);
//   mode 3: the fence with no copies issued at all.
// If mode 0 ~ mode 2 and mode 1 ~ mode 3, the fence drains the copies.
//
// Build and run on the device (nvcc 13 is there):
//   nvcc -O2 -arch=sm_90a -o /tmp/fence_probe scripts/probes/fence_probe.cu
//   /tmp/fence_probe
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

__global__ void probe(const uint8_t* __restrict__ src, int n, int mode, long long* out) {
    __shared__ __align__(16) uint8_t dst[32 * 16 * 16];
    const int lane = threadIdx.x;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(dst);
    // Lane-strided 16-byte chunks, one 4 KiB page apart per copy: no two
    // copies share a DRAM page row or an L2 line.
    const uint8_t* p = src + (size_t)blockIdx.x * (size_t)(n * 32 * 4096) + (size_t)lane * 16;
    if (mode != 3) {
        for (int i = 0; i < n; ++i) {
            const uint32_t d = base + (uint32_t)((i % 16) * 32 * 16 + lane * 16);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(p + (size_t)i * 32 * 4096)
                         : "memory");
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    // A generic store of the kind the producer fences (its converted chunk).
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + 4u * (uint32_t)lane), "r"(lane) : "memory");
    long long t0 = clock64();
    if (mode == 0 || mode == 3) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    } else if (mode == 1) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        t0 = clock64();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    } else {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
    }
    long long t1 = clock64();
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    if (lane == 0) out[blockIdx.x] = t1 - t0;
}

int main() {
    const int ctas = 132, reps = 9;
    const int ns[] = {1, 4, 16};
    const size_t bytes = (size_t)ctas * 16 * 32 * 4096;  // the largest n's footprint
    const size_t flush_bytes = (size_t)256 << 20;         // several times any Hopper L2
    uint8_t* src = nullptr;
    uint8_t* flush = nullptr;
    long long* out = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&flush, flush_bytes) != cudaSuccess ||
        cudaMalloc(&out, ctas * sizeof(long long)) != cudaSuccess) {
        std::printf("cudaMalloc failed\n");
        return 1;
    }
    cudaMemset(src, 0x3c, bytes);
    std::printf("| copies a lane | mode | median cycles (CTA medians over %d launches) |\n|---:|---|---:|\n", reps);
    const char* names[] = {"fence, copies in flight", "wait_all, then fence (fence timed)", "wait_all alone",
                           "fence, no copies"};
    for (int n : ns) {
        for (int mode = 0; mode < 4; ++mode) {
            std::vector<long long> med;
            for (int r = 0; r < reps; ++r) {
                // L2 emptied of src before each launch (the median of the nine
                // absorbs launch 0's warm-up).
                cudaMemset(flush, r, flush_bytes);
                probe<<<ctas, 32>>>(src, n, mode, out);
                std::vector<long long> h(ctas);
                cudaMemcpy(h.data(), out, ctas * sizeof(long long), cudaMemcpyDeviceToHost);
                std::sort(h.begin(), h.end());
                med.push_back(h[ctas / 2]);
            }
            std::sort(med.begin(), med.end());
            std::printf("| %d | %s | %lld |\n", n, names[mode], med[reps / 2]);
        }
    }
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("status: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}

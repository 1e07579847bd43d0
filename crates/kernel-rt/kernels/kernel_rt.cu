// kernel-rt's own device code: timing support.
#include "mha_kit/common.cuh"

MHA_KIT_DEVICE u64 global_timer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Keeps the stream busy for about `ns` nanoseconds (one thread spins on the
// global timer), so that the host can queue the timed work behind it and the
// timed launches run back to back, without host launch gaps between them.
extern "C" __global__ void kernel_rt_spin(u64 ns) {
    const u64 start = global_timer_ns();
    while (global_timer_ns() - start < ns) {
        __nanosleep(1000);
    }
}

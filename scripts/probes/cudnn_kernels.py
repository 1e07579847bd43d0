#!/usr/bin/env python3
"""Which kernel cuDNN's SDPA launches for a context (prefill) shape, and how:
its name (the tile shape is in it), grid, block, registers, shared memory and
duration, read from torch.profiler's trace. A probe for choosing what to
change in our context kernel (docs/PERF.md), not a measurement of speed (the
peers' timing is benches/context_peers.py).

Usage: python3 cudnn_kernels.py [CASE ...] with CASE = bs,L,D (Hq 32, Hkv 8,
causal, no prefix), default 32,512,128 16,1024,128 8,4096,128 32,512,64.
Prints one line and exits 0 without torch or a GPU.
"""
import json
import os
import sys
import tempfile


def main():
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as ex:
        print(f"cudnn_kernels: torch unavailable ({ex})")
        return 0
    if not torch.cuda.is_available():
        print("cudnn_kernels: no GPU")
        return 0
    cases = sys.argv[1:] or ["32,512,128", "16,1024,128", "8,4096,128", "32,512,64"]
    print(f"## cuDNN SDPA kernels on {torch.cuda.get_device_name()} (cuDNN {torch.backends.cudnn.version()})\n")
    print("| case | kernel | grid | block | regs | smem (B) | µs |\n|---|---|---|---|---:|---:|---:|")
    for case in cases:
        bs, L, d = (int(x) for x in case.split(","))
        q = (torch.rand(bs, 32, L, d, device="cuda") * 2 - 1).to(torch.bfloat16)
        k = (torch.rand(bs, 8, L, d, device="cuda") * 2 - 1).to(torch.bfloat16)
        v = (torch.rand(bs, 8, L, d, device="cuda") * 2 - 1).to(torch.bfloat16)

        def call():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, scale=d ** -0.5, is_causal=True, enable_gqa=True)

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
        seen = {}
        for e in events:
            if e.get("cat") != "kernel":
                continue
            a = e.get("args", {})
            key = e.get("name", "?")
            s = seen.setdefault(key, [a, []])
            s[1].append(float(e.get("dur", 0.0)))
        for name, (a, durs) in seen.items():
            durs.sort()
            print(f"| bs {bs} × {L} D {d} | `{name[:160]}` | {a.get('grid')} | {a.get('block')} | "
                  f"{a.get('registers per thread')} | {a.get('shared memory')} | {durs[len(durs) // 2]:.1f} |")
        del q, k, v
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

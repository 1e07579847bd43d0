#!/usr/bin/env python3
"""Peer numbers for the context (prefill) bench: torch's cuDNN SDPA on dense KV
of the same shapes as benches/context.rs, printed as a markdown table.

Method (the same as the Rust bench's graph timing): inputs random bf16 in
[-1, 1) (`--data`, below); each call captured `n` times in one CUDA graph
(n sized to ~20 ms of work), time per call = replay time / n, median of 30
replays (`--replays`) after 3 warm-up replays. FLOPs count the causal
(row, key) pairs only: a request with prefix p and n new tokens has
n*p + n(n+1)/2 pairs, each 4*Hq*D FLOPs.

Usage: python3 context_peers.py [--cases all|headline|SUBSTRING]
[--data torch|full|zero-kv] [--replays N].
`--data` (default: $MHA_KIT_PEER_DATA, else `full`): `full` makes each input
as an f32 uniform in [-1, 1) rounded to bf16 (every mantissa bit random),
the distribution of the Rust bench's default, so both sides of a ratio run
on the same kind of data; `torch` as `torch.rand(..., dtype=bfloat16) * 2 - 1`
(this script's inputs before session 34: values on a 1/256 grid, a value of
magnitude 2^-e keeps ~8 - e random mantissa bits). In graph replay these
kernels run at the board's power cap, where the multipliers' power depends
on the bits: on an H100 cuDNN read ~2% faster on `torch` inputs (PERF.md
session 34). `zero-kv`: Q as `full`, K and V zeros (the Rust bench's
MHA_KIT_BENCH_ZERO_KV=1). `--replays N`: the median over N replays instead of
30 (a soak, long enough for the clock to settle at the power cap). Needs
torch with CUDA; prints one line and exits 0 without a GPU.
"""
import os
import argparse
import statistics
import sys

CASES = [
    # name, Hq, Hkv, D, bs, new tokens, prefix
    ("bs 8 × 4096", 32, 8, 128, 8, 4096, 0),
    ("bs 1 × 16384", 32, 8, 128, 1, 16384, 0),
    ("chunked: bs 8 × 512 new over 16k prefix", 32, 8, 128, 8, 512, 16384),
    ("TP-8: bs 1 × 1024 new over 128k prefix (8/1/128)", 8, 1, 128, 1, 1024, 131072),
] + [
    (f"FA3 grid D {d}: bs {bs} × {l}", 32, 8, d, bs, l, 0)
    for d in (64, 128, 256)
    for bs, l in ((32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384))
]


def flops(hq, d, bs, n, prefix):
    return 4.0 * hq * d * bs * (n * prefix + n * (n + 1) / 2)


def time_call(torch, fn, replays=30):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    est_ms = max(s.elapsed_time(e), 1e-3)
    n = max(1, min(50, int(20.0 / est_ms)))
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(replays):
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / n)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="all")
    ap.add_argument("--data", default=os.environ.get("MHA_KIT_PEER_DATA", "full"),
                    choices=["torch", "full", "zero-kv"])
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
    except Exception as ex:  # no torch here: nothing to measure
        print(f"context peers: torch unavailable ({ex}); nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("context peers: no GPU; nothing measured")
        return 0
    if args.cases == "all":
        cases = CASES
    elif args.cases == "headline":
        cases = CASES[:2]
    else:  # a substring of the case names
        cases = [c for c in CASES if args.cases in c[0]]
    rows = []
    for name, hq, hkv, d, bs, n, prefix in cases:
        L = prefix + n
        def rand(*shape):
            if args.data in ("full", "zero-kv"):
                return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
            return torch.rand(*shape, device="cuda", dtype=torch.bfloat16) * 2 - 1

        q = rand(bs, hq, n, d)
        if args.data == "zero-kv":
            k = torch.zeros(bs, hkv, L, d, device="cuda", dtype=torch.bfloat16)
            v = torch.zeros(bs, hkv, L, d, device="cuda", dtype=torch.bfloat16)
        else:
            k = rand(bs, hkv, L, d)
            v = rand(bs, hkv, L, d)
        sm = d ** -0.5
        if prefix == 0:
            call = lambda: F.scaled_dot_product_attention(q, k, v, scale=sm, is_causal=True, enable_gqa=True)
        else:
            mask = causal_lower_right(n, L)
            call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm, enable_gqa=True)
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                us = time_call(torch, call, max(1, args.replays))
            tf = flops(hq, d, bs, n, prefix) / (us * 1e-6) / 1e12
            rows.append(f"| {name} | {hq}/{hkv}/{d} | cuDNN SDPA (dense) | {us:.1f} | {tf:.0f} |")
        except Exception as ex:
            rows.append(f"| {name} | {hq}/{hkv}/{d} | cuDNN SDPA (dense) | n/a: {type(ex).__name__} | |")
        del q, k, v
        torch.cuda.empty_cache()
    print(f"\n## context peers on {torch.cuda.get_device_name()} (torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}; data: {args.data})\n")
    print("| case | Hq/Hkv/D | peer | µs | TFLOP/s (causal pairs) |\n|---|---|---|---:|---:|")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

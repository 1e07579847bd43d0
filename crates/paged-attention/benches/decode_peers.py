#!/usr/bin/env python3
"""Peer numbers for the decode/verify bench: torch's cuDNN SDPA on dense KV of
the same shapes as the main table of benches/paged_attention.rs (same case
names, so the two markdown tables join on the first column).

Method (the same as the Rust bench's graph column): q [bs, Hq, q_len, D] and
k/v [bs, Hkv, L, D] bf16 in [-1, 1); R KV sets in one pool per K and V,
R = ceil(192 MiB / bytes one call reads) capped at 48, so >= 192 MiB pass
between two reads of one set (cold L2); n calls captured in one CUDA graph,
call i reading set i % R, n = R * ceil(max(1, 300 us / est) / R) capped at
256 (est: one eager pass over the R sets, per call); time per call = replay
time / n, median of 50-400 replays (~0.5 s of replays per case) after 3
untimed replays. Bytes per call: K and V of the keys a call sees, plus Q in
and O out (bf16). q_len > 1 (verify) uses a lower-right causal mask. FP8 KV
and attention sinks have no SDPA equivalent: those rows say n/a. A row
whose call cuDNN rejects says n/a with the exception's type.

Usage: python3 decode_peers.py [--cases all|headline]. Needs torch with CUDA;
prints one line and exits 0 without torch or a GPU. Per-case details (R, n,
replays, min / p90) go to stderr.
"""
import argparse
import math
import statistics
import sys

MIB = 1 << 20
ROTATION_BYTES = 192 * MIB
MAX_ROTATIONS = 48
GRAPH_TARGET_US = 300.0
MAX_GRAPH_CALLS = 256
MIN_REPLAYS, MAX_REPLAYS = 50, 400
CASE_TARGET_US = 0.5e6


def case(name, hq, hkv, d, bs, length, fp8=False, q_len=1, window=None, sinks=False):
    return dict(name=name, hq=hq, hkv=hkv, d=d, bs=bs, len=length, fp8=fp8, q_len=q_len,
                window=window, sinks=sinks)


# The main table of benches/paged_attention.rs (`cases()`), same names; its
# CUDA-core comparison row has no peer of its own (same shape as "bs 64, L 8192").
CASES = [
    case("bs 64, L 8192", 32, 8, 128, 64, 8192),
    case("bs 256, L 8192", 32, 8, 128, 256, 8192),
    case("bs 1, L 1024", 32, 8, 128, 1, 1024),
    case("bs 16, L 1024", 32, 8, 128, 16, 1024),
    case("bs 1, L 32768", 32, 8, 128, 1, 32768),
    case("FP8 KV, bs 64, L 8192", 32, 8, 128, 64, 8192, fp8=True),
    case("verify q_len 4, bs 64, L 8192", 32, 8, 128, 64, 8192, q_len=4),
    case("64/8/64 W 127 + sinks, bs 64, L 8192", 64, 8, 64, 64, 8192, window=127, sinks=True),
    case("16/8/256, bs 64, L 8192", 16, 8, 256, 64, 8192),
    case("32/2/256, bs 64, L 8192", 32, 2, 256, 64, 8192),
]


def bytes_per_call(c):
    el = 1 if c["fp8"] else 2
    kv_tok = c["len"] if c["window"] is None else min(c["len"], c["window"] + c["q_len"])
    rows = c["bs"] * c["q_len"]
    return 2 * c["bs"] * kv_tok * c["hkv"] * c["d"] * el + 2 * 2 * rows * c["hq"] * c["d"]


def rotations(nbytes):
    return max(1, min(MAX_ROTATIONS, math.ceil(ROTATION_BYTES / max(nbytes, 1))))


def graph_calls(r, est_us):
    want = max(1.0, GRAPH_TARGET_US / max(est_us, 1e-3))
    per_set = min(max(1, math.ceil(want / r)), max(1, MAX_GRAPH_CALLS // r))
    return r * per_set


def graph_time(torch, calls_by_set):
    """Per-call µs of graph replays cycling over `calls_by_set` (one per KV set)."""
    r = len(calls_by_set)
    for f in calls_by_set:  # warm-up: kernel load, cuDNN plan
        f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for f in calls_by_set:
        f()
    e.record()
    torch.cuda.synchronize()
    est_us = max(s.elapsed_time(e) * 1e3 / r, 1e-3)
    n = graph_calls(r, est_us)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in calls_by_set:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            calls_by_set[i % r]()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    s.record()
    g.replay()
    e.record()
    torch.cuda.synchronize()
    replay_us = max(s.elapsed_time(e) * 1e3, 1e-3)
    replays = int(min(MAX_REPLAYS, max(MIN_REPLAYS, CASE_TARGET_US / replay_us)))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(replays)]
    for a, b in pairs:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) * 1e3 / n for a, b in pairs)
    del g
    return {"median_us": statistics.median(ts), "min_us": ts[0],
            "p90_us": ts[int(0.9 * (len(ts) - 1))], "R": r, "n": n, "replays": replays}


def sdpa_sets(torch, F, c):
    """One zero-argument SDPA call per KV set, and the tensors they hold."""
    bs, hq, hkv, d, length, q_len = c["bs"], c["hq"], c["hkv"], c["d"], c["len"], c["q_len"]
    r = rotations(bytes_per_call(c))
    q = torch.empty(bs, hq, q_len, d, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    # One pool per K and V holding the R sets (disjoint, contiguous views).
    k = torch.empty(r, bs, hkv, length, d, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    v = torch.empty_like(k).uniform_(-1, 1)
    sm = d ** -0.5
    mask = None
    if q_len > 1:
        # Query row j (position L - q_len + j) sees keys 0..=L - q_len + j: a
        # materialized bool mask, so a back-end other than cuDNN never runs it.
        mask = torch.ones(q_len, length, device="cuda", dtype=torch.bool).tril(length - q_len)

    def one(i):
        if mask is None:
            return lambda: F.scaled_dot_product_attention(q, k[i], v[i], scale=sm, enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q, k[i], v[i], attn_mask=mask, scale=sm,
                                                      enable_gqa=True)

    return [one(i) for i in range(r)], (q, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="all", choices=["all", "headline"])
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as ex:  # no torch here: nothing to measure
        print(f"decode peers: torch unavailable ({ex}); nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("decode peers: no GPU; nothing measured")
        return 0
    cases = CASES if args.cases == "all" else CASES[:2]
    peer = "cuDNN SDPA (dense)"
    rows = []
    for c in cases:
        heads = f"{c['hq']}/{c['hkv']}/{c['d']}"
        why = "FP8 KV" if c["fp8"] else "attention sinks" if c["sinks"] else None
        if why:
            rows.append(f"| {c['name']} | {heads} | {peer} | n/a: no {why} in SDPA | |")
            continue
        calls = held = None
        try:
            calls, held = sdpa_sets(torch, F, c)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                t = graph_time(torch, calls)
            tbps = bytes_per_call(c) / (t["median_us"] * 1e-6) / 1e12
            rows.append(f"| {c['name']} | {heads} | {peer} | {t['median_us']:.1f} | {tbps:.2f} |")
            print(f"{c['name']}: R {t['R']}, n {t['n']}, {t['replays']} replays, "
                  f"min {t['min_us']:.1f} / p90 {t['p90_us']:.1f} µs", file=sys.stderr)
        except Exception as ex:
            rows.append(f"| {c['name']} | {heads} | {peer} | n/a: {type(ex).__name__} | |")
            print(f"{c['name']}: {type(ex).__name__}: {ex}", file=sys.stderr)
        del calls, held
        torch.cuda.empty_cache()
    print(f"\n## decode peers on {torch.cuda.get_device_name()} (torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}; graph of n calls over R KV sets "
          f">= 192 MiB apart (cold L2), replay / n, median of >= {MIN_REPLAYS} replays)\n")
    print("| case | Hq/Hkv/D | peer | µs | TB/s |\n|---|---|---|---:|---:|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One cuDNN SDPA decode call on dense K/V, for Nsight Compute (stage dcmp of
scripts/gpu-context.sh): q [bs, Hq, 1, D], k / v [bs, Hkv, L, D] bf16, GQA by
`enable_gqa`, the cuDNN backend only. Two untimed calls (the first pays the
plan), then one marked call between cudaProfilerStart / Stop, so that
`ncu --profile-from-start off` sees only the kernels of that call.

Usage: python3 sdpa_decode_once.py [bs] [L] (default 64 8192; 32/8/128).
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa


def main():
    bs = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    hq, hkv, d = 32, 8, 128
    dev = torch.device("cuda")
    q = torch.rand(bs, hq, 1, d, device=dev, dtype=torch.bfloat16) * 2 - 1
    k = torch.rand(bs, hkv, length, d, device=dev, dtype=torch.bfloat16) * 2 - 1
    v = torch.rand(bs, hkv, length, d, device=dev, dtype=torch.bfloat16) * 2 - 1
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(2):
            sdpa(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        sdpa(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"sdpa decode bs {bs} L {length}: done")


if __name__ == "__main__":
    main()

"""One decode step from Python: 4 requests over a paged bf16 KV cache (NHD, as SGLang
stores it), on the GPU when torch sees one, else on the CPU path (f64 reference).
Run: python examples/01_decode_step.py"""
import torch, mha_kit
dev = "cuda" if torch.cuda.is_available() and mha_kit.gpu_available() else "cpu"
bs, hq, hkv, d, page, pages = 4, 32, 8, 128, 16, 64
kv = torch.randn(2, pages, page, hkv, d, device=dev).to(torch.bfloat16)        # K, V pools
block_tables = torch.randperm(pages, device=dev).to(torch.int32).view(bs, -1)  # [bs, 16 pages]
seq_lens = torch.tensor([5, 100, 17, 256], dtype=torch.int32, device=dev)      # KV lengths
q = torch.randn(bs, hq, d, device=dev).to(torch.bfloat16)                      # one new token each
ws = torch.zeros(32 << 20, dtype=torch.uint8, device=dev)                      # zeroed once
out = mha_kit.trtllm_batch_decode_with_kv_cache(q, (kv[0], kv[1]), ws, block_tables, seq_lens,
                                                max_seq_len=256, bmm1_scale=d**-0.5, kv_layout="NHD")
print(dev, tuple(out.shape), out.dtype, out.float().norm().item())

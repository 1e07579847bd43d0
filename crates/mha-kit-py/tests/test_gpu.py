"""GPU tests of mha_kit (skipped, reported as skipped, without torch or a
CUDA device): every function against the float64 definitions of
``reference.py`` on random ragged batches, CUDA-graph capture and replay,
``torch.compile``, the first call's module load time, and the DLPack exchange
fast path against the Python descriptions.

On the GPU host: ``MHA_KIT_REQUIRE_GPU=1 python -m pytest -v tests/test_gpu.py``
(the variable turns a missing GPU into a failure).
"""

import math
import os
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import reference as ref

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    if os.environ.get("MHA_KIT_REQUIRE_GPU") == "1":
        raise RuntimeError("MHA_KIT_REQUIRE_GPU=1 but torch sees no CUDA device")
    pytest.skip("no CUDA device", allow_module_level=True)

import mha_kit  # noqa: E402

DEV = torch.device("cuda", 0)
TORCH_DT = {"f16": torch.float16, "bf16": torch.bfloat16}


def _case(name, **kw):
    """A random case generated in float32 numpy, moved to torch in the
    requested dtypes; the reference reads the stored values back."""
    dt, kv = kw.pop("dt"), kw.pop("kv")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    c = ref.random_case(rng, dtype=np.float32, kv_dtype=np.float32, **kw)
    qd = TORCH_DT[dt]
    kvd = torch.float8_e4m3fn if kv == "e4m3" else qd
    t = {k: torch.from_numpy(np.ascontiguousarray(c[k])).to(DEV) for k in
         ("block_tables", "seq_lens", "cu")}
    t["q"] = torch.from_numpy(c["q"]).to(DEV, qd)
    t["k"] = torch.from_numpy(c["k"] * (2 if kv == "e4m3" else 1)).to(DEV, kvd)
    t["v"] = torch.from_numpy(c["v"] * (2 if kv == "e4m3" else 1)).to(DEV, kvd)
    t["sinks"] = None if c["sinks"] is None else torch.from_numpy(c["sinks"]).to(DEV)
    c["q64"] = t["q"].double().cpu().numpy()
    c["k64"] = t["k"].double().cpu().numpy()
    c["v64"] = t["v"].double().cpu().numpy()
    return c, t


def _ws():
    return torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)


def _check(out, want, what):
    got = out.double().cpu().numpy()
    err = np.abs(got - want)
    scale = max(np.abs(want).max(), 1e-3)
    assert err.max() <= 2e-2 * scale + 1e-3, f"{what}: max error {err.max():.3g} (scale {scale:.3g})"


DECODE = [
    ("decode-gqa4", dict(bs=16, hq=32, hkv=8, d=128, p=16, q_lens=[1] * 16, dt="bf16", kv="same")),
    ("decode-nhd-swa-sinks", dict(bs=8, hq=64, hkv=8, d=64, p=16, q_lens=[1] * 8, dt="bf16",
                                  kv="same", window_left=127, sinks=True, layout="NHD")),
    ("decode-mqa-f16", dict(bs=5, hq=8, hkv=1, d=128, p=32, q_lens=[1] * 5, dt="f16", kv="same")),
    ("decode-fp8", dict(bs=12, hq=32, hkv=8, d=128, p=16, q_lens=[1] * 12, dt="bf16", kv="e4m3")),
    ("decode-d256", dict(bs=3, hq=8, hkv=2, d=256, p=16, q_lens=[1] * 3, dt="f16", kv="same")),
    ("verify-q4", dict(bs=6, hq=32, hkv=8, d=128, p=16, q_lens=[4] * 6, dt="bf16", kv="same",
                       window_left=40)),
    ("long-split", dict(bs=2, hq=8, hkv=2, d=128, p=16, q_lens=[1, 1], dt="bf16", kv="same",
                        lens=[5000, 9000])),
]


@pytest.mark.parametrize("name,kw", DECODE, ids=[d[0] for d in DECODE])
def test_decode_matches_float64_reference(name, kw):
    c, t = _case(name, **kw)
    n = kw["q_lens"][0]
    bmm2 = 0.5 if kw["kv"] == "e4m3" else 1.0
    scale = 1 / math.sqrt(kw["d"])
    out = mha_kit.trtllm_batch_decode_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], c["max_seq_len"],
        bmm1_scale=scale, bmm2_scale=bmm2, window_left=c["window_left"], sinks=t["sinks"],
        kv_layout=c["layout"], q_len_per_req=n)
    want, _ = ref.attention(c["q64"], ref.hnd(c["k64"], c["layout"]), ref.hnd(c["v64"], c["layout"]),
                            c["block_tables"], c["seq_lens"], c["rows"], scale, bmm2,
                            c["window_left"], c["sinks"])
    _check(out, want, name)


def test_ragged_verify_matches_reference():
    q_lens = [3, 0, 1, 4, 2, 4]
    c, t = _case("ragged", bs=6, hq=16, hkv=4, d=128, p=16, q_lens=q_lens, dt="bf16", kv="same",
                 sinks=True, window_left=20)
    out = torch.full_like(t["q"], 3.0)
    mha_kit.trtllm_batch_decode_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], c["max_seq_len"],
        bmm1_scale=0.09, window_left=20, sinks=t["sinks"], out=out, q_len_per_req=None,
        max_q_len=4, cum_seq_lens_q=t["cu"])
    want, _ = ref.attention(c["q64"], c["k64"], c["v64"], c["block_tables"], c["seq_lens"],
                            c["rows"], 0.09, 1.0, 20, c["sinks"])
    _check(out, want, "ragged verify")


@pytest.mark.parametrize("kv", ["same", "e4m3"])
def test_context_matches_reference(kv):
    q_lens = [100, 1, 257, 0, 64]
    prefix = [0, 300, 17, 8, 1000]
    lens = [a + b for a, b in zip(q_lens, prefix)]
    c, t = _case(f"context-{kv}", bs=5, hq=16, hkv=4, d=128, p=16, q_lens=q_lens, dt="bf16",
                 kv=kv, lens=lens, layout="NHD")
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEV)
    out = mha_kit.trtllm_batch_context_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], max(q_lens),
        c["max_seq_len"], 0.088, 1.0, 5, t["cu"], cu_k, kv_layout="NHD")
    want, _ = ref.attention(c["q64"], ref.hnd(c["k64"], "NHD"), ref.hnd(c["v64"], "NHD"),
                            c["block_tables"], c["seq_lens"], c["rows"], 0.088, 1.0, -1, None)
    _check(out, want, f"context {kv}")


LOG2E = 1.4426950408889634


def _check_lse(lse, want_natural, what):
    got = lse.double().cpu().numpy()
    want = want_natural * LOG2E
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf), f"{what}: -inf rows differ"
    err = np.abs(got[~inf] - want[~inf])
    assert err.size == 0 or err.max() <= 2e-3 * max(1.0, np.abs(want[~inf]).max()), (
        f"{what}: max LSE error {err.max():.3g}"
    )


@pytest.mark.parametrize("split", [False, True])
def test_decode_and_context_return_lse_in_base_2(split):
    """``return_lse``: the kernels' natural-log LSE scaled to FlashInfer's
    base 2 on the stream; split and unsplit decode, sinks joined once, a
    row with no key ``-inf``; the context call likewise."""
    q_lens = [3, 0, 1, 4, 2, 4]
    lens = [20, 5, 17, 33, 1, 40] if not split else [5000, 5, 9000, 33, 1, 40]
    c, t = _case(f"lse-{split}", bs=6, hq=16, hkv=4, d=128, p=16, q_lens=q_lens, dt="bf16",
                 kv="same", sinks=True, lens=lens, window_left=-1)
    out, lse = mha_kit.trtllm_batch_decode_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], c["max_seq_len"],
        bmm1_scale=0.09, sinks=t["sinks"], q_len_per_req=None, max_q_len=4,
        cum_seq_lens_q=t["cu"], return_lse=True)
    want, _, want_lse = ref.attention(c["q64"], c["k64"], c["v64"], c["block_tables"],
                                      c["seq_lens"], c["rows"], 0.09, 1.0, -1, c["sinks"],
                                      with_lse=True)
    _check(out, want, "decode out")
    _check_lse(lse, want_lse, "decode lse")
    out, lse = mha_kit.trtllm_batch_context_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], 4, c["max_seq_len"],
        0.09, 1.0, 6, t["cu"], None, sinks=t["sinks"], return_lse=True)
    _check(out, want, "context out")
    _check_lse(lse, want_lse, "context lse")


@pytest.mark.parametrize("kv", ["same", "e4m3"])
def test_context_d512_runs_the_decode_path_vs_reference(kv):
    """Head dim 512: the context call runs the decode kernel's ragged path
    (no context kernel at 512; max_q_len above the decode cap of 16), with a
    prefix, GQA 8, a window, sinks and the row LSE."""
    q_lens = [40, 1, 70, 0, 17]
    prefix = [0, 100, 17, 8, 300]
    lens = [a + b for a, b in zip(q_lens, prefix)]
    c, t = _case(f"context-d512-{kv}", bs=5, hq=16, hkv=2, d=512, p=16, q_lens=q_lens,
                 dt="bf16", kv=kv, lens=lens, window_left=50, sinks=True, layout="NHD")
    bmm2 = 0.5 if kv == "e4m3" else 1.0
    scale = 1 / math.sqrt(512)
    out, lse = mha_kit.trtllm_batch_context_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], max(q_lens),
        c["max_seq_len"], scale, bmm2, 5, t["cu"], None, window_left=50, sinks=t["sinks"],
        kv_layout="NHD", return_lse=True)
    want, _, want_lse = ref.attention(c["q64"], ref.hnd(c["k64"], "NHD"),
                                      ref.hnd(c["v64"], "NHD"), c["block_tables"],
                                      c["seq_lens"], c["rows"], scale, bmm2, 50, c["sinks"],
                                      with_lse=True)
    _check(out, want, f"context d512 {kv}")
    _check_lse(lse, want_lse, f"context d512 {kv} lse")


def test_fp8_query_is_cast_in_the_workspace_and_keeps_the_counters():
    """An e4m3 query (the seed's FP8-cache context call): cast exactly into
    the output dtype in the workspace's head; the decode split counters at
    its end stay zero (a later split decode on the same workspace is right);
    a too-small workspace falls back to a new tensor."""
    c, t = _case("fp8-q", bs=4, hq=32, hkv=8, d=128, p=16, q_lens=[1] * 4, dt="bf16", kv="e4m3",
                 lens=[3000, 17, 9000, 1], sinks=True)
    q8 = t["q"].to(torch.float8_e4m3fn)
    q64 = q8.double().cpu().numpy()
    ws = _ws()
    want, _ = ref.attention(q64, c["k64"], c["v64"], c["block_tables"], c["seq_lens"], c["rows"],
                            0.1, 0.5, -1, c["sinks"])
    for workspace in (ws, torch.zeros(1 << 10, dtype=torch.uint8, device=DEV)):
        out = mha_kit.trtllm_batch_decode_with_kv_cache(
            q8, (t["k"], t["v"]), workspace, t["block_tables"], t["seq_lens"],
            c["max_seq_len"], bmm1_scale=0.1, bmm2_scale=0.5, sinks=t["sinks"],
            out_dtype=torch.bfloat16)
        _check(out, want, "e4m3 query decode")
    assert torch.count_nonzero(ws[-(256 << 10):]).item() == 0
    ctx = mha_kit.trtllm_batch_context_with_kv_cache(
        q8, (t["k"], t["v"]), ws, t["block_tables"], t["seq_lens"], 1, c["max_seq_len"], 0.1,
        0.5, 4, t["cu"], None, sinks=t["sinks"], out_dtype=torch.bfloat16)
    _check(ctx, want, "e4m3 query context")
    assert torch.count_nonzero(ws[-(256 << 10):]).item() == 0


def test_skip_softmax_factor_reaches_the_kernel():
    """FlashInfer's ``skip_softmax_threshold_scale_factor`` on the GPU: 0
    gives the bits of ``None``; 0.05 on peaked logits (``bmm1_scale`` 4)
    stays within ``2·f·bmm2·max|V|`` (plus the attention tolerance) of the
    float64 reference."""
    c, t = _case("skip", bs=4, hq=32, hkv=8, d=128, p=16, q_lens=[1] * 4, dt="bf16", kv="same",
                 lens=[3000, 4000, 100, 2500])
    ws = _ws()
    args = (t["q"], (t["k"], t["v"]), ws, t["block_tables"], t["seq_lens"], c["max_seq_len"])
    off = mha_kit.trtllm_batch_decode_with_kv_cache(*args, bmm1_scale=4.0)
    zero = mha_kit.trtllm_batch_decode_with_kv_cache(*args, bmm1_scale=4.0,
                                                     skip_softmax_threshold_scale_factor=0.0)
    assert torch.equal(off, zero)
    got = mha_kit.trtllm_batch_decode_with_kv_cache(*args, bmm1_scale=4.0,
                                                    skip_softmax_threshold_scale_factor=0.05)
    want, _ = ref.attention(c["q64"], c["k64"], c["v64"], c["block_tables"], c["seq_lens"],
                            c["rows"], 4.0, 1.0, -1, None)
    vmax = np.abs(c["v64"]).max()
    err = np.abs(got.double().cpu().numpy() - want)
    assert err.max() <= 2 * 0.05 * vmax + 2e-2 * vmax, f"max error {err.max():.3g}"


def _pool(rows, width, p, pages, seed=0):
    rng = np.random.default_rng(seed)
    r2t = np.zeros((rows, width), np.int32)
    perm = rng.permutation(np.arange(1, pages))
    per = width // p
    for r in range(rows):
        for j in range(per):
            r2t[r, j * p:(j + 1) * p] = perm[(r * per + j) % len(perm)] * p + np.arange(p)
    return r2t


def test_page_table_and_graph_metadata_are_exact():
    p, m = 16, 32
    r2t = _pool(9, m * p, p, 400)
    rpi = np.array([3, 8, 1, 4], np.int64)
    lens = np.array([1, 16, 17, 512], np.int32)
    pt = torch.full((4, m), -5, dtype=torch.int32, device=DEV)
    mha_kit.build_trtllm_mha_page_table(torch.from_numpy(r2t).to(DEV), torch.from_numpy(rpi).to(DEV),
                                        torch.from_numpy(lens).to(DEV), pt, p)
    want, _ = ref.page_table(r2t, rpi, lens, np.full((4, m), -5, np.int32), p)
    assert np.array_equal(pt.cpu().numpy(), want)
    cache = torch.zeros(4, dtype=torch.int32, device=DEV)
    cu_k = torch.zeros(5, dtype=torch.int32, device=DEV)
    cu_q = torch.zeros(5, dtype=torch.int32, device=DEV)
    pt2 = torch.full((4, m), -5, dtype=torch.int32, device=DEV)
    seq = torch.tensor([5, 20, 1, 400], dtype=torch.int64, device=DEV)
    mha_kit.update_trtllm_mha_graph_metadata(
        req_pool_indices=torch.from_numpy(rpi).to(DEV), seq_lens=seq,
        req_to_token=torch.from_numpy(r2t).to(DEV), cache_seqlens=cache, cu_seqlens_k=cu_k,
        page_table=pt2, bs=4, seqlen_offset=4, max_seq_pages=m, page_size=p,
        cu_seqlens_q=cu_q, q_stride=4, q_mode=mha_kit.Q_MODE_STRIDED)
    want_cache = seq.cpu().numpy() + 4
    assert np.array_equal(cache.cpu().numpy(), want_cache)
    assert np.array_equal(cu_k.cpu().numpy(), np.concatenate([[0], np.cumsum(want_cache)]))
    assert np.array_equal(cu_q.cpu().numpy(), np.arange(5) * 4)
    want2, _ = ref.page_table(r2t, rpi, want_cache, np.full((4, m), -5, np.int32), p)
    assert np.array_equal(pt2.cpu().numpy(), want2)
    assert all(v == (0, 0) for v in mha_kit.device_errors(reset=True).values())


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_fused_fp8_write_is_bit_exact(dt):
    pytest.importorskip("ml_dtypes")
    t_, hkv, d, p, slots = 300, 8, 128, 16, 4096
    g = torch.Generator(device="cpu").manual_seed(3)
    k = (torch.randn(t_, hkv, d, generator=g) * 100).to(TORCH_DT[dt])
    v = (torch.randn(t_, hkv, d, generator=g) * 0.1).to(TORCH_DT[dt])
    loc = torch.randperm(slots, generator=g)[:t_].to(torch.int64)
    kc = torch.zeros(slots // p, p, hkv, d, dtype=torch.float8_e4m3fn, device=DEV)
    vc = torch.zeros(slots // p, p, hkv, d, dtype=torch.float8_e4m3fn, device=DEV)
    mha_kit.fused_fp8_set_kv_buffer(k.to(DEV), v.to(DEV), kc, vc, loc.to(DEV), k_scale=0.7,
                                    v_scale=1.3, page_size=p)
    got_k = kc.view(torch.uint8).reshape(slots, hkv, d).cpu().numpy()[loc.numpy()]
    got_v = vc.view(torch.uint8).reshape(slots, hkv, d).cpu().numpy()[loc.numpy()]
    inv_k = np.float32(1) / np.float32(0.7)
    inv_v = np.float32(1) / np.float32(1.3)
    assert np.array_equal(got_k, ref.e4m3_satfinite(k.float().numpy(), inv_k))
    assert np.array_equal(got_v, ref.e4m3_satfinite(v.float().numpy(), inv_v))


def test_cuda_graph_capture_and_replay():
    """Graph metadata + decode captured once, replayed on new lengths."""
    p, m, bs, hq, hkv, d = 16, 64, 8, 32, 8, 128
    pages = 600
    r2t_np = _pool(bs + 1, m * p, p, pages, seed=5)
    r2t = torch.from_numpy(r2t_np).to(DEV)
    rpi = torch.arange(1, bs + 1, dtype=torch.int64, device=DEV)
    seq = torch.full((bs,), 10, dtype=torch.int64, device=DEV)
    cache = torch.zeros(bs, dtype=torch.int32, device=DEV)
    cu_k = torch.zeros(bs + 1, dtype=torch.int32, device=DEV)
    pt = torch.zeros(bs, m, dtype=torch.int32, device=DEV)
    q = torch.randn(bs, hq, d, device=DEV).to(torch.bfloat16)
    kc = torch.randn(pages, p, hkv, d, device=DEV).to(torch.bfloat16)
    vc = torch.randn(pages, p, hkv, d, device=DEV).to(torch.bfloat16)
    out = torch.zeros_like(q)
    ws = _ws()

    def step():
        mha_kit.update_trtllm_mha_graph_metadata(
            req_pool_indices=rpi, seq_lens=seq, req_to_token=r2t, cache_seqlens=cache,
            cu_seqlens_k=cu_k, page_table=pt, bs=bs, seqlen_offset=0, max_seq_pages=m,
            page_size=p)
        mha_kit.trtllm_batch_decode_with_kv_cache(q, (kc, vc), ws, pt, cache, m * p,
                                                  bmm1_scale=0.1, out=out, kv_layout="NHD")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: loads the modules outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens in ([5, 17, 100, 1, 300, 1000, 16, 33], [1024, 1, 2, 3, 999, 64, 65, 512]):
        seq.copy_(torch.tensor(lens, dtype=torch.int64))
        q.copy_(torch.randn(bs, hq, d, device=DEV).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        bt = np.zeros((bs, m), np.int32)
        for i in range(bs):
            bt[i] = r2t_np[i + 1, ::p][:m] // p
        want, _ = ref.attention(q.double().cpu().numpy(),
                                ref.hnd(kc.double().cpu().numpy(), "NHD"),
                                ref.hnd(vc.double().cpu().numpy(), "NHD"), bt,
                                np.array(lens), [(i, 1) for i in range(bs)], 0.1, 1.0, -1, None)
        _check(out, want, f"graph replay {lens}")


def test_torch_compile_matches_eager():
    c, t = _case("compile", bs=4, hq=16, hkv=4, d=128, p=16, q_lens=[1] * 4, dt="bf16", kv="same")
    ws = _ws()

    def fn(q, k, v, bt, sl, out):
        mha_kit.trtllm_batch_decode_with_kv_cache(q * 1.0, (k, v), ws, bt, sl, c["max_seq_len"],
                                                  bmm1_scale=0.1, out=out)
        return out + 0

    eager = fn(t["q"], t["k"], t["v"], t["block_tables"], t["seq_lens"], torch.empty_like(t["q"]))
    compiled = torch.compile(fn, fullgraph=True)
    got = compiled(t["q"], t["k"], t["v"], t["block_tables"], t["seq_lens"],
                   torch.empty_like(t["q"]))
    torch.testing.assert_close(got, eager, atol=0, rtol=0)


def test_first_call_loads_modules_in_under_a_second():
    code = r"""
import time, torch, mha_kit
q = torch.randn(4, 32, 128, device="cuda").to(torch.bfloat16)
kc = torch.randn(64, 8, 16, 128, device="cuda").to(torch.bfloat16)
bt = torch.arange(64, dtype=torch.int32, device="cuda").reshape(4, 16)
sl = torch.full((4,), 200, dtype=torch.int32, device="cuda")
ws = torch.zeros(16 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
mha_kit.trtllm_batch_decode_with_kv_cache(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1)
torch.cuda.synchronize()
t1 = time.perf_counter()
for _ in range(200):
    mha_kit.trtllm_batch_decode_with_kv_cache(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1)
t2 = time.perf_counter()
torch.cuda.synchronize()
out = torch.empty_like(q)
t3 = time.perf_counter()
for _ in range(200):
    mha_kit.trtllm_batch_decode_with_kv_cache(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1, out=out)
t4 = time.perf_counter()
torch.cuda.synchronize()
# The same with the DLPack exchange fast path off (Python descriptions).
exchange = mha_kit._tensor.EXCHANGE
mha_kit._tensor.EXCHANGE = False
t5 = time.perf_counter()
for _ in range(200):
    mha_kit.trtllm_batch_decode_with_kv_cache(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1, out=out)
t6 = time.perf_counter()
mha_kit._tensor.EXCHANGE = exchange
torch.cuda.synchronize()
# The same calls with the native probes on: the time inside the native
# function (after PyO3's argument conversion) and in the launcher alone.
mha_kit._native._timing(True, True)
for _ in range(200):
    mha_kit.trtllm_batch_decode_with_kv_cache(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1)
calls, native_ns, launches, launch_ns = mha_kit._native._timing(False, True)
torch.cuda.synchronize()
# Attribution of the out-given call (best of 5 loops of 1,000 calls, synced
# between loops): the whole call; the Python layer alone (the native
# function replaced by a no-op); the native function called directly with
# the arguments the Python layer passes (PyO3 conversion incl. the DLPack
# reads + the native body); the native body and the launcher (probes).
def best_us(fn, n=1000, loops=5):
    best = float("inf")
    for _ in range(loops):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best
dec = mha_kit.trtllm_batch_decode_with_kv_cache
whole = best_us(lambda: dec(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1, out=out))
real = mha_kit._native.decode
captured = []
mha_kit._native.decode = lambda *a: captured.append(a)
dec(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1, out=out)
args = captured[0]
mha_kit._native.decode = lambda *a: None
py_only = best_us(lambda: dec(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1, out=out))
mha_kit._native.decode = real
direct = best_us(lambda: real(*args))
mha_kit._native._timing(True, True)
direct_probed = best_us(lambda: real(*args), loops=1)
calls2, native_ns2, launches2, launch_ns2 = mha_kit._native._timing(False, True)
torch.cuda.synchronize()
body = native_ns2 / max(calls2, 1) / 1e3
launch2 = launch_ns2 / max(launches2, 1) / 1e3
print(f"attr_whole_us {whole:.2f}")
print(f"attr_python_layer_us {py_only:.2f}")
print(f"attr_native_direct_us {direct:.2f}")
print(f"attr_pyo3_conversion_us {direct_probed - body:.2f}")
print(f"attr_native_body_us {body:.2f}")
print(f"attr_launcher_us {launch2:.2f}")
print(f"attr_beyond_launcher_us {whole - launch2:.2f}")
host = (t2 - t1) / 200 * 1e6
launcher = launch_ns / max(launches, 1) / 1e3
print(f"first_call_s {t1 - t0:.4f}")
print(f"host_us_per_call {host:.2f}")
print(f"host_us_per_call_out_given {(t4 - t3) / 200 * 1e6:.2f}")
print(f"dlpack_exchange {exchange}")
print(f"host_us_per_call_out_given_descriptions {(t6 - t5) / 200 * 1e6:.2f}")
print(f"native_us_per_call {native_ns / max(calls, 1) / 1e3:.2f}")
print(f"launcher_us_per_call {launcher:.2f}")
print(f"beyond_launcher_us_per_call {host - launcher:.2f}")
print("sources", mha_kit.module_sources())
"""
    env = dict(os.environ, CUDA_CACHE_DISABLE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    first = float(r.stdout.split("first_call_s ")[1].split()[0])
    assert first < 1.0, r.stdout


def test_dlpack_exchange_fast_path_equals_descriptions():
    """torch >= 2.10 publishes the DLPack C exchange API: mha_kit then reads
    CUDA tensors natively (torch's current stream included), and every decode
    case's output equals the Python-description path's bit for bit."""
    from mha_kit import _tensor

    warm, t = _case("exchange-warm", **dict(DECODE[0][1]))
    mha_kit.trtllm_batch_decode_with_kv_cache(t["q"], (t["k"], t["v"]), _ws(),
                                              t["block_tables"], t["seq_lens"],
                                              warm["max_seq_len"])
    have_api = hasattr(torch.Tensor, "__dlpack_c_exchange_api__") or hasattr(
        torch.Tensor, "__c_dlpack_exchange_api__")
    assert _tensor.EXCHANGE == have_api, (torch.__version__, _tensor.EXCHANGE)
    if not have_api:
        pytest.skip(f"torch {torch.__version__} has no DLPack exchange API")
    for name, kw in DECODE:
        c, t = _case(name, **dict(kw))
        layout = kw.get("layout", "HND")
        n = kw["q_lens"][0]
        outs = []
        for on in (True, False):
            _tensor.EXCHANGE = on
            try:
                outs.append(mha_kit.trtllm_batch_decode_with_kv_cache(
                    t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"],
                    c["max_seq_len"], bmm1_scale=1 / math.sqrt(kw["d"]),
                    window_left=kw.get("window_left", -1), sinks=t["sinks"],
                    kv_layout=layout, q_len_per_req=n))
            finally:
                _tensor.EXCHANGE = have_api
        torch.cuda.synchronize()
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), name


def test_bad_device_input_is_an_exception_not_a_crash():
    q = torch.randn(2, 4, 64, device=DEV).half()
    k = torch.randn(4, 2, 16, 64, device=DEV).half()
    bt = torch.zeros(2, 4, dtype=torch.int32, device=DEV)
    sl = torch.ones(2, dtype=torch.int32)  # on the host
    with pytest.raises(mha_kit.InvalidArgument, match="seq_lens"):
        mha_kit.trtllm_batch_decode_with_kv_cache(q, (k, k), _ws(), bt, sl, 64)
    # A one-element CUDA tensor scale is read at call time (session 26, as
    # SGLang passes `layer.k_scale`); a tensor of two is refused.
    with pytest.raises(mha_kit.InvalidArgument, match="bmm1_scale"):
        mha_kit.trtllm_batch_decode_with_kv_cache(q, (k, k), _ws(), bt, sl.to(DEV), 64,
                                                  bmm1_scale=torch.ones(2, device=DEV))


def test_backend_class_on_cuda_tensors_matches_its_cpu_path():
    """`mha_kit.backend.TrtllmMhaBackend` over CUDA tensors (the kernels) and
    the same buffers as torch CPU tensors (the references): a prefill, a
    decode step, a uniform verify and a graph-bucket replay, hybrid SWA."""
    from mha_kit import backend as mb

    p, hq, hkv, d, rows, width, pages = 16, 8, 2, 128, 4, 256, 40
    rng = np.random.default_rng(17)
    r2t = np.zeros((rows, width), np.int32)
    perm = rng.permutation(np.arange(1, pages))
    for r in range(rows):
        for j in range(width // p):
            r2t[r, j * p:(j + 1) * p] = perm[(r * (width // p) + j) % len(perm)] * p + np.arange(p)
    f2s = np.zeros(pages * p, np.int64)
    sp = rng.permutation(np.arange(1, pages))
    for page in range(1, pages):
        f2s[page * p:(page + 1) * p] = sp[page - 1] * p + np.arange(p)
    layers = [mb.Layer(0, hq, hkv, d, d ** -0.5),
              mb.Layer(1, hq, hkv, d, d ** -0.5, window_left=20, is_swa=True)]
    sinks = torch.from_numpy(rng.standard_normal(hq).astype(np.float32))
    inputs = [torch.from_numpy(rng.standard_normal((64, hq * d)).astype(np.float32)).half()
              for _ in range(3)]

    def run(dev):
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
        caches = [(torch.zeros(pages, hkv, p, d, dtype=torch.float16, device=dev),
                   torch.zeros(pages, hkv, p, d, dtype=torch.float16, device=dev))
                  for _ in layers]
        b = mb.TrtllmMhaBackend(req_to_token=t(r2t), kv_buffers=caches, layers=layers,
                                page_size=p, max_context_len=width,
                                workspace_buffer=torch.zeros(64 << 20, dtype=torch.uint8,
                                                             device=dev),
                                full_to_swa=t(f2s), num_draft_tokens=3)
        q, k, v = (x.to(dev) for x in inputs)
        rpi = t(np.array([1, 2, 3], np.int64))
        outs = []
        lens = [30, 7, 19]
        loc = t(np.concatenate([r2t[r, :n] for r, n in zip([1, 2, 3], lens)]).astype(np.int64))
        batch = mb.ForwardBatch(mb.EXTEND, rpi, t(np.array(lens, np.int64)), loc,
                                extend_seq_lens=lens, extend_prefix_lens=[0, 0, 0])
        b.init_forward_metadata(batch)
        n = sum(lens)
        outs += [b.forward_extend(q[:n], k[:n, :hkv * d], v[:n, :hkv * d], lay, batch,
                                  sinks=sinks.to(dev) if lay.is_swa else None)
                 for lay in layers]
        seq = [x + 1 for x in lens]
        loc = t(np.array([r2t[r, x] for r, x in zip([1, 2, 3], lens)], np.int64))
        batch = mb.ForwardBatch(mb.DECODE, rpi, t(np.array(seq, np.int64)), loc)
        b.init_forward_metadata(batch)
        outs += [b.forward_decode(q[:3], k[:3, :hkv * d], v[:3, :hkv * d], lay, batch)
                 for lay in layers]
        # A decode graph bucket of 4 rows, replayed for the same batch padded.
        b.init_cuda_graph_state(4, 16)
        pad = lambda x, fill: torch.cat([x, torch.full((1,), fill, dtype=x.dtype, device=dev)])  # noqa: E731
        b.init_forward_metadata_capture_cuda_graph(
            4, 4, pad(rpi, 0), pad(t(np.array(seq, np.int64)), 1), mb.DECODE,
            out_cache_loc=pad(loc, 0))
        outs += [b.forward_decode(q[:4], None, None, lay, None, save_kv_cache=False)[:3]
                 for lay in layers]
        return [o.float().cpu().numpy() for o in outs]

    got, want = run(DEV), run(torch.device("cpu"))
    for i, (g, w) in enumerate(zip(got, want)):
        _check(torch.from_numpy(g), w.astype(np.float64), f"output {i}")


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_merge_states_on_cuda_equals_the_cpu_path(dt):
    """``merge_states`` / ``merge_state`` on CUDA tensors (the merge-states
    kernel) against the package's float64 CPU path on the same stored
    values: random parts, empty parts (``-inf``, NaN outputs never read),
    sinks once, an all-gather buffer read through ``transpose``, and one
    CUDA-graph capture and replay."""
    rng = np.random.default_rng(31)
    t, k, h, d = 33, 4, 8, 128
    v32 = rng.normal(0.0, 1.0, (t, k, h, d)).astype(np.float32)
    s32 = rng.normal(0.0, 4.0, (t, k, h)).astype(np.float32)
    empty = rng.random((t, k, h)) < 0.25
    s32[empty] = -np.inf
    v32[empty] = np.nan
    s32[0] = -np.inf  # a row no part saw
    sinks = rng.normal(0.0, 2.0, h).astype(np.float32)
    gathered = torch.from_numpy(np.ascontiguousarray(v32.transpose(1, 0, 2, 3))).to(DEV, TORCH_DT[dt])
    v = gathered.transpose(0, 1)  # [t, k, h, d] over the rank-major buffer
    s = torch.from_numpy(s32).to(DEV)
    sk = torch.from_numpy(sinks).to(DEV)
    got_v, got_s = mha_kit.merge_states(v, s, sinks=sk)
    host_v = v.cpu()
    want_v, want_s = mha_kit.merge_states(host_v, s.cpu(), sinks=sk.cpu())
    tol = 2.0**-7 if dt == "bf16" else 2.0**-10
    gv, wv = got_v.double().cpu().numpy(), want_v.double().numpy()
    assert np.all(np.abs(gv - wv) <= 2 * tol * (np.abs(wv) + 1.0)), "merged V"
    gs, ws = got_s.cpu().numpy(), want_s.numpy()
    assert np.array_equal(np.isinf(gs), np.isinf(ws))
    fin = np.isfinite(ws)
    assert np.all(np.abs(gs[fin] - ws[fin]) <= 1e-4 * np.maximum(1.0, np.abs(ws[fin])))
    assert torch.all(got_v[0] == 0) and torch.all(torch.isneginf(got_s[0]))
    a = mha_kit.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    b = mha_kit.merge_states(v[:, :2].contiguous(), s[:, :2].contiguous())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # Captured once, replayed: the same bits as the eager call.
    out = torch.empty_like(got_v)
    lse = torch.empty_like(got_s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mha_kit.merge_states(v, s, out=out, lse_out=lse, sinks=sk)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got_v) and torch.equal(lse, got_s)


@pytest.mark.parametrize("name,kw,n", [
    ("dcp-decode-2", DECODE[1][1], 2),
    ("dcp-verify-4", DECODE[5][1], 4),
    ("dcp-long-3", DECODE[6][1], 3),
])
def test_dcp_ranks_merged_on_cuda_equal_the_unsplit_decode(name, kw, n):
    """``dcp_rank`` / ``dcp_world_size`` on the tensor-core decode kernel
    (``DecodeArgs::interleave``): every rank's partial ``(out, lse)`` on this
    GPU, stacked as an all-gather would leave them and merged by
    ``merge_states`` with the sinks once, equals the unsplit call."""
    kw = dict(kw)
    c, t = _case(name, **kw)
    q_len = kw["q_lens"][0]
    common = dict(bmm1_scale=1 / math.sqrt(kw["d"]), window_left=c["window_left"],
                  kv_layout=c["layout"], q_len_per_req=q_len)
    want = mha_kit.trtllm_batch_decode_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], c["max_seq_len"],
        sinks=t["sinks"], **common)
    parts = [mha_kit.trtllm_batch_decode_with_kv_cache(
        t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], c["max_seq_len"],
        return_lse=True, dcp_rank=r, dcp_world_size=n, **common) for r in range(n)]
    got, _ = mha_kit.merge_states(torch.stack([p[0] for p in parts], 1),
                                  torch.stack([p[1] for p in parts], 1), sinks=t["sinks"])
    _check(got, want.double().cpu().numpy(), name)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_set_kv_buffer_on_cuda_equals_the_cpu_path(layout):
    """``set_kv_buffer`` on CUDA tensors (fp8-kv's paged write on torch's
    stream) writes the same bits as the CPU path; bad slots are skipped and
    counted in the ``kv_write`` word."""
    rng = np.random.default_rng(6)
    pages, hkv, p, d = 9, 4, 16, 128
    shape = (pages, hkv, p, d) if layout == "HND" else (pages, p, hkv, d)
    kc = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(DEV, torch.bfloat16)
    vc = kc.flip(0).contiguous()
    loc = torch.tensor([5, -1, 143, 144, 0, 77], dtype=torch.int64)
    k = torch.from_numpy(rng.standard_normal((6, hkv, d)).astype(np.float32)).to(torch.bfloat16)
    v = k.flip(0).contiguous()
    host_k, host_v = kc.cpu(), vc.cpu()
    mha_kit.set_kv_buffer(k, v, host_k, host_v, loc, layout)
    mha_kit.device_errors(DEV, reset=True)
    mha_kit.set_kv_buffer(k.to(DEV), v.to(DEV), kc, vc, loc.to(DEV), layout)
    assert torch.equal(kc.cpu(), host_k) and torch.equal(vc.cpu(), host_v)
    count, _ = mha_kit.device_errors(DEV, reset=True)["kv_write"]
    assert count == 2, count  # -1 and 144 (S = 144)


def test_cuda_tensor_scales_equal_floats_and_are_refused_under_capture():
    """One-element CUDA tensor scales (SGLang passes ``layer.k_scale``) give
    the float call's bits; during graph capture they raise InvalidArgument
    (the kernels take scales as launch parameters)."""
    c, t = _case("tensor-scales", bs=4, hq=16, hkv=4, d=128, p=16, q_lens=[1] * 4, dt="bf16",
                 kv="e4m3")
    s1, s2 = 0.0625, 0.5

    def call(b1, b2):
        return mha_kit.trtllm_batch_decode_with_kv_cache(
            t["q"], (t["k"], t["v"]), _ws(), t["block_tables"], t["seq_lens"], c["max_seq_len"],
            bmm1_scale=b1, bmm2_scale=b2, kv_layout=c["layout"])

    want = call(s1, s2)
    got = call(torch.tensor([s1], device=DEV), torch.tensor(s2, device=DEV))
    assert torch.equal(got, want)
    kb = torch.randn(4, 4, 128, device=DEV).to(torch.bfloat16)
    kc = torch.zeros(8, 16, 4, 128, dtype=torch.uint8, device=DEV)
    kf = torch.zeros_like(kc)
    loc = torch.arange(4, dtype=torch.int64, device=DEV)
    mha_kit.fused_fp8_set_kv_buffer(kb, kb, kc, torch.zeros_like(kc), loc,
                                    k_scale=torch.tensor([0.5], device=DEV), v_scale=0.5,
                                    page_size=16)
    mha_kit.fused_fp8_set_kv_buffer(kb, kb, kf, torch.zeros_like(kc), loc, k_scale=0.5,
                                    v_scale=0.5, page_size=16)
    assert torch.equal(kc, kf) and kc.any()
    ws = _ws()
    s1_dev = torch.tensor([s1], device=DEV)  # made before the capture (a copy)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with pytest.raises(mha_kit.InvalidArgument, match="capture"):
        with torch.cuda.graph(graph, stream=side):
            mha_kit.trtllm_batch_decode_with_kv_cache(
                t["q"], (t["k"], t["v"]), ws, t["block_tables"], t["seq_lens"],
                c["max_seq_len"], bmm1_scale=s1_dev, bmm2_scale=s2, kv_layout=c["layout"])


BAD_UNIT_ORDER = 16  # paged-attention's ErrorFlags::BAD_UNIT_ORDER


def test_unit_order_is_written_on_cuda_as_its_definition():
    """``write_decode_unit_order`` on CUDA tensors equals the definition:
    1 to 4,099 requests, ties, lengths ≤ 0 and past the capped bucket."""
    rng = np.random.default_rng(29)
    for bs in (1, 2, 31, 256, 257, 1000, 4099):
        lens = rng.integers(-5, 40000, bs).astype(np.int32)
        lens[:: max(bs // 7, 1)] = 640  # ties across the batch
        got = mha_kit.write_decode_unit_order(torch.from_numpy(lens).to(DEV))
        assert got.dtype == torch.int32 and got.device == DEV
        assert np.array_equal(got.cpu().numpy(), ref.unit_order(lens)), bs


@pytest.mark.parametrize("kv", ["bf16", "e4m3"])
def test_unit_order_read_by_a_large_decode_keeps_the_bits(kv):
    """A decode of 256 requests · 8 KV heads (one split, in length order)
    given the order: the same bits as without it and with another
    permutation; an entry outside ``[0, bs)`` leaves its request's rows
    unwritten and sets BAD_UNIT_ORDER; captured in a CUDA graph with the
    order written inside it, replays on new lengths equal the eager call
    without an order, bit for bit."""
    bs, hq, hkv, d, p, m = 256, 32, 8, 128, 16, 24
    g = torch.Generator(device=DEV).manual_seed(3)
    pages = bs * m + 1
    kvd = torch.float8_e4m3fn if kv == "e4m3" else torch.bfloat16
    kc = torch.randn(pages, hkv, p, d, device=DEV, generator=g).to(kvd)
    vc = torch.randn(pages, hkv, p, d, device=DEV, generator=g).to(kvd)
    bt = torch.randperm(pages, device=DEV, generator=g)[: bs * m].view(bs, m).to(torch.int32)
    q = torch.randn(bs, hq, d, device=DEV, generator=g).to(torch.bfloat16)
    ws = _ws()
    lens = torch.randint(1, m * p + 1, (bs,), device=DEV, generator=g, dtype=torch.int32)

    def decode(lens, order=None, out=None):
        return mha_kit.trtllm_batch_decode_with_kv_cache(
            q, (kc, vc), ws, bt, lens, m * p, bmm1_scale=d ** -0.5, out=out, unit_order=order)

    mha_kit.device_errors(DEV, reset=True)
    want = decode(lens)
    order = mha_kit.write_decode_unit_order(lens)
    assert torch.equal(decode(lens, order), want)
    assert torch.equal(decode(lens, order.flip(0).contiguous()), want)
    assert all(v == (0, 0) for v in mha_kit.device_errors(DEV, reset=True).values())
    bad = order.clone()
    victim = int(bad[3])
    bad[3] = bs + 5
    out = torch.full_like(q, float("nan"))
    decode(lens, bad, out)
    count, flags = mha_kit.device_errors(DEV, reset=True)["attention"]
    assert flags & BAD_UNIT_ORDER and count >= 1, (count, flags)
    keep = torch.arange(bs, device=DEV) != victim
    assert torch.equal(out[keep], want[keep]) and torch.isnan(out[victim]).all()
    # Graph: the order written inside the graph from the lengths it reads.
    glens = lens.clone()
    gorder = torch.zeros(bs, dtype=torch.int32, device=DEV)
    gout = torch.zeros_like(q)

    def step():
        mha_kit.write_decode_unit_order(glens, gorder)
        decode(glens, gorder, gout)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (1, 2):
        new = torch.randint(1, m * p + 1, (bs,), device=DEV,
                            generator=torch.Generator(device=DEV).manual_seed(seed),
                            dtype=torch.int32)
        glens.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert np.array_equal(gorder.cpu().numpy(), ref.unit_order(new.cpu().numpy()))
        assert torch.equal(gout, decode(new)), f"replay {seed}"
    assert all(v == (0, 0) for v in mha_kit.device_errors(DEV, reset=True).values())


def test_backend_writes_the_unit_order_once_a_pass_on_cuda():
    """``TrtllmMhaBackend`` on CUDA: a decode pass of 256 requests (8 KV
    heads) gets the length order of its ``cache_seqlens`` in its metadata,
    eager and in a graph bucket (rewritten at each replay's metadata
    update), and its layers' outputs equal the decode call without an
    order, bit for bit; a pass of 4 requests gets none."""
    from mha_kit import backend as mb

    bs, hq, hkv, d, p, width = 256, 32, 8, 128, 16, 256
    pages = bs * width // p + 1
    r2t_np = _pool(bs + 1, width, p, pages, seed=11)
    r2t = torch.from_numpy(r2t_np).to(DEV)
    layer = mb.Layer(0, hq, hkv, d, d ** -0.5)
    caches = [(torch.randn(pages, hkv, p, d, device=DEV).to(torch.bfloat16),
               torch.randn(pages, hkv, p, d, device=DEV).to(torch.bfloat16))]
    b = mb.TrtllmMhaBackend(req_to_token=r2t, kv_buffers=caches, layers=[layer], page_size=p,
                            max_context_len=width, workspace_buffer=_ws())
    rng = np.random.default_rng(5)
    rpi = torch.arange(1, bs + 1, dtype=torch.int64, device=DEV)
    q = torch.randn(bs, hq * d, device=DEV).to(torch.bfloat16)

    def check(meta, what):
        assert meta.unit_order is not None, what
        lens = meta.cache_seqlens.cpu().numpy()
        assert np.array_equal(meta.unit_order.cpu().numpy(), ref.unit_order(lens)), what
        got = b.forward_decode(q, None, None, layer, None, save_kv_cache=False)
        want = mha_kit.trtllm_batch_decode_with_kv_cache(
            q.view(bs, hq, d), caches[0], b.workspace_buffer, meta.page_table,
            meta.cache_seqlens, width, bmm1_scale=d ** -0.5)
        assert torch.equal(got, want.view(bs, hq * d)), what

    seq = torch.from_numpy(rng.integers(1, width, bs)).to(DEV)
    loc = torch.zeros(bs, dtype=torch.int64, device=DEV)
    check(b.init_forward_metadata(mb.ForwardBatch(mb.DECODE, rpi, seq, loc)), "eager")
    small = b.init_forward_metadata(mb.ForwardBatch(mb.DECODE, rpi[:4], seq[:4], loc[:4]))
    assert small.unit_order is None
    b.init_cuda_graph_state(bs, bs)
    check(b.init_forward_metadata_capture_cuda_graph(bs, bs, rpi, seq, mb.DECODE,
                                                     out_cache_loc=loc), "capture")
    seq2 = torch.from_numpy(rng.integers(1, width, bs)).to(DEV)
    check(b.init_forward_metadata_replay_cuda_graph(bs, bs, rpi, seq2, mb.DECODE,
                                                    out_cache_loc=loc), "replay")

"""``bench/peer_bench.py`` (issue 15's bench beside cuDNN and FlashInfer) on
mha_kit's CPU path: its inputs (page table, pools, offsets), its sampled-row
float32 reference and its check, on tiny decode / FP8 / verify / context
cases. The GPU timing itself runs on the GPU host (``gpu-context.sh`` stage
``pybench``). Skipped without torch (as in CI)."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import peer_bench  # noqa: E402


def test_cpu_cases_match_the_reference():
    rows = peer_bench.main(["--cpu"])
    assert len(rows) == 2 * len(peer_bench.CPU_CASES)
    for r in rows:
        assert r["rel_err"] < 1e-2, r


def test_the_check_sees_a_wrong_output():
    # Pool 1's output checked against pool 0's keys: the check must fail it.
    c = peer_bench.CPU_CASES[0]
    inp = peer_bench.Inputs(c, torch.device("cpu"), pools=2, seed=3)
    run, out = peer_bench.peer_mha_kit(inp, torch.zeros(1 << 20, dtype=torch.uint8))
    run(1)
    assert peer_bench.rel_err(inp, out, pool=1) < 1e-2
    assert peer_bench.rel_err(inp, out, pool=0) > 0.3


def test_flops_and_bytes():
    c = peer_bench.Case("x", "context", 2, 4, hq=2, hkv=1, d=8)
    # 2 requests × 2 heads × (1 + 2 + 3 + 4) keys seen × 4 · D
    assert peer_bench.flops(c) == 4.0 * 2 * 2 * 8 * 10
    d = peer_bench.Case("y", "decode", 3, 10, hq=4, hkv=2, d=8, q_len=2)
    assert peer_bench.flops(d) == 4.0 * 3 * 4 * 8 * (9 + 10)
    assert peer_bench.kv_bytes(d) == 3 * 10 * 2 * 8 * 2 * 2


def test_the_sdpa_peer_is_checked_through_its_view():
    # The cuDNN row's output is a view of SDPA's own tensor (session 21's
    # first GPU run failed there); the same path with the math backend on
    # the CPU, decode (q_len 1) and context cases.
    from torch.nn.attention import SDPBackend

    ran = 0
    for c in peer_bench.CPU_CASES:
        if c.kv == "e4m3" or (c.kind == "decode" and c.q_len > 1):
            continue
        inp = peer_bench.Inputs(c, torch.device("cpu"), pools=2, seed=5)
        run, out = peer_bench.peer_cudnn(inp, None, backend=SDPBackend.MATH)
        run(1)
        assert peer_bench.rel_err(inp, out, pool=1) < 1e-2, c
        assert peer_bench.rel_err(inp, out, pool=0) > 0.3, c
        ran += 1
    assert ran >= 2

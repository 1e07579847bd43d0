"""mha_kit beside its peers: one GPU, one process, one timing method.

Times mha_kit's FlashInfer-signature calls (``trtllm_batch_decode_with_kv_cache``,
``trtllm_batch_context_with_kv_cache``) on the shapes of issue 14 / issue 13
beside, in the same process:

- torch's ``scaled_dot_product_attention`` with the cuDNN back-end on dense K/V
  (``[bs, Hkv, L, D]``, ``enable_gqa``; causal for the context cases; no FP8
  K/V, no ragged verify mask: those rows say n/a);
- FlashInfer, when ``import flashinfer`` works (``gpu-context.sh`` stage
  ``pybench`` sets it up from the carried peer folder): ``trtllm_batch_decode_with_kv_cache``
  with ``backend="xqa"`` (the kernel the seed's backend calls on Hopper),
  ``BatchDecodeWithPagedKVCacheWrapper`` on tensor cores (fa2), and
  ``BatchPrefillWithPagedKVCacheWrapper`` with ``backend="fa2"`` / ``"fa3"``.

Method (the project's and the peers' one): each peer's call is captured ``n``
times in one CUDA graph, call ``i`` reading K/V pool ``i mod R``, the ``R``
pools together ≥ 192 MiB so that no call finds its K/V in the 60 MiB L2; the
time of a call is a replay's time / ``n``, the median of ≥ 50 replays. Every
paged peer reads the same page ids (one random page order, HND pages of 16
tokens); only the K/V memory differs between pools.

Each row's output (pool 0) is compared with a float32 reference on sampled
rows (two requests for decode, 64 rows of request 0 for context):
``rel err = ||out - ref|| / ||ref||``; a row above ``REL_TOL`` is marked.

Ratios are ``peer µs / mha_kit µs`` (above 1: mha_kit is faster).

usage: python peer_bench.py [--cases a,b] [--peers a,b] [--json PATH]
       python peer_bench.py --cpu     (tiny cases on mha_kit's CPU path: the
                                       set-up and the reference, no timing)
"""

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass

import torch

import mha_kit

PAGE = 16
COLD_BYTES = 192 << 20
MAX_POOLS = 64
TARGET_US = 20_000.0  # device time per replay
MAX_CALLS = 200
REPLAYS = 50
REL_TOL = 2e-2


@dataclass
class Case:
    """One shape. ``kind`` decode (``q_len`` rows per request at the end of its
    ``length`` keys) or context (``length`` causal rows over ``length`` keys)."""

    name: str
    kind: str
    bs: int
    length: int
    hq: int = 32
    hkv: int = 8
    d: int = 128
    kv: str = "bf16"
    q_len: int = 1


CASES = [
    Case("decode bs 64, L 8192", "decode", 64, 8192),
    Case("decode bs 256, L 8192", "decode", 256, 8192),
    Case("decode bs 1, L 1024", "decode", 1, 1024),
    Case("decode bs 16, L 1024", "decode", 16, 1024),
    Case("decode bs 1, L 32768", "decode", 1, 32768),
    Case("decode FP8 KV, bs 64, L 8192", "decode", 64, 8192, kv="e4m3"),
    Case("verify q_len 4, bs 64, L 8192", "decode", 64, 8192, q_len=4),
    Case("context bs 8 x 4096", "context", 8, 4096),
    Case("context bs 1 x 16384", "context", 1, 16384),
]

CPU_CASES = [
    Case("cpu decode", "decode", 3, 40, hq=8, hkv=2, d=64),
    Case("cpu decode FP8 KV", "decode", 3, 40, hq=8, hkv=2, d=64, kv="e4m3"),
    Case("cpu verify q_len 3", "decode", 3, 40, hq=8, hkv=2, d=64, q_len=3),
    Case("cpu context", "context", 2, 37, hq=8, hkv=2, d=64),
]


def kv_dtype(case):
    return torch.float8_e4m3fn if case.kv == "e4m3" else torch.bfloat16


def kv_bytes(case):
    return case.bs * case.length * case.hkv * case.d * 2 * (1 if case.kv == "e4m3" else 2)


def flops(case):
    """Attention FLOPs (2 matmuls, 2 FLOPs a multiply-add) over the keys each
    row sees: causal prefixes for context, ``length - q_len + j + 1`` for decode."""
    if case.kind == "context":
        seen = case.length * (case.length + 1) // 2
    else:
        seen = sum(case.length - case.q_len + j + 1 for j in range(case.q_len))
    return 4.0 * case.bs * case.hq * case.d * seen


class Inputs:
    """Shared index tensors (page table, lengths, offsets) and ``R`` K/V pools."""

    def __init__(self, case, dev, pools, seed=0):
        g = torch.Generator(device=dev).manual_seed(seed)
        self.case = case
        pages = math.ceil(case.length / PAGE)
        self.num_pages = case.bs * pages
        order = torch.randperm(self.num_pages, generator=g, device=dev).to(torch.int32)
        self.block_tables = order.reshape(case.bs, pages)
        self.seq_lens = torch.full((case.bs,), case.length, dtype=torch.int32, device=dev)
        rows = case.q_len if case.kind == "decode" else case.length
        self.rows = rows
        self.cu_q = torch.arange(case.bs + 1, dtype=torch.int32, device=dev) * rows
        self.cu_kv = torch.arange(case.bs + 1, dtype=torch.int32, device=dev) * case.length
        self.q = self._randn((case.bs * rows, case.hq, case.d), torch.bfloat16, g, dev)
        self.kv = []
        shape = (self.num_pages, case.hkv, PAGE, case.d)
        for _ in range(pools):
            k = self._randn(shape, kv_dtype(case), g, dev)
            v = self._randn(shape, kv_dtype(case), g, dev)
            self.kv.append((k, v))
        self.scale = 1.0 / math.sqrt(case.d)
        self._dense = None

    @staticmethod
    def _randn(shape, dtype, g, dev):
        """N(0, 0.25) values in ``dtype``, drawn on ``dev`` (16-bit first: a
        float32 draw of the largest pools would take 17 GB)."""
        x = torch.randn(shape, generator=g, device=dev, dtype=torch.float16)
        x.mul_(0.5)
        return x.to(dtype)

    def dense(self):
        """Per pool, ``(k, v)`` as dense ``[bs, Hkv, L, D]`` (the SDPA peer)."""
        if self._dense is None:
            c = self.case
            bt = self.block_tables.long()
            self._dense = []
            for k, v in self.kv:
                def gather(x):
                    x = x[bt]  # [bs, pages, Hkv, P, D]
                    x = x.permute(0, 2, 1, 3, 4).reshape(c.bs, c.hkv, -1, c.d)
                    return x[:, :, : c.length].contiguous()
                self._dense.append((gather(k), gather(v)))
        return self._dense

    def keys_of(self, pool, b):
        """Request ``b``'s K and V of ``pool`` as float32 ``[Hkv, L, D]``."""
        c = self.case
        k, v = self.kv[pool]
        ids = self.block_tables[b].long()

        def one(x):
            x = x[ids].float().permute(1, 0, 2, 3).reshape(c.hkv, -1, c.d)
            return x[:, : c.length]
        return one(k), one(v)


def sampled_rows(case):
    """``(request, row)`` pairs the reference checks."""
    if case.kind == "decode":
        reqs = sorted({0, case.bs - 1})
        return [(b, j) for b in reqs for j in range(case.q_len)]
    step = max(1, case.length // 64)
    rows = sorted(set(range(0, case.length, step)) | {case.length - 1})
    return [(0, j) for j in rows]


def reference(inp, pool, pairs):
    """float32 attention of the sampled rows: ``[len(pairs), Hq, D]``."""
    c = inp.case
    group = c.hq // c.hkv
    out = []
    cache = {}
    for b, j in pairs:
        if b not in cache:
            cache[b] = inp.keys_of(pool, b)
        k, v = cache[b]
        pos = c.length - inp.rows + j  # the row's position among the keys
        q = inp.q[b * inp.rows + j].float().reshape(c.hkv, group, c.d)
        kk, vv = k[:, : pos + 1], v[:, : pos + 1]
        logits = torch.einsum("hgd,hkd->hgk", q, kk) * inp.scale
        p = torch.softmax(logits, dim=-1)
        out.append(torch.einsum("hgk,hkd->hgd", p, vv).reshape(c.hq, c.d))
    return torch.stack(out)


def rel_err(inp, out, pool=0):
    pairs = sampled_rows(inp.case)
    # `out` may be a peer's view of its own output (cuDNN's), not a tensor:
    # the rows live on the inputs' device.
    idx = torch.tensor([b * inp.rows + j for b, j in pairs], device=inp.q.device)
    got = out.index_select(0, idx).float()
    ref = reference(inp, pool, pairs).to(got.device)
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


# ---- peers: each returns (launch(pool_index), out) or raises Skip ----


class Skip(Exception):
    """The peer does not serve this case (the row says why)."""


def peer_mha_kit(inp, ws):
    c = inp.case
    out = torch.empty(inp.q.shape, dtype=torch.bfloat16, device=inp.q.device)
    if c.kind == "decode":
        def run(i):
            mha_kit.trtllm_batch_decode_with_kv_cache(
                inp.q, inp.kv[i], ws, inp.block_tables, inp.seq_lens, c.length,
                bmm1_scale=inp.scale, out=out, q_len_per_req=c.q_len)
    else:
        def run(i):
            mha_kit.trtllm_batch_context_with_kv_cache(
                inp.q, inp.kv[i], ws, inp.block_tables, inp.seq_lens, c.length, c.length,
                inp.scale, 1.0, c.bs, inp.cu_q, inp.cu_kv, out=out)
    return run, out


def peer_cudnn(inp, ws, backend=None):
    """torch SDPA on dense K/V, pinned to cuDNN (``backend`` overrides it:
    the CPU test runs the same path with the math backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = SDPBackend.CUDNN_ATTENTION if backend is None else backend
    c = inp.case
    if c.kv == "e4m3":
        raise Skip("no FP8 K/V in SDPA")
    if c.kind == "decode" and c.q_len > 1:
        raise Skip("verify rows need a bottom-right causal mask (a masked SDPA call is another kernel)")
    dense = inp.dense()
    q = inp.q.reshape(c.bs, inp.rows, c.hq, c.d).transpose(1, 2)
    causal = c.kind == "context"
    last = [None]

    def run(i):
        k, v = dense[i]
        with sdpa_kernel(backend):
            last[0] = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=inp.scale, enable_gqa=True)

    class View:
        """The latest SDPA output as ``[bs·rows, Hq, D]`` rows, for the check
        (SDPA allocates its output; copying it would add a kernel to the time)."""

        def index_select(self, dim, idx):
            return last[0].transpose(1, 2).reshape(-1, c.hq, c.d).index_select(dim, idx)

    return run, View()


def _flashinfer():
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # absent, or its modules do not load
        raise Skip(f"no flashinfer ({type(e).__name__})") from None
    return flashinfer


def _paged_indices(inp):
    c = inp.case
    pages = inp.block_tables.shape[1]
    dev = inp.q.device
    indptr = torch.arange(c.bs + 1, dtype=torch.int32, device=dev) * pages
    last = torch.full((c.bs,), (c.length - 1) % PAGE + 1, dtype=torch.int32, device=dev)
    return indptr, inp.block_tables.reshape(-1).contiguous(), last


def peer_xqa(inp, ws):
    fi = _flashinfer()
    c = inp.case
    if c.kind != "decode":
        raise Skip("decode only")
    out = torch.empty(inp.q.shape, dtype=torch.bfloat16, device=inp.q.device)
    fws = torch.zeros(128 << 20, dtype=torch.uint8, device=inp.q.device)

    def run(i):
        fi.decode.trtllm_batch_decode_with_kv_cache(
            inp.q, inp.kv[i], fws, inp.block_tables, inp.seq_lens, c.length,
            bmm1_scale=inp.scale, bmm2_scale=1.0, out=out, backend="xqa",
            q_len_per_req=c.q_len)
    return run, out


def peer_fa2_decode(inp, ws):
    fi = _flashinfer()
    c = inp.case
    if c.kind != "decode" or c.q_len != 1:
        raise Skip("q_len 1 decode only")
    fws = torch.empty(128 << 20, dtype=torch.uint8, device=inp.q.device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(fws, "HND", use_tensor_cores=True)
    indptr, indices, last = _paged_indices(inp)
    w.plan(indptr, indices, last, c.hq, c.hkv, c.d, PAGE, q_data_type=torch.bfloat16,
           kv_data_type=kv_dtype(c), sm_scale=inp.scale)
    out = torch.empty(inp.q.shape, dtype=torch.bfloat16, device=inp.q.device)

    def run(i):
        w.run(inp.q, inp.kv[i], out=out)
    return run, out


def _peer_prefill(backend):
    def peer(inp, ws):
        fi = _flashinfer()
        c = inp.case
        if c.kind != "context":
            raise Skip("context only")
        fws = torch.empty(128 << 20, dtype=torch.uint8, device=inp.q.device)
        w = fi.BatchPrefillWithPagedKVCacheWrapper(fws, "HND", backend=backend)
        indptr, indices, last = _paged_indices(inp)
        w.plan(inp.cu_q, indptr, indices, last, c.hq, c.hkv, c.d, PAGE, causal=True,
               sm_scale=inp.scale, q_data_type=torch.bfloat16, kv_data_type=kv_dtype(c))
        out = torch.empty(inp.q.shape, dtype=torch.bfloat16, device=inp.q.device)

        def run(i):
            w.run(inp.q, inp.kv[i], out=out)
        return run, out
    return peer


PEERS = [
    ("mha_kit", peer_mha_kit),
    ("cuDNN SDPA (dense)", peer_cudnn),
    ("FlashInfer XQA", peer_xqa),
    ("FlashInfer fa2 (tensor cores)", peer_fa2_decode),
    ("FlashInfer fa2 prefill", _peer_prefill("fa2")),
    ("FlashInfer fa3 prefill", _peer_prefill("fa3")),
]


def time_graph(run, pools):
    """µs per call: ``n`` calls in one CUDA graph cycling over the pools,
    median of ``REPLAYS`` replays of (replay time / ``n``)."""
    for i in range(pools):  # warm-up: module loads and plans, outside capture
        run(i)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(pools):
        run(i)
    e1.record()
    e1.synchronize()
    est = max(e0.elapsed_time(e1) * 1e3 / pools, 1.0)
    n = min(MAX_CALLS, max(1, int(TARGET_US / est)))
    n = max(pools, n - n % pools)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(n):
                run(i % pools)
        g.replay()
        torch.cuda.synchronize()
        launch, how = g.replay, "graph"
    except Exception as e:  # a peer that cannot be captured: eager, and the row says so
        torch.cuda.synchronize()
        print(f"capture failed ({type(e).__name__}: {e}); timing eager launches", file=sys.stderr)

        def launch():
            for i in range(n):
                run(i % pools)
        how = "eager"
    times = []
    for _ in range(REPLAYS):
        e0.record()
        launch()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / n)
    return statistics.median(times), n, how


def select(items, names, filt):
    if not filt:
        return items
    subs = [s.strip() for s in filt.split(",") if s.strip()]
    return [x for x, nm in zip(items, names) if any(s in nm for s in subs)]


def run_gpu(args):
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    cases = select(CASES, [c.name for c in CASES], args.cases)
    peers = select(PEERS, [p[0] for p in PEERS], args.peers)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    rows = []
    for c in cases:
        pools = max(1, min(MAX_POOLS, math.ceil(COLD_BYTES / kv_bytes(c))))
        inp = Inputs(c, dev, pools)
        base = None
        for name, make in peers:
            row = {"case": c.name, "peer": name}
            try:
                run, out = make(inp, ws)
                us, n, how = time_graph(run, pools)
                run(0)  # the checked output: pool 0's, eager
                torch.cuda.synchronize()
                row.update(us=us, calls_per_graph=n, pools=pools, method=how,
                           rel_err=rel_err(inp, out))
                if name == "mha_kit":
                    base = us
            except Skip as e:
                row["skip"] = str(e)
            except Exception as e:  # a peer that fails is a row, not the end of the run
                row["skip"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            if "us" in row:
                row["ratio"] = row["us"] / base if base else None
                # (peer µs over mha_kit µs: mha_kit runs first in every case)
                if c.kind == "decode":
                    row["rate"] = f"{kv_bytes(c) / row['us'] / 1e6:.2f} TB/s"
                else:
                    row["rate"] = f"{flops(c) / row['us'] / 1e6:.0f} TFLOP/s"
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        del inp
        torch.cuda.empty_cache()
    print(f"\n## mha_kit beside its peers on {props.name} (torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; CUDA graph of n calls over R K/V pools "
          f">= 192 MiB together, replay / n, median of {REPLAYS} replays; HND pages of {PAGE})\n")
    print("| case | peer | µs | peer / mha_kit | rate | rel err | n, R, method |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        if "us" not in r:
            print(f"| {r['case']} | {r['peer']} | n/a: {r['skip']} | | | | |")
            continue
        mark = " **over tolerance**" if r["rel_err"] > REL_TOL else ""
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") else ""
        print(f"| {r['case']} | {r['peer']} | {r['us']:.1f} | {ratio} | {r['rate']} | "
              f"{r['rel_err']:.2e}{mark} | {r['calls_per_graph']}, {r['pools']}, {r['method']} |")
    return rows


def run_cpu(args):
    """Tiny cases through mha_kit's CPU path (host tensors: the f64
    references): the set-up, the sampled-row reference and the check."""
    rows = []
    for c in CPU_CASES:
        inp = Inputs(c, torch.device("cpu"), pools=2, seed=1)
        for pool in range(2):
            run, out = peer_mha_kit(inp, torch.zeros(1 << 20, dtype=torch.uint8))
            t0 = time.perf_counter()
            run(pool)
            rows.append({"case": c.name, "pool": pool, "rel_err": rel_err(inp, out, pool),
                         "host_ms": (time.perf_counter() - t0) * 1e3})
    for r in rows:
        print(f"{r['case']:24s} pool {r['pool']}: rel err {r['rel_err']:.2e} ({r['host_ms']:.1f} ms)")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="", help="comma list of case-name substrings")
    ap.add_argument("--peers", default="", help="comma list of peer-name substrings")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--cpu", action="store_true", help="tiny cases on the CPU path, no timing")
    a = ap.parse_args(argv)
    rows = run_cpu(a) if a.cpu else run_gpu(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

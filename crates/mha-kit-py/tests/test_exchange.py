"""The DLPack exchange fast path (torch >= 2.10, issue 15): the native module
reads torch tensors itself through ``torch.Tensor.__dlpack_c_exchange_api__``
instead of the Python layer describing them. With torch CPU tensors (the CPU
path): the fast path is taken (no description is built), its outputs are the
description path's bit for bit on the decode cases of ``test_cpu.py``
(strided KV views, e4m3 bytes, ragged verify, sinks), errors still name the
argument, and what it cannot read (numpy arrays, subclasses, tensors that
need grad) falls back to descriptions. Skipped without torch (as in CI)."""

import math
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mha_kit  # noqa: E402
from mha_kit import _api, _native, _tensor  # noqa: E402

import reference as ref  # noqa: E402


def _t(a):
    """A torch CPU tensor with ``a``'s bits and dtype (bf16 / e4m3 by view)."""
    name = a.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(torch.bfloat16)
    if name == "float8_e4m3fn":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(a))


def _exchange_on():
    mha_kit.trtllm_batch_decode_with_kv_cache(**_args(_case(1, "f16")))  # registers on first use
    if not _tensor.EXCHANGE:
        pytest.skip(f"torch {torch.__version__} has no usable DLPack exchange API")


def _case(seed, dt, kv="same", n=1, window=-1, sinks=False, ragged=False):
    if (dt == "bf16" or kv == "e4m3") and ref.ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    dtype = ref.BF16 if dt == "bf16" else np.float16
    rng = np.random.default_rng(seed)
    q_lens = [3, 0, 1, 4, 2] if ragged else [n] * 3
    c = ref.random_case(rng, bs=len(q_lens), hq=8, hkv=2, d=64, p=16, q_lens=q_lens,
                        dtype=dtype, kv_dtype=("e4m3" if kv == "e4m3" else dtype),
                        window_left=window, sinks=sinks, layout="HND")
    c["n"] = None if ragged else n
    c["window"] = window
    return c


def _args(c, convert=_t):
    a = dict(
        query=convert(c["q"]),
        kv_cache=(convert(c["k"]), convert(c["v"])),
        workspace_buffer=torch.zeros(1 << 16, dtype=torch.uint8),
        block_tables=convert(c["block_tables"]),
        seq_lens=convert(c["seq_lens"]),
        max_seq_len=c["max_seq_len"],
        bmm1_scale=1 / math.sqrt(64),
        window_left=c["window"],
        q_len_per_req=c["n"],
    )
    if c["sinks"] is not None:
        a["sinks"] = convert(c["sinks"])
    if c["n"] is None:
        a["max_q_len"] = 4
        a["cum_seq_lens_q"] = convert(c["cu"])
    return a


def _run(a, exchange, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(_tensor, "EXCHANGE", exchange)
        out = mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    return out.view(torch.int16).numpy().copy()


CASES = [
    ("f16", dict()),
    ("bf16", dict(sinks=True, window=5)),
    ("bf16", dict(kv="e4m3", n=2)),
    ("f16", dict(ragged=True, sinks=True, window=6)),
]


@pytest.mark.parametrize("dt,kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_fast_path_equals_descriptions_bit_for_bit(dt, kw, monkeypatch):
    _exchange_on()
    c = _case(zlib.crc32(repr(kw).encode()), dt, **kw)
    a = _args(c)
    slow = _run(a, False, monkeypatch)

    def no_describe(*_a, **_k):
        raise AssertionError("the fast path built a description")

    with monkeypatch.context() as m:
        m.setattr(_api, "describe", no_describe)
        fast = _run(a, True, monkeypatch)
    np.testing.assert_array_equal(fast, slow)
    # ... and the numpy (description) path agrees too.
    np_out = mha_kit.trtllm_batch_decode_with_kv_cache(**_args(c, convert=lambda x: x))
    np.testing.assert_array_equal(fast, np_out.view(np.int16))


@pytest.mark.parametrize("dt,kv,window,sinks", [("f16", "same", -1, False),
                                                 ("bf16", "e4m3", -1, False),
                                                 ("bf16", "same", 9, True)])
def test_context_fast_path_equals_descriptions(dt, kv, window, sinks, monkeypatch):
    _exchange_on()
    if (dt == "bf16" or kv == "e4m3") and ref.ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    dtype = ref.BF16 if dt == "bf16" else np.float16
    rng = np.random.default_rng(zlib.crc32(f"{dt}{kv}{window}".encode()))
    q_lens = [5, 1, 17, 0, 9]
    lens = [n + p for n, p in zip(q_lens, [0, 30, 3, 8, 16])]
    c = ref.random_case(rng, bs=5, hq=8, hkv=2, d=64, p=8, q_lens=q_lens, dtype=dtype,
                        kv_dtype=("e4m3" if kv == "e4m3" else dtype), lens=lens, sinks=sinks,
                        window_left=window, layout="HND")
    cu_k = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    args = (_t(c["q"]), (_t(c["k"]), _t(c["v"])), torch.zeros(1 << 16, dtype=torch.uint8),
            _t(c["block_tables"]), _t(c["seq_lens"]), max(q_lens), c["max_seq_len"], 0.125,
            1.0, 5, _t(c["cu"]), _t(cu_k))
    kw = dict(window_left=window, sinks=None if c["sinks"] is None else _t(c["sinks"]))
    outs = []
    for on in (True, False):
        with monkeypatch.context() as m:
            m.setattr(_tensor, "EXCHANGE", on)
            if on:
                def no_describe(*_a, **_k):
                    raise AssertionError("the fast path built a description")

                m.setattr(_api, "describe", no_describe)
            outs.append(mha_kit.trtllm_batch_context_with_kv_cache(*args, **kw)
                        .view(torch.int16).numpy().copy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_strided_kv_views_are_read_with_their_strides(monkeypatch):
    _exchange_on()
    c = _case(5, "f16")
    # One [num_pages, 2, Hkv, P, D] tensor: K and V are strided views of it.
    kv = torch.stack([_t(c["k"]), _t(c["v"])], dim=1)
    a = _args(c)
    a["kv_cache"] = kv
    assert not a["kv_cache"][:, 0].is_contiguous()
    np.testing.assert_array_equal(_run(a, True, monkeypatch), _run(a, False, monkeypatch))


def test_errors_still_name_the_argument():
    _exchange_on()
    a = _args(_case(2, "f16"))
    a["query"] = a["query"].float()
    with pytest.raises(mha_kit.InvalidArgument) as e:
        mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    assert "`query`" in str(e.value) and "float32" in str(e.value), str(e.value)
    a = _args(_case(2, "f16"))
    a["block_tables"] = a["block_tables"].long()
    with pytest.raises(mha_kit.InvalidArgument) as e:
        mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    assert "`block_tables`" in str(e.value) and "int64" in str(e.value), str(e.value)


class _Sub(torch.Tensor):
    pass


def test_what_it_cannot_read_falls_back(monkeypatch):
    _exchange_on()
    c = _case(3, "f16")
    want = _run(_args(c), False, monkeypatch)
    # A numpy workspace, a subclass query, a query that needs grad.
    for change in (
        lambda a: a.update(workspace_buffer=np.zeros(1 << 16, np.uint8)),
        lambda a: a.update(query=a["query"].as_subclass(_Sub)),
        lambda a: a.update(query=a["query"].clone().requires_grad_(True)),
    ):
        a = _args(c)
        change(a)
        got = mha_kit.trtllm_batch_decode_with_kv_cache(**a)
        np.testing.assert_array_equal(got.detach().view(torch.int16).numpy(), want)


def test_native_reads_a_tensor_like_its_description():
    """Address, dtype, shape, strides and device of views with offsets and
    negative-free strides, every dtype, empty and 0-d tensors: the native
    reading equals the Python description."""
    _exchange_on()
    base = torch.arange(6 * 5 * 4, dtype=torch.float32).reshape(6, 5, 4)
    xs = [
        base,
        base[1:, ::2, :],
        base.transpose(0, 2),
        base[2],
        base[0, 0, 0],
        base[:0],
        base.to(torch.bfloat16)[3:],
        base.half(),
        base.int(),
        base.long()[:, 1],
        base.to(torch.uint8),
        base.to(torch.float8_e4m3fn)[1:4],
    ]
    for x in xs:
        py = _tensor.describe(x, "x")
        nat = _native._exchange_describe(x)
        assert nat[0] == py[0] and int(nat[1]) == py[1], (x.shape, nat, py)
        assert tuple(nat[2]) == tuple(py[2]) and tuple(nat[3]) == tuple(py[3]), (nat, py)
        assert nat[4] == py[4] == -1
    assert _native._exchange_describe(base.double())[1] == "float64"
    with pytest.raises(_native.NotExchangeable):
        _native._exchange_describe(np.zeros(3))
    with pytest.raises(_native.NotExchangeable):
        _native._exchange_describe(base.as_subclass(_Sub))


@pytest.mark.parametrize("exchange", [False, True])
def test_torch_lse_and_e4m3_query_equal_the_numpy_path(exchange, monkeypatch):
    """``return_lse`` with torch tensors allocates a float32 ``lse`` and scales
    it to base 2 in place; an e4m3 torch query with ``out_dtype``; both equal
    the numpy path bit for bit, through the fast path and descriptions."""
    if ref.ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    if exchange:
        _exchange_on()
    c = _case(31, "bf16", kv="e4m3", ragged=True, sinks=True, window=6)
    c["q"] = c["q"].astype(np.float32).astype(ref.E4M3)
    with monkeypatch.context() as m:
        m.setattr(_tensor, "EXCHANGE", exchange)
        out, lse = mha_kit.trtllm_batch_decode_with_kv_cache(
            **_args(c), return_lse=True, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    want, want_lse = mha_kit.trtllm_batch_decode_with_kv_cache(
        **_args(c, convert=lambda x: x), return_lse=True, out_dtype=ref.BF16)
    np.testing.assert_array_equal(out.view(torch.int16).numpy(), want.view(np.int16))
    np.testing.assert_array_equal(lse.numpy(), want_lse)

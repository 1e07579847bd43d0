"""Host time per call of mha_kit's pre-launch path, on a machine without a GPU.

Times ``mha_kit.trtllm_batch_decode_with_kv_cache`` on the shapes of
``tests/test_gpu.py::test_first_call_loads_modules_in_under_a_second``
(bf16, 4 requests, 32/8/128, 16 pages of 16, ``out`` allocated by the
call), with the native module's launch stub on
(``_native._stub_launches(True)``): every layer up to the device runs (the
Python layer, the PyO3 boundary, the Rust validation), nothing after it (no
device / stream / launcher look-up, no views, no plan, no launch).

Without torch the tensors are stand-ins: a fake ``torch`` module whose
``Tensor`` has the attributes mha_kit reads (``dtype``, ``shape``,
``stride()``, ``data_ptr()``, ``device``, ``is_cuda``, ``get_device()``,
``new_empty``) as plain Python attributes and methods. Their cost differs
from torch's C getters, and ``new_empty`` returns a tensor made once (torch's
allocation, a few µs on a real device, is not mha_kit's to cut), so compare
runs of this script with each other, and use the GPU test for absolute
numbers. With a real torch and a
CUDA device (``--torch``) it times real tensors instead, still stubbed.

Rows printed (µs per call, best of ``--repeat`` runs of ``--n`` calls):

- ``public``: the public function, end to end (stubbed);
- ``python_only``: the same with ``_native.decode`` replaced by a no-op:
  the Python layer alone;
- ``native``: ``_native.decode`` on descriptions built beforehand: the
  PyO3 boundary plus the Rust validation;
- ``native_body``: the part of ``native`` inside the Rust function, after
  argument conversion (``_native._timing``).

usage: python bench/host_overhead.py [--n 20000] [--repeat 5] [--torch]
"""

import argparse
import sys
import time
import types

import mha_kit
from mha_kit import _api, _native


def _fake_torch():
    """A ``torch`` stand-in with just what mha_kit's CUDA path reads."""
    torch = types.ModuleType("torch")

    class dtype:
        __slots__ = ("name", "itemsize")

        def __init__(self, name, itemsize):
            self.name, self.itemsize = name, itemsize

        def __repr__(self):
            return f"torch.{self.name}"

    for name, size in [("bfloat16", 2), ("float16", 2), ("float32", 4), ("int32", 4),
                       ("int64", 8), ("uint8", 1), ("float8_e4m3fn", 1)]:
        setattr(torch, name, dtype(name, size))

    class device:
        __slots__ = ("type", "index")

        def __init__(self, type, index=None):
            self.type, self.index = type, index

        def __str__(self):
            return self.type if self.index is None else f"{self.type}:{self.index}"

    class Size(tuple):
        pass

    next_ptr = [1 << 32]

    class Tensor:
        __slots__ = ("dtype", "shape", "_stride", "_ptr", "device", "is_cuda", "is_cpu")

        def __init__(self, shape, dt, dev=0):
            self.dtype = dt
            self.shape = Size(shape)
            st, acc = [], 1
            for n in reversed(shape):
                st.append(acc)
                acc *= n
            self._stride = tuple(reversed(st))
            self._ptr = next_ptr[0]
            next_ptr[0] += (acc * dt.itemsize + 255) // 256 * 256
            self.device = device("cuda", dev) if dev >= 0 else device("cpu")
            self.is_cuda = dev >= 0
            self.is_cpu = dev < 0

        def data_ptr(self):
            return self._ptr

        def stride(self):
            return self._stride

        def get_device(self):
            return self.device.index if self.is_cuda else -1

        def new_empty(self, shape, dtype=None):
            # A twin made once: the allocation is torch's cost, not mha_kit's.
            twin = _twins.get((id(self), dtype))
            if twin is None:
                twin = Tensor(tuple(shape), dtype or self.dtype, self.get_device())
                _twins[(id(self), dtype)] = twin
            return twin

    _twins = {}

    torch.Tensor, torch.device, torch.Size = Tensor, device, Size
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0)
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda dev: 0)
    torch.compiler = types.SimpleNamespace(is_compiling=lambda: False)
    return torch


def _inputs(torch, real):
    if real:
        dev = "cuda"
        q = torch.randn(4, 32, 128, device=dev).to(torch.bfloat16)
        kc = torch.randn(64, 8, 16, 128, device=dev).to(torch.bfloat16)
        bt = torch.arange(64, dtype=torch.int32, device=dev).reshape(4, 16)
        sl = torch.full((4,), 200, dtype=torch.int32, device=dev)
        ws = torch.zeros(16 << 20, dtype=torch.uint8, device=dev)
        return q, kc, ws, bt, sl
    T = torch.Tensor
    return (T((4, 32, 128), torch.bfloat16), T((64, 8, 16, 128), torch.bfloat16),
            T((16 << 20,), torch.uint8), T((4, 16), torch.int32), T((4,), torch.int32))


def _best(f, n, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="real torch CUDA tensors")
    a = ap.parse_args()
    if a.torch:
        import torch
    else:
        if "torch" in sys.modules:
            sys.exit("torch is imported: run without it, or pass --torch")
        torch = sys.modules["torch"] = _fake_torch()
        _api._compiling = torch.compiler.is_compiling
    q, kc, ws, bt, sl = _inputs(torch, a.torch)
    decode = mha_kit.trtllm_batch_decode_with_kv_cache
    _native._stub_launches(True)
    try:
        def public():
            decode(q, (kc, kc), ws, bt, sl, 256, bmm1_scale=0.1)

        public()  # a bad input raises here, before any timing
        rows = {"public": _best(public, a.n, a.repeat)}

        real_native = _native.decode
        try:
            _native.decode = lambda *args: None
            rows["python_only"] = _best(public, a.n, a.repeat)
        finally:
            _native.decode = real_native

        captured = []
        try:
            _native.decode = lambda *args: captured.append(args)
            public()
        finally:
            _native.decode = real_native
        args = captured[0]

        def native():
            real_native(*args)

        rows["native"] = _best(native, a.n, a.repeat)
        body = float("inf")
        for _ in range(a.repeat):
            _native._timing(True, True)
            for _ in range(a.n):
                real_native(*args)
            calls, ns, _, _ = _native._timing(False, True)
            body = min(body, ns / max(calls, 1) / 1e3)
        rows["native_body"] = body
    finally:
        _native._stub_launches(False)
    kind = "torch CUDA tensors" if a.torch else "fake torch tensors"
    print(f"# mha_kit host overhead, decode bf16 4x32/8x128, 16 pages of 16 ({kind}, "
          f"launch stubbed), us/call, best of {a.repeat}x{a.n}")
    for k, v in rows.items():
        print(f"{k:12s} {v:8.2f}")


if __name__ == "__main__":
    main()

"""Zero-copy tensor descriptions for the native module.

Why not DLPack or ``__cuda_array_interface__``: both hand over a tensor
together with a stream contract (``__dlpack__(stream=...)`` makes the
consumer's stream wait on the producer's, which records events and, under
CUDA-graph capture, touches streams outside the capture), and building the
capsule or the interface dict costs several microseconds per tensor. mha_kit's
calls always run on torch's *current* stream, which is passed explicitly, so
the only thing the native side needs is the memory: ``data_ptr()``, the
dtype, the shape and the strides, read straight from the tensor (a few
hundred nanoseconds) and checked in Rust (rank, dtype, shape, strides,
alignment, device) before anything is launched.

A description is the tuple ``(data_ptr, dtype, shape, strides, device)``:
dtype the code (index in ``CODES``) of one of ``bf16 f16 f32 i32 i64 u8
e4m3``, strides in elements, device ``-1`` for host memory (the CPU path) or
the CUDA ordinal.

Hot path (issue 15: a decode call's host time): a CUDA tensor of exactly
``torch.Tensor`` with a supported dtype is described with six reads
(``dtype``, ``is_cuda``, ``data_ptr()``, ``shape``, ``stride()``,
``get_device()``), no ``torch.device`` object and no tuple copies
(``torch.Size`` is a tuple); everything else, and every error, goes through
the general path.

Faster still (torch >= 2.10): the native module reads exact ``torch.Tensor``
arguments itself through the DLPack C exchange API (``EXCHANGE``), tens of
nanoseconds a tensor with no interpreter call; a decode call then passes its
tensors unchanged, and falls back to descriptions only when the native side
raises ``NotExchangeable`` (a subclass, a numpy array, a refused tensor).
"""

import os
import sys

from . import _native

InvalidArgument = _native.InvalidArgument

#: The dtype names, in code order (``desc::Dtype::from_code`` in Rust).
CODES = ("bf16", "f16", "f32", "i32", "i64", "u8", "e4m3")
#: Bytes per element, by code.
ITEMSIZE = (2, 2, 4, 4, 8, 1, 1)
BF16, F16, F32, I32, I64, U8, E4M3 = range(7)

_NUMPY_DTYPES = {
    "bfloat16": BF16,
    "float16": F16,
    "float32": F32,
    "int32": I32,
    "int64": I64,
    "uint8": U8,
    "float8_e4m3fn": E4M3,
}

_torch_dtypes = None
# ``torch.Tensor`` once torch has been seen (the hot path's exact type check).
_TENSOR = None
# torch dtype -> code, for the hot path (filled with _TENSOR).
_TORCH_CODES = {}
# Whether the native module reads torch tensors itself through the DLPack C
# exchange API (``torch.Tensor.__dlpack_c_exchange_api__``, torch >= 2.10):
# then the hot path passes the tensors, not descriptions. Set with _TENSOR;
# ``MHA_KIT_DLPACK_EXCHANGE=0`` keeps it off.
EXCHANGE = False


def _register_exchange(torch):
    global EXCHANGE
    if os.environ.get("MHA_KIT_DLPACK_EXCHANGE", "1") == "0":
        return
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if api is None:
        api = getattr(torch.Tensor, "__c_dlpack_exchange_api__", None)
    if api is None:
        return
    try:
        EXCHANGE = bool(_native.register_exchange_api(torch.Tensor, api))
    except Exception:  # an unknown table layout: keep the Python descriptions
        EXCHANGE = False


def _torch_dtype_map(torch):
    global _torch_dtypes, _TENSOR
    if _torch_dtypes is None:
        m = {
            torch.bfloat16: BF16,
            torch.float16: F16,
            torch.float32: F32,
            torch.int32: I32,
            torch.int64: I64,
            torch.uint8: U8,
        }
        if hasattr(torch, "float8_e4m3fn"):
            m[torch.float8_e4m3fn] = E4M3
        _torch_dtypes = m
        _TORCH_CODES.update(m)
        _TENSOR = torch.Tensor
        _register_exchange(torch)
    return _torch_dtypes


def is_torch(x):
    """Whether ``x`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def describe(x, name, writable=False):
    """The description of tensor ``x`` (argument ``name``).

    Raises:
        InvalidArgument: ``x`` is not a torch tensor or numpy array, or has an
            unsupported dtype or device, or is a read-only array that the
            call writes (``writable``).
    """
    if type(x) is _TENSOR:
        dt = _TORCH_CODES.get(x.dtype)
        if dt is not None and x.is_cuda:
            return (x.data_ptr(), dt, x.shape, x.stride(), x.get_device())
    return _describe(x, name, writable)


def _describe(x, name, writable):
    """``describe``'s general path (host tensors, subclasses, every error)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        dt = _torch_dtype_map(torch).get(x.dtype)
        if dt is None:
            raise InvalidArgument(
                f"argument `{name}`: dtype {x.dtype} is not supported "
                f"(shape {list(x.shape)})"
            )
        dev = x.device
        if dev.type == "cuda":
            ordinal = dev.index if dev.index is not None else torch.cuda.current_device()
        elif dev.type == "cpu":
            ordinal = -1
        else:
            raise InvalidArgument(
                f"argument `{name}`: device {dev} is not supported (cuda or cpu; "
                f"shape {list(x.shape)}, dtype {x.dtype})"
            )
        return (x.data_ptr(), dt, tuple(x.shape), tuple(x.stride()), ordinal)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        dt = _NUMPY_DTYPES.get(x.dtype.name)
        if dt is None:
            raise InvalidArgument(
                f"argument `{name}`: dtype {x.dtype} is not supported (shape {list(x.shape)})"
            )
        if writable and not x.flags.writeable:
            raise InvalidArgument(
                f"argument `{name}`: the array is read-only, the call writes it "
                f"(shape {list(x.shape)}, dtype {x.dtype})"
            )
        size = x.dtype.itemsize
        if any(s % size for s in x.strides):
            raise InvalidArgument(
                f"argument `{name}`: strides {x.strides} (bytes) are not multiples of the "
                f"element size (shape {list(x.shape)}, dtype {x.dtype})"
            )
        strides = tuple(s // size for s in x.strides)
        return (x.__array_interface__["data"][0], dt, tuple(x.shape), strides, -1)
    raise InvalidArgument(
        f"argument `{name}`: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}"
    )


def maybe(x, name, writable=False):
    """``describe`` for an optional tensor (``None`` stays ``None``)."""
    return None if x is None else describe(x, name, writable)


def select(desc, dim, index, name):
    """The description of ``x.select(dim, index)`` (no tensor is made)."""
    ptr, dt, shape, strides, dev = desc
    if not 0 <= index < shape[dim]:
        raise InvalidArgument(f"argument `{name}`: index {index} out of dim {dim} of {list(shape)}")
    item = ITEMSIZE[dt]
    return (
        ptr + index * strides[dim] * item,
        dt,
        shape[:dim] + shape[dim + 1:],
        strides[:dim] + strides[dim + 1:],
        dev,
    )


def permute(desc, perm):
    """The description of ``x.permute(perm)``."""
    ptr, dt, shape, strides, dev = desc
    return (ptr, dt, tuple(shape[i] for i in perm), tuple(strides[i] for i in perm), dev)


def head(desc, n, name, dim=0):
    """The description of ``x[:n]`` along ``dim`` (``x`` must have ≥ n there)."""
    ptr, dt, shape, strides, dev = desc
    if len(shape) <= dim or shape[dim] < n:
        raise InvalidArgument(
            f"argument `{name}`: needs at least {n} entries in dim {dim}, has shape {list(shape)}"
        )
    return (ptr, dt, shape[:dim] + (n,) + shape[dim + 1:], strides, dev)


_raw_stream = None


def stream_of(desc):
    """torch's current stream handle on the description's CUDA device (0 on the host)."""
    dev = desc[4]
    if dev < 0:
        return 0
    if _raw_stream is not None:
        return _raw_stream(dev)
    return _stream_slow(dev)


def _stream_slow(dev):
    global _raw_stream
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        _raw_stream = raw
        return raw(dev)
    return torch.cuda.current_stream(dev).cuda_stream


def host_int(x, name, lo=0):
    """``int(x)`` of a host integer argument, which must lie in ``[lo, 2^63)``;
    anything else (``None``, a string, a negative count, a value no native
    integer holds) is an :class:`InvalidArgument` naming it, not the
    ``TypeError`` / ``OverflowError`` of the conversion."""
    try:
        v = int(x)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"argument `{name}`: expected an integer, got {x!r}") from None
    if v < lo:
        raise InvalidArgument(f"argument `{name}`: {v} (must be ≥ {lo})")
    if v >= 1 << 63:
        raise InvalidArgument(f"argument `{name}`: {v} is too large (< 2^63)")
    return v


def host_ints(**args):
    """:func:`host_int` of every ``name=(value, lo)``: called after a native
    call failed with a conversion error, to name the argument that caused it."""
    for name, (value, lo) in args.items():
        host_int(value, name, lo)


def scale(x, name):
    """:func:`scalar` of a required scale (``None`` is an error)."""
    r = scalar(x, name)
    if r is None:
        raise InvalidArgument(f"argument `{name}`: None (a float or a one-element tensor)")
    return r


def scalar(x, name):
    """A Python float from a float, int or one-element tensor/array.

    A one-element CUDA tensor (FlashInfer and SGLang pass scales such as
    ``layer.k_scale`` that way) is read on the host at call time: a
    device→host copy that synchronises the current stream, so the value
    is the one the stream's earlier work left there. During CUDA-graph
    capture that copy is impossible, and the kernels take the scale as a
    launch parameter (a captured graph would keep the capture-time value
    where FlashInfer's kernels read the tensor at replay): refused with
    :class:`InvalidArgument`; pass a Python float there.
    """
    if x is None:
        return None
    if isinstance(x, (float, int)):
        return float(x)
    if is_torch(x):
        if x.numel() != 1:
            raise InvalidArgument(f"argument `{name}`: expected one element, shape {list(x.shape)}")
        if x.is_cuda:
            import torch

            if torch.cuda.is_current_stream_capturing():
                raise InvalidArgument(
                    f"argument `{name}`: a CUDA tensor scale during CUDA-graph capture (the "
                    "kernels take the scale as a launch parameter, so a replay would keep "
                    "the capture-time value); pass a Python float"
                )
        return float(x.reshape(-1)[0].item())
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, (np.ndarray, np.generic)):
        if np.size(x) != 1:
            raise InvalidArgument(f"argument `{name}`: expected one element, shape {list(np.shape(x))}")
        return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])
    raise InvalidArgument(f"argument `{name}`: expected a float, got {type(x).__name__}")

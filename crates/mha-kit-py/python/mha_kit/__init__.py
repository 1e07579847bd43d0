"""mha_kit: paged-KV attention for LLM serving engines, from Python.

Drop-in functions with the signatures of the FlashInfer calls SGLang's
TRT-LLM MHA backend makes, over mha-kit's CUDA kernels (cubins for sm_90,
PTX elsewhere; no JIT, no CUDA toolkit at run time, only the driver):

- :func:`trtllm_batch_decode_with_kv_cache`: decode, uniform and ragged
  speculative verify (window, sinks, GQA, FP8 KV);
- :func:`trtllm_batch_context_with_kv_cache`: prefill / chunked prefill;
- :func:`build_trtllm_mha_page_table`, :func:`update_trtllm_mha_graph_metadata`,
  :func:`fused_fp8_set_kv_buffer`: the seed backend's helpers, and
  :func:`set_kv_buffer` for 16-bit caches (bad slots skipped and counted);
- :func:`write_decode_unit_order`: a batch's length order, written once a
  step and passed to every layer's decode call (``unit_order``);
- :func:`merge_states`, :func:`merge_state`: FlashInfer's merges of partial
  attention states (split KV, decode context parallelism after an
  all-gather), sinks joined once;
- :class:`TrtllmMhaBackend`, :class:`TrtllmMhaMultiStepDraftBackend`
  (:mod:`mha_kit.backend`): the seed backend's state machine (metadata per pass,
  per-layer forward, CUDA-graph buckets) over the engine's buffers.

CUDA tensors run on torch's current stream with no allocation, copy or sync
inside a call (CUDA-graph capturable after a first eager call per kernel
family, or :func:`init`); host tensors (torch CPU tensors, numpy arrays —
``ml_dtypes`` gives numpy bfloat16 / float8_e4m3fn) run the kernel crates'
float64 CPU references, in place. With torch importable the functions are
also ``torch.library`` custom ops (``torch.ops.mha_kit.*``) with fake
implementations, used under ``torch.compile``.

Bad input raises :class:`InvalidArgument` (a ``ValueError`` naming the
argument, its shape, strides and dtype); device problems raise
:class:`DeviceError` (a ``RuntimeError``).
"""

from . import _native, backend
from ._api import (
    Q_MODE_CUMSUM,
    Q_MODE_NONE,
    Q_MODE_RAGGED_VERIFY,
    Q_MODE_STRIDED,
    build_trtllm_mha_page_table,
    fused_fp8_set_kv_buffer,
    merge_state,
    merge_states,
    set_kv_buffer,
    trtllm_batch_context_with_kv_cache,
    trtllm_batch_decode_with_kv_cache,
    update_trtllm_mha_graph_metadata,
    write_decode_unit_order,
)

from .backend import TrtllmMhaBackend, TrtllmMhaMultiStepDraftBackend

InvalidArgument = _native.InvalidArgument
DeviceError = _native.DeviceError
#: Bytes at the end of a decode ``workspace_buffer`` that hold split counters.
WORKSPACE_COUNTER_BYTES = _native.WORKSPACE_COUNTER_BYTES
#: Head dims that every kernel family serves (the decode kernels and the
#: context kernels).
HEAD_DIMS = tuple(_native.HEAD_DIMS)
#: Head dims of the decode and the context calls: HEAD_DIMS and 512 (the
#: context call at 512 runs the decode kernel's ragged path: correct, not tuned).
DECODE_HEAD_DIMS = tuple(_native.DECODE_HEAD_DIMS)

try:  # the custom ops need torch; the package works without it (CPU path on numpy)
    import torch as _torch  # noqa: F401

    from . import _torch_ops  # noqa: F401

    HAS_TORCH_OPS = True
except ImportError:
    HAS_TORCH_OPS = False


def _device_index(device):
    if isinstance(device, int):
        return device
    name = str(device)
    if device is not None and name != "cuda" and not name.startswith("cuda:"):
        raise DeviceError(
            f"device {device!r}: expected a CUDA device (an index, 'cuda:N' or a torch.device)")
    index = None if isinstance(device, str) or device is None else getattr(device, "index", None)
    if index is None and name.startswith("cuda:"):
        try:
            index = int(name.split(":", 1)[1])
        except ValueError:
            raise DeviceError(f"device {device!r}: expected 'cuda:N'") from None
    if index is None:
        try:
            import torch
        except ImportError:
            raise DeviceError(
                f"device {device!r}: torch's current CUDA device needs torch (not installed); "
                "pass an index") from None
        return torch.cuda.current_device()
    return index


def gpu_available():
    """Whether a CUDA GPU can be used (never raises; no torch needed)."""
    return _native.gpu_missing() is None


def gpu_missing():
    """``None`` when a GPU can be used, else the reason (a string)."""
    return _native.gpu_missing()


def init(device=None):
    """Opens the CUDA device and loads every kernel module now.

    Call it (or each function once) before capturing a CUDA graph: a kernel
    family's first call loads its module and is refused during capture.

    Args:
        device: ``int``, ``torch.device`` or ``None`` (torch's current device).

    Raises:
        DeviceError: no GPU, or a module does not load.
    """
    index = _device_index(device)
    try:
        import torch
    except ImportError:
        raise DeviceError("mha_kit.init needs torch (it loads on torch's current stream)") from None
    stream = torch.cuda.current_stream(index).cuda_stream
    _native.init(index, stream)


def device_errors(device=None, reset=False):
    """The device error words: ``{family: (count, flags)}``.

    Kernels count device data they had to skip or clamp (bad page ids,
    request indices, row offsets, slots) instead of reading out of bounds.
    Families: ``attention``, ``page_table``, ``graph_metadata``, ``kv_write``
    (flag bits: the kernel crates' ``ErrorFlags``). Synchronises the device.

    Args:
        device: ``int``, ``torch.device`` or ``None``.
        reset: zero the words after reading.
    """
    return _native.device_errors(_device_index(device), reset)


def module_sources(device=None):
    """``{module: "cubin sm_90" | "cubin sm_90a" | "ptx"}`` for the modules loaded so far."""
    return _native.module_sources(_device_index(device))


__all__ = [
    "DECODE_HEAD_DIMS",
    "DeviceError",
    "HAS_TORCH_OPS",
    "HEAD_DIMS",
    "InvalidArgument",
    "Q_MODE_CUMSUM",
    "Q_MODE_NONE",
    "Q_MODE_RAGGED_VERIFY",
    "Q_MODE_STRIDED",
    "TrtllmMhaBackend",
    "TrtllmMhaMultiStepDraftBackend",
    "WORKSPACE_COUNTER_BYTES",
    "backend",
    "build_trtllm_mha_page_table",
    "device_errors",
    "fused_fp8_set_kv_buffer",
    "gpu_available",
    "gpu_missing",
    "init",
    "merge_state",
    "merge_states",
    "module_sources",
    "set_kv_buffer",
    "trtllm_batch_context_with_kv_cache",
    "trtllm_batch_decode_with_kv_cache",
    "update_trtllm_mha_graph_metadata",
    "write_decode_unit_order",
]

"""The fingerprint of the machine and software this process runs on.

A tuned result is only valid where it was measured: another GPU, driver, CUDA, torch or Triton
(or kernelsmith) can change which kernel wins, so all of them go into the fingerprint, and every
stored record is keyed by its hash. Not all of them invalidate a result, though: a record of a
fingerprint that differs only in the driver build or the kernelsmith release is re-validated and
served (see :class:`~kernelsmith.db.records.Fingerprint` and :mod:`kernelsmith.tuner`). Results
from the Triton interpreter on the CPU get their own fingerprint (``mode="interpreter"``) so they
can never be served as GPU results.

This module must import, and the interpreter fingerprint must work, on machines without a GPU
or a CUDA driver; torch and triton are imported lazily so that opening a database stays cheap.
The GPU fingerprint is cached per process because it is looked up on the dispatch path.
"""

from __future__ import annotations

import ctypes
import functools
import logging

from kernelsmith import settings
from kernelsmith.db.records import Fingerprint

logger = logging.getLogger(__name__)

MODES = ("gpu", "interpreter")

def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return bool(torch.cuda.is_available())


def resolve_mode(mode: str | None = None) -> str:
    """``mode`` if given, else the mode this process runs kernels in.

    The interpreter is in use when ``TRITON_INTERPRET=1`` or ``KERNELSMITH_INTERPRET=1`` is set,
    or when there is no CUDA device at all; otherwise kernels run on the GPU.
    """
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"unknown fingerprint mode {mode!r}; expected one of {MODES}")
        return mode
    if settings.interpreter_requested():
        return "interpreter"
    return "gpu" if _cuda_available() else "interpreter"


def current_fingerprint(mode: str | None = None) -> Fingerprint:
    """The fingerprint of this process in ``mode`` (``"gpu"``, ``"interpreter"`` or auto).

    Raises RuntimeError for ``mode="gpu"`` when CUDA is unavailable.
    """
    resolved = resolve_mode(mode)
    if resolved == "interpreter":
        return _interpreter_fingerprint()
    return _gpu_fingerprint()


def _versions() -> tuple[str, str, str]:
    import torch
    import triton

    import kernelsmith

    return str(torch.__version__), str(triton.__version__), str(kernelsmith.__version__)


@functools.cache
def _interpreter_fingerprint() -> Fingerprint:
    torch_v, triton_v, ks_v = _versions()
    return Fingerprint(
        mode="interpreter",
        gpu_name="triton-interpreter",
        sm_count=0,
        compute_capability="cpu",
        driver="none",
        cuda="none",
        torch=torch_v,
        triton=triton_v,
        kernelsmith=ks_v,
    )


@functools.cache
def _gpu_fingerprint() -> Fingerprint:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("a GPU fingerprint was requested but CUDA is not available")
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    torch_v, triton_v, ks_v = _versions()
    fp = Fingerprint(
        mode="gpu",
        gpu_name=str(props.name),
        sm_count=int(props.multi_processor_count),
        compute_capability=f"{major}.{minor}",
        driver=driver_version(),
        cuda=str(torch.version.cuda or "none"),
        torch=torch_v,
        triton=triton_v,
        kernelsmith=ks_v,
    )
    logger.debug("GPU fingerprint %s: %s", fp.hash, fp.describe())
    return fp


def format_cuda_version(version: int) -> str:
    """CUDA's integer version form (``13000``, ``12080``) as ``"13.0"``, ``"12.8"``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def driver_version() -> str:
    """The driver build (``"580.159.04"``) and the CUDA version it supports (``"13.0"``).

    The build comes from NVML (nvidia-ml-py) when installed, since two builds that support the
    same CUDA version can still differ in their JIT compiler and scheduler; the CUDA version
    from ``cuDriverGetVersion`` in ``libcuda`` (needs no CUDA context). ``"unknown"`` when
    neither answers.
    """
    parts = [p for p in (_nvml_driver_build(), _libcuda_version()) if p]
    return " / CUDA ".join(parts) if parts else "unknown"


def _nvml_driver_build() -> str:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return ""
    try:
        pynvml.nvmlInit()
        try:
            build = pynvml.nvmlSystemGetDriverVersion()
            return build.decode() if isinstance(build, bytes) else str(build)
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # pynvml raises its own NVMLError hierarchy
        logger.debug("pynvml driver query failed: %s", e)
        return ""


def _libcuda_version() -> str:
    for lib in ("libcuda.so.1", "libcuda.so"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        try:
            out = ctypes.c_int(0)
            if cuda.cuDriverGetVersion(ctypes.byref(out)) == 0 and out.value > 0:
                return format_cuda_version(out.value)
        except (AttributeError, OSError) as e:
            logger.debug("cuDriverGetVersion via %s failed: %s", lib, e)
    return ""

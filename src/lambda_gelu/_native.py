"""The float32 and bfloat16 CPU kernels of ``_kernels.c``, built on first use with the system C compiler.

Why a C kernel: Inductor fuses λ-GELU into one loop per direction, but on CPU its loop still ran
1.2-1.3x slower than ``F.gelu``'s own tuned kernel on the shapes that matter, and a
call through ``torch.compile`` costs ~0.1-0.3 ms of guards. A plain C loop, auto-vectorized for
this CPU (``-march=native``) and parallelized with the OpenMP runtime PyTorch has already loaded,
does the same memory traffic as ``F.gelu`` and is called through ``ctypes`` in microseconds.

The build needs what ``torch.compile`` on CPU needs anyway: a C compiler with OpenMP (``$CC``,
default ``cc``). The library is cached by a hash of the source, the flags, the compiler and the CPU
in ``$LAMBDA_GELU_CACHE_DIR`` (default ``~/.cache/lambda_gelu``), so a process after the first
loads it in milliseconds. If the build or the load fails, :func:`library` returns None with the
reason in :func:`error`, and the caller uses the Inductor kernels instead.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ._compiled import layout

SOURCE = Path(__file__).with_name("_kernels.c")
SOURCES = (SOURCE, SOURCE.with_name("_kernels_body.h"))  # everything the build reads
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {  # entry point (without the dtype suffix) → argument types; see _kernels_body.h
    "forward_runs": [_P, _P, _P, _I64, _I64, _I64, _I32],
    "backward_runs": [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I32],
    "forward_last": [_P, _P, _P, _I64, _I64, _I32],
    "backward_last": [_P, _P, _P, _P, _P, _I64, _I64, _I32],
}
GRAIN = 1 << 15  # elements per thread below which another thread is not worth waking (ATen's grain)
_lib: ctypes.CDLL | None = None
_fns: dict[tuple[str, torch.dtype], Callable] = {}  # (entry point, dtype) → function, once loaded
_error: str | None = None


def _flags() -> list[str]:
    flags = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags.append("-mprefer-vector-width=512")  # the loops are compute-bound: use AVX-512 where it exists
    return flags


def _cpu_identity() -> str:
    try:  # -march=native: a library built on one CPU may not run on another sharing the cache
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor()


def _build(cc: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *_flags(), str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-800:]}")
        os.replace(tmp, out)  # atomic: concurrent first uses never load a half-written file
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it if needed; None if that is impossible here."""
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    try:
        cc = os.environ.get("CC", "cc")
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
        key = hashlib.sha256("\0".join([*(f.read_text() for f in SOURCES), " ".join(_flags()), version,
                                         _cpu_identity()])
                             .encode()).hexdigest()[:16]
        cache = Path(os.environ.get("LAMBDA_GELU_CACHE_DIR") or Path.home() / ".cache" / "lambda_gelu")
        path = cache / f"kernels-{key}.so"
        if not path.exists():
            _build(cc, path)
        lib = ctypes.CDLL(str(path))
        for dtype, sfx in _SUFFIX.items():
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(lib, f"lg_{name}_{sfx}")
                fn.argtypes = argtypes
                _fns[name, dtype] = fn
        _lib = lib
    except Exception as e:  # no compiler, no OpenMP, a read-only home...: the caller falls back
        _error = f"{type(e).__name__}: {e}"
        warnings.warn(f"lambda_gelu: building the C kernels failed ({_error}); using Inductor's kernels "
                      "instead (slower on CPU; LAMBDA_GELU_BACKEND=inductor silences this)", RuntimeWarning,
                      stacklevel=5)
    return _lib


@torch.compiler.assume_constant_result  # traced code asks once, at compile time
def available() -> bool:
    return library() is not None


def error() -> str | None:
    """Why the kernels are unavailable, or None (also before the first attempt)."""
    return _error


def supports(x: Tensor) -> bool:
    return x.dtype in _SUFFIX and x.device.type == "cpu"


def _threads(n: int) -> int:
    return max(1, min(torch.get_num_threads(), n // GRAIN))


def forward(x: Tensor, lam: Tensor) -> Tensor:
    library()  # loaded already when called through lambda_gelu; direct callers get it built here
    x = x.detach().contiguous()
    lamf = lam.detach().to(torch.float32).contiguous()
    y = torch.empty_like(x)
    outer, c, inner = layout(x, lam)
    nt = _threads(x.numel())
    if inner == 1:  # λ varies along the contiguous dimension
        _fns["forward_last", x.dtype](x.data_ptr(), y.data_ptr(), lamf.data_ptr(), outer, c, nt)
    else:
        _fns["forward_runs", x.dtype](x.data_ptr(), y.data_ptr(), lamf.data_ptr(), outer, c, inner, nt)
    return y


def backward(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool) -> tuple[Tensor, Tensor | None]:
    library()
    x = x.detach().contiguous()
    g = g.detach().to(x.dtype).contiguous()
    lamf = lam.detach().to(torch.float32).contiguous()
    gx = torch.empty_like(x)
    outer, c, inner = layout(x, lam)
    nt = _threads(x.numel())
    partial = torch.zeros(nt, c, dtype=torch.float64) if need_lam else None  # a row of sums per thread
    pp = partial.data_ptr() if need_lam else None
    if inner == 1:
        _fns["backward_last", x.dtype](g.data_ptr(), x.data_ptr(), gx.data_ptr(), lamf.data_ptr(), pp, outer, c, nt)
    else:
        _fns["backward_runs", x.dtype](g.data_ptr(), x.data_ptr(), gx.data_ptr(), lamf.data_ptr(), pp,
                                       outer, c, inner, nt)
    grad_lam = partial.sum(0).to(lam.dtype).reshape(lam.shape) if need_lam else None
    return gx, grad_lam


# The same kernels as custom operators, so that inside a user's torch.compile'd model Inductor calls
# them as they are instead of re-deriving λ-GELU from the eager formulas (which it fuses into its own,
# slower loop). Eager code calls the functions above directly: dispatch through an operator costs more.

@torch.library.custom_op("lambda_gelu::forward", mutates_args=())
def forward_op(x: Tensor, lam: Tensor) -> Tensor:
    return forward(x, lam)


@forward_op.register_fake
def _(x, lam):
    return x.new_empty(x.shape)


@torch.library.custom_op("lambda_gelu::backward", mutates_args=())
def backward_op(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool) -> tuple[Tensor, Tensor]:
    grad_x, grad_lam = backward(g, x, lam, need_lam)
    return grad_x, grad_lam if grad_lam is not None else lam.new_zeros(lam.shape)


@backward_op.register_fake
def _(g, x, lam, need_lam):
    return x.new_empty(x.shape), lam.new_empty(lam.shape)

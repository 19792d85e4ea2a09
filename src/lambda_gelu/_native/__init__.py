"""The CPU kernels written in C beside this file, built on first use with the system C compiler: the λ op's
(``op.c``), the sparse linear layer's (``sparse.c``), the sparse gated FFN's (``gated.c``, float32, int8 and 4-bit), the
screened argmax (``argmax.c``), the decoder's attention step (``decode.c``) and its whole token (``token.c``), one
shared library.

Why a C kernel: Inductor fuses λ-GELU into one loop per direction, but on CPU its loop still ran
1.2-1.3x slower than ``F.gelu``'s own tuned kernel on the shapes that matter, and a
call through ``torch.compile`` costs ~0.1-0.3 ms of guards. A plain C loop, auto-vectorized for
this CPU (``-march=native``) and parallelized with the OpenMP runtime PyTorch has already loaded,
does the same memory traffic as ``F.gelu`` and is called through ``ctypes`` in microseconds.

The int8 paths' sums (``int8.h``) are such loops too, of int16 products summed in int32: the compiler makes them
VNNI's ``vpdpwssd`` for an AVX-512 VNNI CPU, ``vpmaddwd`` on AVX-512 or AVX2 registers elsewhere, SSE2's ``pmaddwd`` in
the baseline build (the tests check each target's assembly). Written with AVX2 intrinsics, each beside the plain
loop it must agree with: the widening of int8 rows to float32, and the 4-bit rows' sums (``int4.h``: codes times
int8 by ``vpmaddubsw``, which no compiler made of the plain loop).

The instruction set is explicit: ``LAMBDA_GELU_CPU=native`` (the default) or ``baseline`` (the
architecture's baseline ISA, for a cache or an image shared by different CPUs). The two builds round
differently (fused multiply-adds, vector widths, summation order): both are tested against the
reference with tolerances derived from the arithmetic, never against one CPU's bits.

The build needs what ``torch.compile`` on CPU needs anyway: a C compiler with OpenMP (``$CC``,
default ``cc``). The library is cached by a hash of the source, the flags, the compiler and the CPU
(for a native build)
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

from ..core._compiled import layout

HERE = Path(__file__).parent
SOURCES = tuple(sorted([*HERE.glob("*.c"), *HERE.glob("*.h")]))  # all the build reads
UNITS = [str(f) for f in SOURCES if f.suffix == ".c"]
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
GATES = {"gelu": "", "silu": "silu_"}  # the gate Φ (λ-GELU) or σ (λ-SiLU): the entry points' infix
_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {  # entry point (without the dtype suffix) → argument types; see op_body.h
    "forward_runs": [_P, _P, _P, _I64, _I64, _I64, _I32],
    "backward_runs": [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I32],
    "forward_last": [_P, _P, _P, _I64, _I64, _I32],
    "backward_last": [_P, _P, _P, _P, _P, _I64, _I64, _I32],
}
GRAIN = 1 << 15  # elements per thread below which another thread is not worth waking (ATen's grain)
ISAS = ("native", "baseline")
_ARCH = platform.machine().lower()
_BASELINE_MARCH = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "armv8-a", "arm64": "armv8-a"}


def isa() -> str:
    """The instruction set the kernels are built for: ``LAMBDA_GELU_CPU`` = ``native`` (the default:
    ``-march=native``, every vector unit of this CPU) or ``baseline`` (the architecture's baseline,
    ``-march=x86-64`` / ``armv8-a``: slower, but the library runs on any CPU of the architecture)."""
    choice = os.environ.get("LAMBDA_GELU_CPU", "native")
    if choice not in ISAS:
        raise ValueError(f"LAMBDA_GELU_CPU={choice!r} is not one of {', '.join(ISAS)}")
    return choice


def _flags(target: str) -> list[str]:
    flags = ["-O3", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math"]
    if target == "native":
        flags.append("-march=native")
        if _ARCH in ("x86_64", "amd64"):
            flags.append("-mprefer-vector-width=512")  # the loops are compute-bound: use AVX-512 where it exists
    elif _ARCH in _BASELINE_MARCH:
        flags.append(f"-march={_BASELINE_MARCH[_ARCH]}")
    return flags


def _cpu_identity(target: str) -> str:
    if target != "native":  # a baseline build runs on any CPU of the architecture
        return _ARCH
    try:  # -march=native: a library built on one CPU may not run on another sharing the cache
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor()


def _build(cc: str, target: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *_flags(target), *UNITS, "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-800:]}")
        os.replace(tmp, out)  # atomic: concurrent first uses never load a half-written file
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class Kernels:
    """One build of the kernels for one instruction set, loaded; ``forward``/``backward`` call it."""

    def __init__(self, target: str):
        if target not in ISAS:
            raise ValueError(f"unknown instruction set {target!r}; choose one of {', '.join(ISAS)}")
        cc = os.environ.get("CC", "cc")
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
        key = hashlib.sha256("\0".join([*(f.read_text() for f in SOURCES), " ".join(_flags(target)), version,
                                         _cpu_identity(target)]).encode()).hexdigest()[:16]
        cache = Path(os.environ.get("LAMBDA_GELU_CACHE_DIR") or Path.home() / ".cache" / "lambda_gelu")
        path = cache / f"kernels-{target}-{key}.so"
        if not path.exists():
            _build(cc, target, path)
        self.target, self.path, self.lib = target, path, ctypes.CDLL(str(path))
        self.fns: dict[tuple[str, str, torch.dtype], Callable] = {}  # (entry point, gate, dtype) → function
        for dtype, sfx in _SUFFIX.items():
            for gate, infix in GATES.items():
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(self.lib, f"lg_{name}_{infix}{sfx}")
                    fn.argtypes = argtypes
                    self.fns[name, gate, dtype] = fn
        self.sparse_linear_f32 = self.lib.lg_sparse_linear_f32  # lambda_gelu.inference.sparse
        self.sparse_linear_f32.argtypes = [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _I32, _I64]
        self.sparse_linear_f32.restype = _I64
        self.sparse_gated_f32 = self.lib.lg_sparse_gated_f32  # lambda_gelu.inference.gated
        self.sparse_gated_f32.argtypes = [_P] * 7 + [_I64, _I64, _I64, _I64, _I64, _I64, _I32, _I64]
        self.sparse_gated_f32.restype = _I64
        self.sparse_gated_fused_f32 = self.lib.lg_sparse_gated_fused_f32
        self.sparse_gated_fused_f32.argtypes = [_P] * 9 + [_I64, _I64, _I64, _I64, _I64, _I64, _I32, _I32, _I64]
        self.sparse_gated_fused_f32.restype = _I64
        self.sparse_gated_i8 = self.lib.lg_sparse_gated_i8
        self.sparse_gated_i8.argtypes = [_P] * 12 + [_I64, _I64, _I64, _I64, _I64, _I32, _I32, _I64]
        self.sparse_gated_i8.restype = _I64
        self.sparse_gated_q4 = self.lib.lg_sparse_gated_q4
        self.sparse_gated_q4.argtypes = [_P] * 12 + [_I64] * 5 + [_I32, _I32, _I64]
        self.sparse_gated_q4.restype = _I64
        self.sparse_gated_screened_f32 = self.lib.lg_sparse_gated_screened_f32
        self.sparse_gated_screened_f32.argtypes = [_P] * 13 + [_I64, _I64, _I64, _I64, _I64, _I32, _I64]
        self.sparse_gated_screened_f32.restype = _I64
        self.screened_argmax_f32 = self.lib.lg_screened_argmax_f32  # lambda_gelu.inference.screened_argmax
        self.screened_argmax_f32.argtypes = [_P] * 7 + [_I64, _I64, _I32, _I64, _P]
        self.screened_argmax_f32.restype = _I64
        self.rms_norm_f32 = self.lib.lg_rms_norm_f32  # lambda_gelu.inference.decoder
        self.rms_norm_f32.argtypes, self.rms_norm_f32.restype = [_P, _P, _P, _I64, ctypes.c_double, _I32], None
        self.decode_attention_f32 = self.lib.lg_decode_attention_f32
        self.decode_attention_f32.argtypes = [_P] + [_P, ctypes.c_double, _I32] * 4 + [ctypes.c_double] + [
            _I32] * 3 + [_P] * 12 + [_I64] * 7 + [ctypes.c_double, ctypes.c_double, _I32]  # h, four norms' weight, eps,
        # plus_one: the layer's, q, k, post; then the values' norm's eps (< 0: none), whether the layer shares a cache,
        # whether its q and k norms span every head, whether they come after the rotation
        self.decode_attention_f32.restype = _I32
        self.exp_f32 = self.lib.lg_exp_f32  # the attention's softmax weights, for its tests
        self.exp_f32.argtypes, self.exp_f32.restype = [_P, _I64], None
        self.decode_tokens = self.lib.lg_decode_tokens  # lambda_gelu.inference.token_step: its structs' layout there
        self.decode_tokens.argtypes = [_P, _I64, _P, _I64, _P, _P, _I64, _I64, _I64, _P, ctypes.c_double, _I32, _P,
                                       _I32]
        self.decode_tokens.restype = _I32
        self.decode_next = self.lib.lg_decode_next  # the same, embedding and next token with it
        self.decode_next.argtypes = [_I64, _P, ctypes.c_double, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _P,
                                     ctypes.c_double, _I32, _P, _I32, _P, _P]
        self.decode_next.restype = _I64
        self.token_sizes = self.lib.lg_token_sizes
        self.token_sizes.argtypes, self.token_sizes.restype = [_P], None
        self.linear_i8 = self.lib.lg_linear_i8  # lambda_gelu.inference.int8.linear_i8: a prompt's int8 projections
        self.linear_i8.argtypes, self.linear_i8.restype = [_P] * 5 + [_I64] * 3 + [_I32, _I64], _I32
        self.active_union_f32 = self.lib.lg_active_union_f32
        self.active_union_f32.argtypes, self.active_union_f32.restype = [_P, _I64, _I64, _P], _I64

    def forward(self, x: Tensor, lam: Tensor, gate: str = "gelu") -> Tensor:
        x = x.detach().contiguous()
        lamf = lam.detach().to(torch.float32).contiguous()
        y = torch.empty_like(x)
        outer, c, inner = layout(x, lam)
        nt = _threads(x.numel())
        if inner == 1:  # λ varies along the contiguous dimension
            self.fns["forward_last", gate, x.dtype](x.data_ptr(), y.data_ptr(), lamf.data_ptr(), outer, c, nt)
        else:
            self.fns["forward_runs", gate, x.dtype](x.data_ptr(), y.data_ptr(), lamf.data_ptr(), outer, c, inner, nt)
        return y

    def backward(self, g: Tensor, x: Tensor, lam: Tensor, need_lam: bool,
                 gate: str = "gelu") -> tuple[Tensor, Tensor | None]:
        x = x.detach().contiguous()
        g = g.detach().to(x.dtype).contiguous()
        lamf = lam.detach().to(torch.float32).contiguous()
        gx = torch.empty_like(x)
        outer, c, inner = layout(x, lam)
        nt = _threads(x.numel())
        partial = torch.zeros(nt, c, dtype=torch.float64) if need_lam else None  # a row of sums per thread
        pp = partial.data_ptr() if need_lam else None
        if inner == 1:
            self.fns["backward_last", gate, x.dtype](g.data_ptr(), x.data_ptr(), gx.data_ptr(), lamf.data_ptr(), pp,
                                               outer, c, nt)
        else:
            self.fns["backward_runs", gate, x.dtype](g.data_ptr(), x.data_ptr(), gx.data_ptr(), lamf.data_ptr(), pp,
                                               outer, c, inner, nt)
        grad_lam = partial.sum(0).to(lam.dtype).reshape(lam.shape) if need_lam else None
        return gx, grad_lam


def pointer(t: Tensor | None) -> int | None:
    """A tensor's address as the kernels take it; None (NULL: no such input) for None."""
    return None if t is None else t.data_ptr()


def biases_fit(*layers: torch.nn.Linear) -> bool:
    """Whether the kernels can read each layer's bias as it is (none, or contiguous float32)."""
    return all(m.bias is None or m.bias.dtype is torch.float32 and m.bias.is_contiguous() for m in layers)


_kernels: Kernels | None = None
_error: str | None = None


def library() -> Kernels | None:
    """The kernels for :func:`isa`, building them if needed; None if that is impossible here."""
    global _kernels, _error
    if _kernels is not None or _error is not None:
        return _kernels
    try:
        _kernels = Kernels(isa())
    except Exception as e:  # no compiler, no OpenMP, a read-only home...: the caller falls back
        _error = f"{type(e).__name__}: {e}"
        warnings.warn(f"lambda_gelu: building the C kernels failed ({_error}); using Inductor's kernels "
                      "instead (slower on CPU; LAMBDA_GELU_BACKEND=inductor silences this)", RuntimeWarning,
                      stacklevel=5)
    return _kernels


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


def forward(x: Tensor, lam: Tensor, gate: str = "gelu") -> Tensor:
    return library().forward(x, lam, gate)  # loaded already when called through lambda_gelu


def backward(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool, gate: str = "gelu") -> tuple[Tensor, Tensor | None]:
    return library().backward(g, x, lam, need_lam, gate)


# The same kernels as custom operators, so that inside a user's torch.compile'd model Inductor calls
# them as they are instead of re-deriving λ-GELU from the eager formulas (which it fuses into its own,
# slower loop). Eager code calls the functions above directly: dispatch through an operator costs more.

@torch.library.custom_op("lambda_gelu::forward", mutates_args=())
def forward_op(x: Tensor, lam: Tensor, gate: str = "gelu") -> Tensor:
    return forward(x, lam, gate)


@forward_op.register_fake
def _(x, lam, gate="gelu"):
    return x.new_empty(x.shape)


@torch.library.custom_op("lambda_gelu::backward", mutates_args=())
def backward_op(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool, gate: str = "gelu") -> tuple[Tensor, Tensor]:
    grad_x, grad_lam = backward(g, x, lam, need_lam, gate)
    return grad_x, grad_lam if grad_lam is not None else lam.new_zeros(lam.shape)


@backward_op.register_fake
def _(g, x, lam, need_lam, gate="gelu"):
    return x.new_empty(x.shape), lam.new_empty(lam.shape)

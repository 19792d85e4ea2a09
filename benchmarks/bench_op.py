"""Op level: λ-GELU against native F.gelu, forward and forward+backward, side by side in one run.

    python benchmarks/bench_op.py [--threads 2] [--reps 15]

Prints ratios to native F.gelu (medians of interleaved repetitions) and saved-for-backward bytes,
and writes benchmarks/results/op.json (rendered into docs/performance.md by benchmarks/report.py).
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks

import lambda_gelu as lg
from _common import header, interleaved, positive_int, print_table, save

SHAPES = [  # (label, shape, dtype, channel_dim for per-channel λ or None)
    ("transformer MLP hidden", (8192, 3072), torch.float32, None),
    ("conv map", (256, 64, 32, 32), torch.float32, None),
    ("conv map, per-channel λ", (256, 64, 32, 32), torch.float32, 1),
    ("vector", (1 << 16,), torch.float32, None),
    ("transformer MLP hidden", (8192, 3072), torch.bfloat16, None),
]


def naive(x, lam):
    """What a user writes without this library: plain autograd over the formula."""
    return x * 0.5 * (1 + torch.erf(lam * x / math.sqrt(2)))


def variants(channel_dim):
    kw = {} if channel_dim is None else {"channel_dim": channel_dim}
    lam_view = (lambda l, x: l) if channel_dim is None else \
        (lambda l, x: l.view((-1,) + (1,) * (x.dim() - channel_dim % x.dim() - 1)))

    def eager(x, lam):
        with lg.backend("eager"):
            return lg.lambda_gelu(x, lam, **kw)

    def inductor(x, lam):
        with lg.backend("inductor"):
            return lg.lambda_gelu(x, lam, **kw)

    user_compiled = torch.compile(lambda x, lam: lg.lambda_gelu(x, lam, **kw), dynamic=False)
    return {
        "native F.gelu": lambda x, lam: F.gelu(x),
        "naive autograd": lambda x, lam: naive(x, lam_view(lam, x)),
        "ours, eager": eager,
        "ours, Inductor kernels": inductor,
        "ours, default": lambda x, lam: lg.lambda_gelu(x, lam, **kw),
        "ours, torch.compile": user_compiled,
    }


def saved_bytes(fn, x, lam) -> int:
    total = []
    with saved_tensors_hooks(lambda t: total.append(t.numel() * t.element_size()) or t, lambda t: t):
        fn(x, lam)
    return sum(total)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--reps", type=positive_int, default=15)
    p.add_argument("--quick", action="store_true", help="small shapes, few reps: a smoke test")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    head = header()
    results = []
    for label, shape, dtype, channel_dim in SHAPES:
        if args.quick:
            shape = tuple(max(1, s // 8) for s in shape)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=g).to(dtype)
        gy = torch.randn(shape, generator=g).to(dtype)
        lam = torch.tensor(2.0) if channel_dim is None else torch.full((shape[channel_dim],), 2.0)
        torch._dynamo.reset()  # each case compiles afresh: the first-call column includes it
        fns = variants(channel_dim)
        # first calls: compilation happens here, timed separately
        first = {}
        for name, fn in fns.items():
            xr, lr = x.clone().requires_grad_(), lam.clone().requires_grad_()
            t0 = time.perf_counter()
            fn(xr, lr).backward(gy)
            first[name] = time.perf_counter() - t0
        xr, lr = x.clone().requires_grad_(), lam.clone().requires_grad_()
        fwd = interleaved({n: (lambda fn=fn: fn(x, lam)) for n, fn in fns.items()}, 3 if args.quick else args.reps)

        def step(fn):
            xr.grad = lr.grad = None
            fn(xr, lr).backward(gy)
        fwdbwd = interleaved({n: (lambda fn=fn: step(fn)) for n, fn in fns.items()}, 3 if args.quick else args.reps)
        for name in fns:
            results.append({
                "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "label": label,
                "variant": name, "fwd_ms": 1e3 * fwd[name], "fwdbwd_ms": 1e3 * fwdbwd[name],
                "fwd_ratio": fwd[name] / fwd["native F.gelu"], "fwdbwd_ratio": fwdbwd[name] / fwdbwd["native F.gelu"],
                "saved_bytes": saved_bytes(fns[name], xr, lr), "first_call_s": first[name],
            })
    rows = [[f"{r['label']} {tuple(r['shape'])} {r['dtype']}", r["variant"], f"{r['fwd_ratio']:.2f}",
             f"{r['fwdbwd_ratio']:.2f}", f"{r['fwd_ms']:.1f}", f"{r['fwdbwd_ms']:.1f}",
             f"{r['saved_bytes'] / 2**20:.1f}", f"{r['first_call_s']:.1f}"] for r in results]
    print_table("λ-GELU op vs native F.gelu (ratio = time / native time, medians of interleaved reps)", head, rows,
                ["case", "variant", "fwd ×", "fwd+bwd ×", "fwd ms", "fwd+bwd ms", "saved MiB", "1st call s"])
    if not args.quick:
        print(save("op", {"header": head, "reps": args.reps, "results": results}))


if __name__ == "__main__":
    main()

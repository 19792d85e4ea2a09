"""The one-off cost of the fused kernels: first forward+backward in a fresh process with empty
caches (cold), and again with the caches that run left behind (warm) — for the C kernels (the
float32 default on CPU) and for Inductor's (half types, or backend "inductor").

    python benchmarks/bench_compile.py

Writes benchmarks/results/compile.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from _common import header, save

CHILD = r"""
import json, sys, time, torch
import lambda_gelu as lg
torch.set_num_threads(2)
lg.set_backend(sys.argv[1])
x = torch.randn(8192, 3072, requires_grad=True)
lam = torch.tensor(2.0, requires_grad=True)
t0 = time.perf_counter()
lg.lambda_gelu(x, lam).backward(torch.ones_like(x))
first = time.perf_counter() - t0
t0 = time.perf_counter()
lg.lambda_gelu(x, lam).backward(torch.ones_like(x))
print(json.dumps({"first_s": first, "second_s": time.perf_counter() - t0}))
"""


def main():
    rows = []
    for kernels, backend in (("C (float32 default)", "auto"), ("Inductor", "inductor")):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "LAMBDA_GELU_CACHE_DIR": cache}
            for label in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-c", CHILD, backend], env=env, capture_output=True, text=True,
                                     check=True)
                rows.append({"kernels": kernels, "cache": label, **json.loads(out.stdout.strip().splitlines()[-1])})
                print(f"{kernels}, {label}: first call {rows[-1]['first_s']:.1f} s, "
                      f"second {rows[-1]['second_s'] * 1e3:.0f} ms")
    print(save("compile", {"header": header(), "results": rows}))


if __name__ == "__main__":
    main()

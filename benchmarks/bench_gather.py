"""What this machine reads rows at when they are scattered, as a sparse FFN's active units are, against the same rows
read in order and against a 1 GiB read.

A sparsified FFN reads, for each token, every gate row in order and then the up and down rows of the units that fired:
blocks of a few hundred bytes (SmolLM2's int8 units 1,152, its 4-bit units 648), a third of them or fewer, scattered
over the layer. The decoding benchmark (``bench_llamacpp.py``) counts those bytes at the streaming bandwidth, so its
share of the bound assumes scattered blocks read as fast as a stream. This measures what they read at: the project's
sparse-input kernel (``lg_sparse_linear_f32``, which reads the float32 rows of the inputs that are non-zero, each
requested a few rows ahead, the threads splitting them) over rows of those sizes at several densities of non-zero
inputs, in a table of 300 MB (far beyond any last-level cache), in interleaved rounds on the same threads.

    python benchmarks/bench_gather.py
"""
from __future__ import annotations

import argparse
import statistics

import torch

from _common import bandwidth, header, positive_int, print_table, save
from lambda_gelu import _native
from lambda_gelu.timing import time_interleaved

ROW_BYTES = (1152, 648)  # SmolLM2's units: int8 up and down rows; 4-bit ones with their step and offset codes
DENSITIES = (1.0, 0.6, 0.35, 0.15)  # every row (in order), and a sparse FFN's shares of units active
TABLE_BYTES = 300 * 2 ** 20


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=7)
    args = p.parse_args()
    kernels = _native.library()
    if kernels is None:
        raise SystemExit("bench_gather.py needs the C kernels (a C compiler): none here")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    calls, read = {}, {}
    for row_bytes in ROW_BYTES:
        width = row_bytes // 4
        rows = TABLE_BYTES // row_bytes
        table = torch.ones(rows, width)
        y = torch.empty(1, width)
        for density in DENSITIES:
            x = (torch.rand(1, rows, generator=generator) < density).float()
            name = f"{row_bytes} B rows, {density:.0%}"
            calls[name] = (lambda x=x, table=table, y=y, rows=rows, width=width: kernels.sparse_linear_f32(
                x.data_ptr(), table.data_ptr(), None, y.data_ptr(), 1, rows, width, rows, args.threads, _native.GRAIN))
            read[name] = (row_bytes, density, int(x.sum()) * row_bytes)
    times = time_interleaved(calls, args.rounds)
    bw = bandwidth(args.threads)
    results = []
    for name, (row_bytes, density, nbytes) in read.items():
        gbs = nbytes / statistics.median(times[name]) / 1e9
        results.append({"row_bytes": row_bytes, "density": density, "bytes": nbytes, "gb_per_s": gbs,
                        "share_of_bandwidth": gbs * 1e9 / bw})
    head = header()
    save("gather", {"header": head, "bandwidth": bw, "rounds": args.rounds, "table_bytes": TABLE_BYTES,
                    "results": results})
    print_table(f"rows read by the sparse-input kernel, {TABLE_BYTES // 2 ** 20} MB table, {args.rounds} rounds; "
                f"a 1 GiB read: {bw / 1e9:.1f} GB/s", head,
                [[r["row_bytes"], f"{r['density']:.0%}", f"{r['gb_per_s']:.1f}", f"{r['share_of_bandwidth']:.0%}"]
                 for r in results], ["row bytes", "rows read", "GB/s", "of the 1 GiB read"])


if __name__ == "__main__":
    main()

"""The least-squares refit of `lambda-gelu reluize` on a model, as it runs against what it did: each batch's forward
paused at one activation and resumed to the next (``PausedForwards``) against each batch run again from the start for
every activation (``RestartedForwards``, the reference), and each layer solved by Cholesky (``ridge_solve``) against an
SVD least squares (gelsd), on the CLI's first training batches. Both refits are checked equal bit for bit.

    python benchmarks/bench_refit.py                        # SmolLM2-135M-Instruct, the offline LLM
    python benchmarks/bench_refit.py --model DIR --batches 4

A refit changes the model, so each round refits a fresh copy: the variants are timed in interleaved rounds.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from _common import header, positive_int, print_table, save


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model directory, GGUF file or offline name")
    p.add_argument("--batches", type=positive_int, default=4, help="training batches the refit runs over")
    p.add_argument("--rounds", type=positive_int, default=2)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lambda_gelu.hf import ConversionConfig
    from lambda_gelu.hf.load import load, model_directory, quiet_transformers
    from lambda_gelu.hf.text import corpus
    from lambda_gelu.reluize.capture import PausedForwards, RestartedForwards
    from lambda_gelu.reluize.refit import layer_sides, ridge_solve, refit_consumers, swap_and_refit

    quiet_transformers()
    loaded = load(model_directory(args.model), args.model)
    defaults = ConversionConfig()
    text = corpus(loaded.tokenizer, seed=defaults.seed, batch_size=defaults.batch_size,
                  max_tokens=defaults.max_tokens, batching=defaults.batching)
    batches = list(text.batches(args.batches))
    consumers = refit_consumers(loaded.model, batches[0])
    times, models = {"paused": [], "restarted": []}, {}
    for _ in range(args.rounds):
        for name, forwards in (("paused", PausedForwards), ("restarted", RestartedForwards)):
            model = copy.deepcopy(loaded.model)
            t = time.perf_counter()
            swap_and_refit(model, batches, defaults.reluize.ridge, consumers, forwards=forwards)
            times[name].append(time.perf_counter() - t)
            models[name] = model
    equal = all(torch.equal(a, b) for a, b in zip(models["paused"].state_dict().values(),
                                                  models["restarted"].state_dict().values()))
    layers = [loaded.model.get_submodule(n) for names in consumers.values() for n in names]
    inputs, outputs = max(layer_sides(layer) for layer in layers)  # the widest layer, as the CLI's estimate
    inputs += 1  # the bias's column
    x = torch.randn(4 * inputs, inputs, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gram, rhs = x.T @ x, torch.randn(inputs, outputs, dtype=torch.float64)
    gram += defaults.reluize.ridge * gram.diagonal().mean() * torch.eye(inputs, dtype=torch.float64)
    solves, solutions = {"cholesky": [], "gelsd": []}, {}
    for _ in range(3):
        for name, solve in (("cholesky", lambda: ridge_solve(gram, rhs)),
                            ("gelsd", lambda: torch.linalg.lstsq(gram, rhs, driver="gelsd").solution)):
            t = time.perf_counter()
            solutions[name] = solve()
            solves[name].append(time.perf_counter() - t)
    gap = ((solutions["cholesky"] - solutions["gelsd"]).norm() / solutions["gelsd"].norm()).item()
    seconds = {k: statistics.median(v) for k, v in {**times, **solves}.items()}
    d = {"header": header(), "model": args.model, "batches": args.batches, "rounds": args.rounds,
         "layers": len(layers), "shape": [inputs, outputs], "seconds": seconds, "equal": equal,
         "solve_gap": gap, "tokens": sum(int(b["attention_mask"].sum()) for b in batches)}
    print_table(f"the refit of {args.model} over {args.batches} batches ({d['tokens']} tokens), {d['layers']} "
                "layers", d["header"],
                [["refit, paused forwards", f"{seconds['paused']:.1f}", ""],
                 ["refit, restarted forwards", f"{seconds['restarted']:.1f}", ""],
                 [f"one layer's solve {inputs}x{inputs}, {outputs} columns: Cholesky", f"{seconds['cholesky']:.3f}",
                  ""],
                 ["the same by gelsd", f"{seconds['gelsd']:.3f}", f"relative gap {gap:.1e}"]],
                ["variant", "seconds", ""])
    print(f"the two refits equal bit for bit: {equal}")
    print(f"saved {save('refit', d)}")


if __name__ == "__main__":
    main()

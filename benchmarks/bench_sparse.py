"""Activation sparsity as speed: dense PyTorch against lambda_gelu.inference.sparse, measured side by side.

    python benchmarks/bench_sparse.py [--threads 2] [--reps 50] [--quick]

1. An FFN 768 → 3072 → ReLU → 768 (a BERT/GPT-2-base block's MLP) at 50/80/90/95% zeros in its hidden
   activations and batch 1/4/16: the whole FFN dense, and with its second projection sparsified. The
   zeros are set by the first layer's bias (per unit, independent across inputs — the worst case for
   a batch's union of active units; trained networks share their active units more). And its first
   projection and ReLU alone, timed in the same rounds: the dense FFN's time over theirs is what the
   FFN would gain were the second projection free (Amdahl), the most any sparse kernel can give it.
2. One layer alone at 90% zeros, dense vs forced sparse, from 384 → 96 to 3072 → 768 weights, batch
   1/4/16: where the sparse path's fixed cost per call stops outweighing its saving, the measurement
   behind lambda_gelu.inference.sparse.MIN_WEIGHTS (smaller layers stay dense unless min_weights=0).
3. The lab's stdlib-gpt, trained with the lambda-harden arm and substituted to exact ReLU, generating
   bytes greedily, bytes per second dense vs sparsified (forced, min_weights=0: its 384 → 96 FFN
   projections are under MIN_WEIGHTS, so by default sparsify_ leaves them dense), and the fraction of
   zeros its FFNs see: with its whole 64-byte context re-read per byte (64 rows per FFN call, a wide union of active units), and
   as a decoder with a key-value cache (a 16-byte prompt, then one row per call, 48 new bytes); and
   the share of the dense generation's time spent in the layers sparsify_ replaces, which bounds what
   any sparse kernel can gain there.
4. For reference, the same FFN as a static int8 ONNX Runtime graph (QGemm, calibrated on the case's
   inputs, the same thread count), timed in the same interleaved rounds: the other road to speed a
   ReLU network opens. Skipped without the [deploy] extra.
Writes benchmarks/results/sparse.json.
"""
from __future__ import annotations

import argparse
import copy
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

from _common import header, interleaved, positive_int, print_table, save
from lambda_gelu.inference.sparse import MIN_WEIGHTS, SparseLinear, active_inputs, sparsify_


def int8_runner(model: nn.Module, x: torch.Tensor, workdir: Path, threads: int):
    """``model`` as a static int8 ONNX Runtime graph calibrated on 8 batches like ``x``; None without
    the [deploy] extra."""
    try:
        from lambda_gelu.deploy import onnx as deploy
        deploy._onnx()
    except ImportError:
        return None
    fp32, int8 = workdir / "ffn.onnx", workdir / "ffn.int8.onnx"
    deploy.export_onnx(model, x, fp32)
    g = torch.Generator().manual_seed(1)
    logging.getLogger().setLevel(logging.ERROR)  # ONNX Runtime's advice to pre-process, once per case
    deploy.quantize_int8(fp32, int8, [torch.randn(*x.shape, generator=g).numpy() for _ in range(8)])
    runner, xs = deploy.OnnxRunner(int8, threads=threads), x.numpy()
    return lambda: runner(xs)


def ffn_cases(reps: int, quick: bool, threads: int) -> list[dict]:
    d, h = (192, 768) if quick else (768, 3072)
    out = []
    workdir = Path(tempfile.mkdtemp(prefix="bench_sparse_"))
    for zeros in (0.5, 0.8, 0.9, 0.95):
        for batch in (1, 4, 16):
            torch.manual_seed(0)
            dense = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d)).eval()
            x = torch.randn(batch, d)
            with torch.no_grad():  # bias each unit so that a `zeros` fraction of its pre-activations is < 0
                pre = dense[0](torch.randn(4096, d)) - dense[0].bias
                dense[0].bias.copy_(-pre.quantile(zeros, dim=0))
            sparse = copy.deepcopy(dense)
            sparsify_(sparse, max_density=1.0)  # always sparse: the ratio shows where it pays
            int8 = int8_runner(dense, x, workdir, threads)
            with torch.inference_mode():
                hidden = dense[1](dense[0](x))
                measured = (hidden == 0).double().mean().item()
                union = active_inputs(hidden).numel() / h
                t = interleaved({"dense": lambda: dense(x), "sparse": lambda: sparse(x),
                                 "first": lambda: dense[1](dense[0](x)), **({"int8": int8} if int8 else {})}, reps)
            out.append({"zeros": zeros, "batch": batch, "measured_zeros": measured, "union_active": union,
                        "dense_ms": t["dense"] * 1e3, "sparse_ms": t["sparse"] * 1e3,
                        "speedup": t["dense"] / t["sparse"], "first_ms": t["first"] * 1e3,
                        "bound": t["dense"] / t["first"],
                        **({"int8_ms": t["int8"] * 1e3, "int8_speedup": t["dense"] / t["int8"]} if int8 else {})})
    return out


LAYER_SIZES = [(384, 96), (384, 384), (512, 512), (768, 384), (1536, 384), (3072, 768)]  # (in, out)


def layer_sizes(reps: int, quick: bool) -> list[dict]:
    """One layer alone, dense against forced sparse, at 90% zeros (independent per input) and batch 1/4/16,
    over layer sizes: where the sparse path's fixed cost per call stops outweighing its saving (the
    library's MIN_WEIGHTS)."""
    out = []
    for n_in, n_out in LAYER_SIZES[:3] if quick else LAYER_SIZES:
        for batch in (1, 4, 16):
            torch.manual_seed(0)
            dense = nn.Linear(n_in, n_out).eval()
            sparse = SparseLinear.from_dense(dense, max_density=1.0)
            x = torch.randn(batch, n_in).abs() * (torch.rand(batch, n_in) >= 0.9)
            with torch.inference_mode():
                t = interleaved({"dense": lambda: dense(x), "sparse": lambda: sparse(x)}, reps * 4)
            out.append({"in": n_in, "out": n_out, "weights": n_in * n_out, "batch": batch,
                        "dense_us": t["dense"] * 1e6, "sparse_us": t["sparse"] * 1e6, "speedup": t["dense"] / t["sparse"]})
    return out


def time_share(model: nn.Module, names: list[str], run, reps: int = 5) -> float:
    """The fraction of ``run()``'s time spent inside the modules ``names`` of ``model`` (timed by forward
    hooks; median of ``reps``): the most that making those modules free could save (Amdahl)."""
    modules = dict(model.named_modules())
    start, shares = {}, []
    spent = [0.0]

    def enter(mod, args):
        start[mod] = time.perf_counter()

    def leave(mod, args, out):
        spent[0] += time.perf_counter() - start[mod]

    handles = [h for n in names for h in (modules[n].register_forward_pre_hook(enter),
                                           modules[n].register_forward_hook(leave))]
    for _ in range(reps):
        spent[0] = 0.0
        t0 = time.perf_counter()
        run()
        shares.append(spent[0] / (time.perf_counter() - t0))
    for h in handles:
        h.remove()
    return statistics.median(shares)


CACHED_PROMPT = 16  # bytes of prompt before the cached decoder generates


def generation(reps: int, quick: bool) -> dict:
    from lambda_gelu_lab.config import RunConfig
    from lambda_gelu_lab.tasks import TASKS
    from lambda_gelu_lab.train import build_model, relu_ize_, train_run

    task = TASKS["stdlib-gpt"]
    splits = task.load(None)
    cfg = RunConfig(task="stdlib-gpt", arm="lambda-harden", **{**task.defaults, **({"train_limit": 2000} if quick else {})})
    run = train_run(task, splits, cfg)
    model = build_model(task, splits, cfg)
    model.load_state_dict(run.state_dict)
    relu_ize_(model)
    model.eval()
    try:
        default = sparsify_(copy.deepcopy(model))
    except ValueError:  # every FFN projection is under MIN_WEIGHTS: the default leaves the model dense
        default = []
    sparse = copy.deepcopy(model)
    replaced = sparsify_(sparse, min_weights=0)  # forced: what the sparse path would do at this size
    prompt = splits.x_test[:1]
    new = 16 if quick else 64
    zeros = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: zeros.append((args[0] == 0).double().mean().item()))
             for m in sparse.modules() if isinstance(m, SparseLinear)]

    def generate(m):
        ctx = prompt.clone()
        for _ in range(new):
            nxt = m(ctx[:, -prompt.shape[1]:])[:, -1].argmax(-1, keepdim=True)
            ctx = torch.cat([ctx, nxt], 1)
        return ctx

    cached_new = prompt.shape[1] - CACHED_PROMPT  # the cache holds at most the model's 64 positions

    def generate_cached(m):  # one new byte per call: the FFNs see one row each
        seq = [prompt[:, :CACHED_PROMPT]]
        out = m.gpt(input_ids=seq[0], use_cache=True)
        for _ in range(cached_new):
            seq.append(out.logits[:, -1].argmax(-1, keepdim=True))
            if len(seq) <= cached_new:
                out = m.gpt(input_ids=seq[-1], past_key_values=out.past_key_values, use_cache=True)
        return torch.cat(seq, 1)

    with torch.inference_mode():
        same = torch.equal(generate(model), generate(sparse))
        re_read = sum(zeros) / len(zeros)
        zeros.clear()
        same_cached = torch.equal(generate_cached(model), generate_cached(sparse))
        cached_zeros = sum(zeros) / len(zeros)
        for h in hooks:
            h.remove()
        share = time_share(model, replaced, lambda: generate(model))
        share_cached = time_share(model, replaced, lambda: generate_cached(model))
        t = interleaved({"dense": lambda: generate(model), "sparse": lambda: generate(sparse),
                         "dense_cached": lambda: generate_cached(model), "sparse_cached": lambda: generate_cached(sparse)},
                        max(3, reps // 10))
    return {"layers": replaced, "default_layers": default, "zeros": re_read, "same_bytes": same, "new_bytes": new,
            "dense_bytes_per_s": new / t["dense"], "sparse_bytes_per_s": new / t["sparse"],
            "speedup": t["dense"] / t["sparse"], "relu_test_acc": run.metrics["sub_test_acc"], "dense_share": share,
            "cached": {"zeros": cached_zeros, "same_bytes": same_cached, "new_bytes": cached_new,
                       "dense_bytes_per_s": cached_new / t["dense_cached"],
                       "sparse_bytes_per_s": cached_new / t["sparse_cached"],
                       "speedup": t["dense_cached"] / t["sparse_cached"], "dense_share": share_cached}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--reps", type=positive_int, default=50)
    ap.add_argument("--quick", action="store_true", help="small shapes and a short training: a smoke run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head = header()
    ffn = ffn_cases(args.reps, args.quick, args.threads)
    print_table("FFN 768-3072-768: dense vs second projection sparsified (and int8 ONNX Runtime for reference)", head,
                [[f"{r['zeros']:.0%}", r["batch"], f"{r['measured_zeros']:.3f}", f"{r['union_active']:.3f}",
                  f"{r['dense_ms']:.3f}", f"{r['sparse_ms']:.3f}", f"{r['speedup']:.2f}",
                  f"{r['bound']:.2f}", f"{r['int8_speedup']:.2f}" if "int8_speedup" in r else "—"]
                 for r in ffn],
                ["zeros", "batch", "measured zeros", "union active", "dense ms", "sparse ms", "× dense",
                 "bound (second free)", "int8 ORT × dense"])
    sizes = layer_sizes(args.reps, args.quick)
    print_table("One layer at 90% zeros: dense vs forced sparse, by size (the library's MIN_WEIGHTS "
                f"= {MIN_WEIGHTS} weights)", head,
                [[f"{r['in']} → {r['out']}", r["weights"], r["batch"], f"{r['dense_us']:.1f}", f"{r['sparse_us']:.1f}",
                  f"{r['speedup']:.2f}"] for r in sizes],
                ["layer", "weights", "batch", "dense µs", "sparse µs", "× dense"])
    gen = generation(args.reps, args.quick)
    print(f"stdlib-gpt greedy generation: {gen['speedup']:.2f}× dense ({gen['sparse_bytes_per_s']:.0f} vs "
          f"{gen['dense_bytes_per_s']:.0f} bytes/s), FFN input zeros {gen['zeros']:.3f}, same bytes: {gen['same_bytes']}; "
          f"the replaced layers take {gen['dense_share']:.1%} of the dense time")
    c = gen["cached"]
    print(f"  with a key-value cache (one row per call): {c['speedup']:.2f}× dense ({c['sparse_bytes_per_s']:.0f} vs "
          f"{c['dense_bytes_per_s']:.0f} bytes/s), FFN input zeros {c['zeros']:.3f}, same bytes: {c['same_bytes']}; "
          f"the replaced layers take {c['dense_share']:.1%} of the dense time")
    print(save("sparse", {"header": head, "reps": args.reps, "quick": args.quick, "ffn": ffn, "sizes": sizes,
                          "min_weights": MIN_WEIGHTS, "generation": gen}))


if __name__ == "__main__":
    main()

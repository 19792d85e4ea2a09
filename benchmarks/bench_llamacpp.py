"""Decoding at batch 1 against llama.cpp, on the same CPU, in the same run: llama.cpp (llama-cpp-python) on the
original model at F32, F16, Q8_0, Q4_0 and Q4_1, the project's decoder (LeanDecoder) on the converted model at each
precision it offers (float32 dense and sparse; sparse int8; sparse 4-bit FFNs with int8 attention), and llama.cpp on
the converted model as `lambda-gelu export` writes it (F32, Q8_0, Q4_0, Q4_1); plus each variant's bytes read per token
and the machine's measured memory bandwidth, so that every figure also reads as a share of its own physical bound.

    lambda-gelu reluize smollm2-135m-instruct --out runs/smollm2-relu          # 30 minutes
    pip install 'lambda-gelu[llamacpp]'                                          # builds llama.cpp: ~8 minutes
    python benchmarks/bench_llamacpp.py --model runs/smollm2-relu

The original is the GGUF file the conversion read (its report's source), or ``--original FILE``; llama.cpp's own
quantizer writes it at each type (from that file's weights: a Q4_1 original's F32 is its Q4_1 weights widened, which
changes nothing of the time). Every variant decodes the same prompt's token ids greedily for ``--new-tokens`` tokens
on ``--threads`` threads; llama.cpp in a Python loop around ``Llama.eval`` (the argmax of its logits each token),
LeanDecoder by its ``generate``. A round times each variant once, in a rotating order; the figures are medians over
the rounds, decoding only (the prompt's forward left out: LeanDecoder's ``generate`` of ``new_tokens + 1`` tokens is
timed from its first token to its end by a streamer); the time to the first token (the prompt's forward and that
token's argmax) is reported beside them. Tokens are compared with each decoder's own reference: llama.cpp's on the
original with its F32 original's, ours and the exports with the converted model's dense float32 (the ReLU model's). The
perplexities: each decoder against its own float32, the exports against the converted model in float32. The original
SmolLM2 is itself a Q4_1 file, so llama.cpp's Q4_1 of it re-rounds weights already on that grid; the export writes
the converted model's Q4_1 on grids through 0, which do not give the fine-tuned weights back to the source's.

Bytes per token: what a token's decoding must read at least — every weight it uses once (llama.cpp: each tensor of
the file at its type, the tied embedding read whole as the output layer; ours: the weights at their precision, of a
sparse FFN only the gate rows its int8 screen leaves and the up and down rows of active units, the output layer's int8
screen and its few float rows) and the KV cache. The bandwidth is a sum over a 1 GiB tensor on the same threads, timed
once a round in the rotation beside the decoders, so that it meets the host's load as they do: each variant's share
of its bound is given against the best of those reads and against their median (the decoders' figures are medians).
Where a variant's bytes fit in the CPU's last-level cache, the DRAM bound is not its bound.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import converted, header, positive_int, print_table, save

PROMPT = "The standard library of Python provides modules for reading files, talking to networks and"
LONG_PROMPT = argparse.__file__  # a longer prompt's text: the standard library's argparse module, on every machine
TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
READ = "a 1 GiB read"  # the bandwidth, timed in the rounds beside the decoders
EXPORTS = ("F32", "Q8_0", "Q4_0", "Q4_1")  # the converted model as `lambda-gelu export` writes it, run by llama.cpp


def requantized(source: Path, kind: str, work: Path) -> Path:
    """``source`` written by llama.cpp's quantizer at ``kind``, kept in ``work`` under the source's name: a file made
    from another original is never taken for this one's."""
    import llama_cpp
    out = work / f"{source.stem}-{kind.lower()}.gguf"
    if out.exists():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_ALL_F32" if kind == "F32" else f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.allow_requantize = True
    params.nthread = 2
    part = out.with_name(out.name + ".part")  # a file cut short is not taken for a whole one next time
    if llama_cpp.llama_model_quantize(str(source).encode(), str(part).encode(), params) != 0:
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama.cpp could not write {source} as {kind}")
    part.replace(out)
    return out


def gguf_bytes(path: Path) -> dict[str, int]:
    """Bytes of each tensor of a GGUF file, as stored."""
    from gguf import GGUFReader
    return {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}


def llama_bytes(tensors: dict[str, int]) -> int:
    """A token's reads: every tensor but the token embedding's table, of which one row — unless the embedding is also
    the output layer (no ``output`` tensor), which reads it whole."""
    embedding = tensors.get("token_embd.weight", 0)
    rest = sum(v for k, v in tensors.items() if k != "token_embd.weight")
    return rest + (embedding if "output.weight" not in tensors else 0)


class LlamaCpp:
    """One GGUF file in llama.cpp, decoding greedily from a prompt of token ids."""

    def __init__(self, path: Path, threads: int, context: int = 512):
        from lambda_gelu.deploy.gguf import llama_cpp_model
        self.llm = llama_cpp_model(path, max(512, context), threads)  # its plain CPU kernels (no AMX buffers)
        self.vocab = self.llm.n_vocab()

    def decode(self, prompt: list[int], n: int) -> tuple[list[int], float, float]:
        """``n`` greedy tokens after ``prompt``, the seconds they took (the prompt's forward not counted) and the
        seconds to the first one (the prompt's forward and that token's argmax)."""
        llm = self.llm
        llm.reset()
        tokens, t = [], time.perf_counter()
        llm.eval(prompt)
        first = None
        for _ in range(n):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(self.vocab,))
            token = int(logits.argmax())
            if first is None:
                first, t = time.perf_counter() - t, time.perf_counter()
            tokens.append(token)
            llm.eval([token])
        return tokens, time.perf_counter() - t, first


class Ours:
    """A converted model decoded by LeanDecoder."""

    def __init__(self, model, max_length: int, int8: bool = False):
        from lambda_gelu.inference.decoder import LeanDecoder
        self.decoder = LeanDecoder(model, max_length=max_length, int8_attention=int8)

    @torch.inference_mode()
    def decode(self, prompt: list[int], n: int) -> tuple[list[int], float, float]:
        """As :meth:`LlamaCpp.decode`, in one ``generate`` of ``n + 1`` tokens: its streamer stamps the first token
        (the prompt's forward and its argmax) and the end, so the ``n`` tokens between are timed as llama.cpp's are."""
        stamps = Stamps()
        t = time.perf_counter()
        out = self.decoder.generate(torch.tensor([prompt]), n + 1, streamer=stamps)
        return out[0, len(prompt):len(prompt) + n].tolist(), stamps.done - stamps.first, stamps.first - t


class Stamps:
    """A streamer that notes when the first new token came (the prompt is its first put) and when decoding ended."""

    def __init__(self):
        self.puts, self.first, self.done = 0, None, None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self):
        self.done = time.perf_counter()


@torch.inference_mode()
def ffn_reads(model, sparse, prompt: list[int], tokens: list[int]) -> dict[str, float]:
    """Per decoded token, averaged over the layers: the share of gate rows the int8 screen leaves to read in
    float32 and the share of units active (whose up and down rows are read), from each FFN's inputs while decoding."""
    from lambda_gelu.inference.gated import screened_in
    captured = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, args, i=i: captured.append((i, args[0].detach().clone())))
             for i, layer in enumerate(sparse.model.layers)]
    try:
        sparse(torch.tensor([prompt + tokens]))
    finally:
        for h in hooks:
            h.remove()
    left = active = total = 0
    for i, x in captured:
        m = sparse.model.layers[i].mlp
        x = x.reshape(-1, x.shape[-1])[len(prompt):]
        pre = x.double() @ m.gate_proj.weight.double().t()
        if m.gate_proj.bias is not None:
            pre = pre + m.gate_proj.bias.double()
        left += int(screened_in(m, x).sum())
        active += int((pre > 0).sum())
        total += pre.numel()
    return {"gate_rows_read": left / total, "active": active / total}


def held_out(tokenizer, n: int, max_tokens: int = 64) -> list[list[int]]:
    """``n`` held-out sentences of the standard library's docstrings (files never trained on), as token ids with the
    tokenizer's own BOS where it adds one, at most ``max_tokens`` each."""
    from lambda_gelu.hf import stdlib_sentences
    _, held = stdlib_sentences()
    step = max(1, len(held) // n)
    return [tokenizer(s)["input_ids"][:max_tokens] for s in held[::step][:n]]


@torch.inference_mode()
def torch_nll(model, sentences: list[list[int]]) -> tuple[float, int]:
    """Summed next-token negative log-likelihood of ``sentences`` under ``model``, and the tokens scored."""
    total, count = 0.0, 0
    for ids in sentences:
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
        total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum"))
        count += len(ids) - 1
    return total, count


def llama_nll(path: Path, threads: int, sentences: list[list[int]]) -> tuple[float, int]:
    """The same under llama.cpp, from every position's logits of each sentence."""
    from lambda_gelu.deploy.gguf import llama_cpp_model
    llm = llama_cpp_model(path, 256, threads, logits_all=True)
    total, count = 0.0, 0
    for ids in sentences:
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[:len(ids) - 1], dtype=np.float64)
        logits -= logits.max(1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        total -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return total, count


def int8_weights(model):
    """A copy of ``model`` with the weights its int8 path reads — the attention's projections and the gated FFNs'
    three matrices — replaced by their int8 rows dequantized (quantize_rows of each layer's weight, down's rows its
    outputs, as the int8 block holds them: a test checks it): its quality, computed in float32 (the int8 path also
    rounds each input to 16 bits, which changes far less)."""
    from lambda_gelu.inference.int8 import quantize_rows
    copy8 = copy.deepcopy(model)
    with torch.no_grad():
        for layer in copy8.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                q, scale = quantize_rows(linear.weight)
                linear.weight.copy_(q.float() * scale[:, None])
    return copy8


def int4_weights(model):
    """A copy of ``model`` as its 4-bit path computes: the attention's projections int8 rows dequantized (as in
    :func:`int8_weights`), the gated FFNs the 4-bit blocks themselves (``sparsify_(int4=True)``: their kernels, their
    inputs rounded to int8)."""
    from lambda_gelu.inference.sparse import sparsify_
    copy4 = int8_weights(model)
    with torch.no_grad():
        for layer, source in zip(copy4.model.layers, model.model.layers):
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(layer.mlp, name).weight.copy_(getattr(source.mlp, name).weight)
    sparsify_(copy4, int4=True)
    return copy4


def our_bytes(model, reads: dict | None, weight_bytes: int, positions: float, ffn_bytes: float | None = None) -> int:
    """A token's reads for the converted model: the attention's projections at ``weight_bytes`` a weight (int8 rows
    and their scales, or float32), the FFNs dense or as ``reads`` says (at ``ffn_bytes`` a weight if given: the 4-bit
    rows' 4.5 bits), the output layer through its int8 screen (a byte a weight, a few float32 rows), and the float32
    KV cache over ``positions``."""
    cfg = model.config
    d, ff, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    attention = (d * heads * hd * 2 + d * kv * hd * 2) * weight_bytes
    if reads is None:
        ffn = 3 * d * ff * weight_bytes
    elif ffn_bytes is not None:
        ffn = (1 + 2 * reads["active"]) * d * ff * ffn_bytes
    else:
        screen = d * ff  # int8 gate rows
        gate = reads["gate_rows_read"] * d * ff * weight_bytes if weight_bytes == 4 else d * ff * weight_bytes
        ffn = (screen if weight_bytes == 4 else 0) + gate + 2 * reads["active"] * d * ff * weight_bytes
    head = cfg.vocab_size * d  # int8 screen
    cache = layers * 2 * kv * hd * positions * 4
    return int(layers * (attention + ffn) + head + cache)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=converted,
                   help="a checkpoint written by `lambda-gelu reluize` (ReLU gates)")
    p.add_argument("--original", help="the original as a GGUF file (default: the conversion's source)")
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--prompt-tokens", type=positive_int, default=15,
                   help="the prompt's length: beyond 15 tokens, the first ones of the standard library's argparse.py")
    p.add_argument("--rounds", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--work", help="where llama.cpp's files of the original are kept (default: a temporary folder)")
    p.add_argument("--sentences", type=positive_int, default=256,
                   help="held-out sentences the perplexities are measured on")
    p.add_argument("--name", default="llamacpp")
    args = p.parse_args()

    import transformers
    from lambda_gelu.deploy.gguf import export_gguf
    from lambda_gelu.errors import CheckpointError
    from lambda_gelu.hf.save import REPORT
    from lambda_gelu.inference.int4 import row_bytes
    from lambda_gelu.inference.sparse import sparsify_
    torch.set_num_threads(args.threads)
    report = json.loads((Path(args.model) / REPORT).read_text())
    original = Path(args.original or report["source"])
    if original.suffix != ".gguf":
        raise SystemExit(f"{original} is not a GGUF file: give the original as one with --original")
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    text = PROMPT if args.prompt_tokens <= 15 else Path(LONG_PROMPT).read_text()
    prompt = tokenizer(text)["input_ids"][:args.prompt_tokens]
    if len(prompt) < args.prompt_tokens:
        raise SystemExit(f"--prompt-tokens {args.prompt_tokens}: the prompt's text has {len(prompt)} tokens")
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    sparse = copy.deepcopy(model)
    sparsify_(sparse)
    sparse8 = copy.deepcopy(model)
    sparsify_(sparse8, int8=True)
    sparse4 = copy.deepcopy(model)
    sparsify_(sparse4, int4=True)

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    files = {kind: requantized(original, kind, work) for kind in TYPES}
    exports = {}
    for kind in EXPORTS:  # a type the exporter refuses for this conversion is left out, with its one line
        try:
            exports[kind] = export_gguf(args.model, work / f"converted-{kind.lower()}.gguf", kind.lower(),
                                        overwrite=True).path
        except CheckpointError as e:
            print(f"no {kind} export: {e}")
    length = len(prompt) + args.new_tokens + 2
    gguf_files = {f"llama.cpp, original, {kind}": path for kind, path in files.items()}
    gguf_files |= {f"llama.cpp, converted export, {kind}": path for kind, path in exports.items()}
    variants = {name: LlamaCpp(path, args.threads, length) for name, path in gguf_files.items()}
    variants |= {"ours, converted, dense, float32": Ours(model, length),
                 "ours, converted, sparse, float32": Ours(sparse, length),
                 "ours, converted, sparse, int8": Ours(sparse8, length, int8=True),
                 "ours, converted, sparse, int4": Ours(sparse4, length, int8=True)}

    times, firsts = {name: [] for name in variants}, {name: [] for name in variants}
    tokens, memory, read_seconds = {}, torch.ones(2 ** 28), []
    names = [*variants, READ]
    for r in range(args.rounds + 1):  # the first round warms every variant up and is not counted
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if name == READ:
                t = time.perf_counter()
                memory.sum()
                if r:
                    read_seconds.append(time.perf_counter() - t)
                continue
            got, seconds, first = variants[name].decode(prompt, args.new_tokens)
            tokens.setdefault(name, got)
            if r:
                times[name].append(seconds)
                firsts[name].append(first)
    speed = {name: args.new_tokens / statistics.median(ts) for name, ts in times.items()}
    first_ms = {name: 1e3 * statistics.median(ts) for name, ts in firsts.items()}

    bw, bw_median = (memory.numel() * 4 / f(read_seconds) for f in (min, statistics.median))
    names.remove(READ)
    reads = ffn_reads(model, sparse, prompt, tokens["ours, converted, dense, float32"])
    positions = len(prompt) + args.new_tokens / 2
    int4_bytes = row_bytes(32) / 32  # 4-bit rows: 18 bytes a block of 32 weights
    cfg = model.config
    kv_f16 = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    per_token = {name: llama_bytes(gguf_bytes(path)) + int(kv_f16 * positions) for name, path in gguf_files.items()}
    per_token |= {"ours, converted, dense, float32": our_bytes(model, None, 4, positions),
                  "ours, converted, sparse, float32": our_bytes(model, reads, 4, positions),
                  "ours, converted, sparse, int8": our_bytes(model, reads, 1, positions),
                  "ours, converted, sparse, int4": our_bytes(model, reads, 1, positions, int4_bytes)}
    relu = tokens["ours, converted, dense, float32"]  # the converted model's: ours and its export's reference

    def reference(name):
        return tokens["llama.cpp, original, F32"] if name.startswith("llama.cpp, original") else relu
    head = header() | {"llama_cpp": __import__("llama_cpp").__version__}
    rows, results = [], {}
    for name in names:
        same = sum(a == b for a, b in zip(tokens[name], reference(name)))
        share, share_median = (speed[name] * per_token[name] / b for b in (bw, bw_median))
        results[name] = {"tokens_per_s": speed[name], "seconds": times[name], "bytes_per_token": per_token[name],
                         "share_of_bandwidth_bound": share, "share_of_median_bound": share_median,
                         "same_tokens": same, "first_token_ms": first_ms[name], "first_token_seconds": firsts[name]}
        rows.append([name, f"{speed[name]:.1f}", f"{per_token[name] / 1e6:.1f}", f"{bw / per_token[name]:.1f}",
                     f"{share:.0%} ({share_median:.0%})", f"{same}/{args.new_tokens}", f"{first_ms[name]:.0f}"])
    print_table(f"decoding at batch 1, {args.new_tokens} tokens after {len(prompt)}, {args.rounds} rounds; memory "
                f"bandwidth {bw / 1e9:.1f} GB/s (median {bw_median / 1e9:.1f}); FFN reads: "
                f"{reads['gate_rows_read']:.1%} of gate rows, {reads['active']:.1%} of units active", head, rows,
                ["decoder, model, precision", "tokens/s", "MB/token", "bound tokens/s", "of bound (median read)",
                 "same tokens", "first token, ms"])
    for ours, theirs in (("sparse, float32", "F32"), ("sparse, int8", "Q8_0"), ("sparse, int4", "Q4_0"),
                         ("sparse, int4", "Q4_1")):
        ratio = [t / o for o, t in zip(times[f"ours, converted, {ours}"], times[f"llama.cpp, original, {theirs}"])]
        print(f"ours {ours} against llama.cpp {theirs}: ×{statistics.median(ratio):.2f} "
              f"(rounds ×{min(ratio):.2f}–×{max(ratio):.2f})")
    sentences = held_out(tokenizer, args.sentences)
    nll = {"ours, float32": torch_nll(model, sentences), "ours, int8": torch_nll(int8_weights(model), sentences),
           "ours, int4": torch_nll(int4_weights(model), sentences)}
    nll |= {f"llama.cpp, {kind}": llama_nll(path, args.threads, sentences) for kind, path in files.items()}
    nll |= {f"llama.cpp, export {kind}": llama_nll(path, args.threads, sentences) for kind, path in exports.items()}
    perplexity = {name: float(np.exp(total / count)) for name, (total, count) in nll.items()}
    costs = {name: perplexity[name] / perplexity["ours, float32"] for name in ("ours, int8", "ours, int4")}
    costs |= {f"llama.cpp, export {kind}": perplexity[f"llama.cpp, export {kind}"] / perplexity["ours, float32"]
              for kind in exports}  # the converted model written for llama.cpp, against that model in float32
    costs |= {f"llama.cpp, {kind}": perplexity[f"llama.cpp, {kind}"] / perplexity["llama.cpp, F32"]
              for kind in TYPES if kind != "F32"}
    print(f"held-out perplexity ({len(sentences)} docstring sentences): "
          + ", ".join(f"{k} {v:.3f}" for k, v in perplexity.items()))
    print("what quantization costs, against the same decoder's float32: "
          + ", ".join(f"{k} ×{v:.4f}" for k, v in costs.items()))
    save(args.name, {**head, "model": args.model, "perplexity": perplexity, "quantization_cost": costs,
                     "perplexity_sentences": len(sentences), "original": str(original), "prompt_tokens": len(prompt),
                     "new_tokens": args.new_tokens, "rounds": args.rounds, "bandwidth": bw,
                     "bandwidth_median": bw_median, "read_seconds": read_seconds,
                     "gate_zeros": report.get("zeros"), "ffn_reads": reads, "variants": results})


if __name__ == "__main__":
    main()

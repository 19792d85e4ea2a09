"""``lambda-gelu``: a pretrained model made exact-ReLU, then what ReLU buys — faster decoding, ONNX Runtime, proofs.

    lambda-gelu reluize MODEL --out DIR [--minutes M | --steps N] [--text FILE...] [...]
                                        a Hugging Face model (a directory, a GGUF file, an offline name) → exact ReLU
    lambda-gelu generate DIR "prompt" [--max-new-tokens N] [--sample] [--int8 | --int4] [--chat]
                                        a converted causal LM decoded by the sparse fast path; tokens/s on stderr
    lambda-gelu export DIR --gguf FILE [--type f32|f16|bf16|q8_0|q4_0|q4_1]
                                        a converted Llama or Gemma 3 as GGUF that llama.cpp computes as ReLU
    lambda-gelu deploy DIR [--original MODEL]
                                        a converted checkpoint in ONNX Runtime, fp32 and int8, against its original
    lambda-gelu verify MODEL.onnx PROPERTY.vnnlib [--time-limit S]
                                        sat, unsat or unknown, as VNN-COMP's verifiers answer
    lambda-gelu lab ...                 the paper's experiments and their reports (the [lab] extra)

Each command's errors are one line on stderr and exit status 2; nothing a command writes is left half-written.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

__all__ = ["main"]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, where to look), exit status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    from .deploy.gguf import TYPES as GGUF_TYPES
    p = Parser(prog="lambda-gelu", description="λ-GELU: pretrained GELU/SiLU models made exact-ReLU, and what ReLU buys.",
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog="`lambda-gelu COMMAND --help` for more.")
    sub = p.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")

    rz = sub.add_parser("reluize", help="convert a pretrained Hugging Face GELU or SiLU model into an exact-ReLU "
                        "checkpoint")
    rz.add_argument("model", metavar="MODEL", help="a local Hugging Face model directory, a GGUF file, or "
                    "all-minilm-l6-v2 / smollm2-135m-instruct (offline packages)")
    rz.add_argument("--out", required=True, help="where to write the ReLU checkpoint and reluize_report.md")
    config_options(rz)
    rz.add_argument("--overwrite", action="store_true", help="replace an earlier conversion's --out")
    rz.add_argument("--quiet", action="store_true", help="no progress bar")
    rz.add_argument("--threads", type=int, default=None)
    rz.set_defaults(func=_reluize)

    gen = sub.add_parser("generate", help="decode a converted causal LM with the sparse fast path (LeanDecoder over "
                         "sparsified FFNs); the text on stdout as it is decoded, tokens/s on stderr")
    gen.add_argument("checkpoint", metavar="DIR", help="a `lambda-gelu reluize` --out directory of a causal LM")
    gen.add_argument("prompt", metavar="PROMPT")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="tokens to decode at most (default 64)")
    gen.add_argument("--sample", action="store_true", help="draw tokens (the model's generation settings, or "
                     "--temperature, --top-k, --top-p) instead of greedy decoding")
    gen.add_argument("--temperature", type=float, default=None)
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0, help="the draws' seed, with --sample (default 0)")
    gen.add_argument("--int8", action="store_true",
                     help="the FFNs and the attention's projections read int8 weights with a scale per row (not exact)")
    gen.add_argument("--int4", action="store_true",
                     help="the FFNs read 4-bit weights in blocks of 32, the attention's projections int8 (not exact)")
    gen.add_argument("--dense", action="store_true", help="leave the FFNs dense (the reference for the sparse path)")
    gen.add_argument("--chat", action="store_true", help="the prompt as a user's turn in the tokenizer's chat template")
    gen.add_argument("--ids", action="store_true", help="print the new tokens' ids, not their text")
    gen.add_argument("--threads", type=int, default=None)
    gen.set_defaults(func=_generate)

    exp = sub.add_parser("export", help="write a converted Llama-family or Gemma 3 checkpoint as a GGUF file that "
                         "llama.cpp computes as the ReLU model (its gates as SiLU or GELU at a large hardness)")
    exp.add_argument("checkpoint", metavar="DIR", help="a `lambda-gelu reluize` --out directory of a causal LM")
    exp.add_argument("--gguf", required=True, metavar="FILE", help="the GGUF file to write")
    exp.add_argument("--type", default="f32", choices=GGUF_TYPES,
                     help="the weights' type (default f32)")
    exp.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    exp.set_defaults(func=_export)

    dep = sub.add_parser("deploy", help="a converted checkpoint DIR in ONNX Runtime, fp32 and int8, against its "
                         "original: writes DIR/deploy_report.md and DIR/onnx/")
    dep.add_argument("checkpoint", metavar="DIR", help="a `lambda-gelu reluize` --out directory (or any Hugging Face "
                     "ReLU checkpoint with --original)")
    deploy_options(dep)
    dep.add_argument("--threads", type=int, default=None)
    dep.set_defaults(func=_deploy)

    ver = sub.add_parser("verify", help="decide a VNN-LIB property of an ONNX ReLU network: sat, unsat or unknown, as "
                         "VNN-COMP's verifiers answer")
    ver.add_argument("onnx", metavar="MODEL.onnx")
    ver.add_argument("vnnlib", metavar="PROPERTY.vnnlib")
    ver.add_argument("--time-limit", type=float, default=60.0, help="seconds of search in all (default 60)")
    ver.set_defaults(func=_verify)

    sub.add_parser("lab", add_help=False, help="the paper's experiments: run, report, export, deploy, tasks "
                   "(`lambda-gelu lab --help`; the [lab] extra)")
    return p


def config_options(parser: argparse.ArgumentParser) -> None:
    """``lambda-gelu reluize``'s settings: one option per field of ConversionConfig and ReluizeConfig (less the
    refit in batches, which the command counts in sentences), with the field's help, choices and default."""
    from .hf import ConversionConfig
    from .reluize import ReluizeConfig
    field_options(parser, "c_", ConversionConfig, skip=("reluize",), names={"texts": "--text", "eval_texts": "--eval-text"},
                  metavars={"texts": "FILE", "eval_texts": "FILE"})
    field_options(parser, "r_", ReluizeConfig, skip=("refit",))


def deploy_options(parser: argparse.ArgumentParser) -> None:
    """``lambda-gelu deploy DIR``'s settings: the fields of DeployConfig (threads is the command's own)."""
    from .deploy.checkpoint import DeployConfig
    field_options(parser, "d_", DeployConfig, skip=("threads",),
                  metavars={"original": "MODEL", "batch_sizes": "N", "rounds": "N", "sentences": "N", "max_tokens": "N"})


def field_options(parser: argparse.ArgumentParser, prefix: str, cls, skip=(), scope: str = "", names=None,
                  metavars=None) -> None:
    """One option per field of the config dataclass ``cls`` (less ``skip``): the field's help (after ``scope``),
    choices and default, its type from its annotation (a tuple takes several values, a bool is a flag); the value
    lands in ``prefix + name``, None when the option is not given, so that the config's own default applies. A field
    marked ``experimental`` (measured worse than the default) is ``--experimental-NAME``, left out of the help."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = (f" (default {' '.join(map(str, default)) if isinstance(default, tuple) else default})"
                 if default not in (None, ()) else "")
        kind = str(f.type)
        text = (scope + f.metadata.get("help", "") + shown).replace("%", "%%")  # argparse formats help with %
        options = {"dest": prefix + f.name, "default": None, "help": text,
                   "type": float if "float" in kind else int if "int" in kind else str}
        if kind == "bool":  # a flag: True when given
            options["action"] = "store_true"
            del options["type"]
        if "choices" in f.metadata:
            options["choices"] = f.metadata["choices"]
        if "tuple" in kind:
            options["nargs"] = "+"
        if metavars and f.name in metavars:
            options["metavar"] = metavars[f.name]
        elif "choices" not in options and kind != "bool":  # LR rather than argparse's R_LR, the destination
            options["metavar"] = f.name.upper()
        name = (names or {}).get(f.name, "--" + f.name.replace("_", "-"))
        if f.metadata.get("experimental"):  # measured worse: kept for the studies, off the help's surface
            name, options["help"] = "--experimental-" + name[2:], argparse.SUPPRESS
        parser.add_argument(name, **options)


def conversion_config(args):
    """The ConversionConfig (with its ReluizeConfig) of ``lambda-gelu reluize``'s parsed options."""
    from .hf import ConversionConfig
    from .reluize import ReluizeConfig
    given = {k: v for k, v in vars(args).items() if v is not None}
    settings = {k[2:]: v for k, v in given.items() if k.startswith("r_")}
    conversion = {k[2:]: tuple(v) if isinstance(v, list) else v  # a tuple of files: --text, --eval-text
                  for k, v in given.items() if k.startswith("c_")}
    return ConversionConfig(**conversion, reluize=ReluizeConfig(**settings))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "lab":
        try:
            from lambda_gelu_lab.cli import main as lab
        except ImportError as e:
            print(f"error: the lab needs its extra: pip install 'lambda-gelu[lab]' ({e})", file=sys.stderr)
            return 2
        return lab(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        threads = getattr(args, "threads", None)
        if threads is not None:
            if not 1 <= threads <= 2 ** 31:
                raise ValueError(f"--threads must be a whole number from 1 to 2^31, got {threads}")
            import torch
            torch.set_num_threads(threads)
        return args.func(args)
    except ValueError as e:  # a setting, a file or a model refused: one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an unwritable --out, a full disk: the environment, not a bug
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}; choose another place or free it", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written" + (" to --out" if args.command == "reluize" else ""),
              file=sys.stderr)
        return 130


def _reluize(args) -> int:
    from .hf import reluize_checkpoint
    print(reluize_checkpoint(args.model, args.out, conversion_config(args), overwrite=args.overwrite,
                             progress=not args.quiet, log=lambda line: print(line, file=sys.stderr)))
    return 0


def _generate(args) -> int:
    from .hf.generate import GenerateConfig, generate_text
    config = GenerateConfig(max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed, int8=args.int8, int4=args.int4,
                            dense=args.dense,
                            chat=args.chat)
    stream = None if args.ids else lambda text: print(text, end="", flush=True)  # the text as it is decoded
    result = generate_text(args.checkpoint, args.prompt, config, log=lambda line: print(line, file=sys.stderr),
                           stream=stream)
    print(" ".join(map(str, result.new_ids)) if args.ids else "")
    print(result.summary(), file=sys.stderr)
    return 0


def _export(args) -> int:
    from .deploy.gguf import export_gguf
    exported = export_gguf(args.checkpoint, args.gguf, args.type, overwrite=args.overwrite)
    print(exported.path)
    print(exported.summary(), file=sys.stderr)
    return 0


def _deploy(args) -> int:
    from .deploy.checkpoint import DeployConfig, deploy_checkpoint
    settings = {k[2:]: v for k, v in vars(args).items() if k.startswith("d_") and v is not None}
    if "batch_sizes" in settings:
        settings["batch_sizes"] = tuple(settings["batch_sizes"])
    print(deploy_checkpoint(args.checkpoint, DeployConfig(**settings, threads=args.threads),
                            log=lambda line: print(line, file=sys.stderr)))
    return 0


def _verify(args) -> int:
    """Prints VNN-COMP's verdict word, and for sat the counterexample as ((X_i value) ... (Y_j value) ...); for
    unknown, why, on standard error."""
    import torch

    from .verify.onnx_chain import load_onnx_chain
    from .verify.polytopes import verify_property
    from .verify.bounds import affine_layers
    from .verify.vnnlib import VERDICTS, read_property
    if not 0 < args.time_limit < float("inf"):
        raise ValueError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    model = load_onnx_chain(args.onnx)
    layers, _ = affine_layers(model)
    prop = read_property(args.vnnlib, num_inputs=layers[0][0].shape[1], num_outputs=layers[-1][0].shape[0])
    result = verify_property(model, prop.lo, prop.hi, prop.unsafe, time_limit=args.time_limit)
    print(VERDICTS[result.status])
    if result.counterexample is not None:
        x = torch.as_tensor(result.counterexample, dtype=torch.float32)
        with torch.no_grad():
            y = model(x.reshape(1, -1))[0]
        print("(" + "\n".join([f"(X_{i} {float(v)!r})" for i, v in enumerate(x)]
                              + [f"(Y_{j} {float(v)!r})" for j, v in enumerate(y)]) + ")")
    elif result.status == "timeout":
        print(f"unknown: {result.detail.get('note', '')}", file=sys.stderr)
    return 0

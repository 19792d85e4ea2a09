"""What a conversion kept, measured on held-out text against the original: the mean cosine of the mean-pooled
sentence embeddings, the overlap of each sentence's 10 nearest neighbours, for causal language models the
perplexity ratio, and for a model with a head the share of the original's predictions it keeps; and the report
(Markdown) written beside the checkpoint."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.zeros import exact_zeros
from ..reluize.losses import mean_pool

__all__ = ["METRICS", "AGREEMENT", "evaluate", "hidden_states", "summarise", "scores", "markdown", "relu_zeros"]

# what a report measures of a conversion: key, column, format; the last two only where the model has them
METRICS = (("cosine", "cosine", "{:.4f}"), ("top10_overlap", "top-10 overlap", "{:.3f}"),
           ("perplexity_ratio", "perplexity ÷ original", "{:.3f}"), ("agreement", "predictions kept", "{:.3f}"))
AGREEMENT = ("*predictions kept*: the share of the original's predictions (the argmax of its logits) the model makes "
             "too, per sentence for a sequence classifier, per real token otherwise")


@torch.no_grad()
def evaluate(model, batches, causal: bool) -> dict:
    """Mean-pooled, normalised last hidden states (an encoder-decoder's decoder's, which reads the encoder's too);
    where there are logits, the prediction at each sentence (a classifier's) or real token (any other head), and for a
    causal language model the next-token loss."""
    model.eval()

    def outputs():
        for b in batches:
            out = model(**b, output_hidden_states=True)
            yield b, hidden_states(out)[-1], getattr(out, "logits", None)
    return summarise(outputs(), causal)


def hidden_states(out):
    """A Hugging Face output's hidden states, an encoder-decoder's decoder's (None where it gives none)."""
    own = getattr(out, "hidden_states", None)
    return own if own is not None else getattr(out, "decoder_hidden_states", None)


@torch.no_grad()
def summarise(outputs, causal: bool) -> dict:
    """:func:`evaluate`'s measurements from ``(batch, last hidden state, logits or None)`` triples, whatever
    computed them (the model in torch, or its ONNX export in a runtime); an encoder-decoder's positions are its
    decoder's, masked by the batch's ``decoder_attention_mask``."""
    embeddings, predictions, nll, tokens = [], [], 0.0, 0
    for b, hidden, logits in outputs:
        mask = b.get("decoder_attention_mask", b["attention_mask"])
        embeddings.append(F.normalize(mean_pool(hidden, mask), dim=-1))
        if logits is None:
            continue
        mask = mask.bool()
        chosen = logits.argmax(-1)
        predictions.append(chosen[mask] if chosen.shape == mask.shape else chosen.flatten())
        if causal:
            # each position predicts the next token, scored where that token is real; the labels are shifted rather
            # than the logits, whose slice would be copied, vocabulary-wide, to be flattened
            labels = torch.full_like(b["input_ids"], -100)
            labels[:, :-1] = b["input_ids"][:, 1:].masked_fill(~mask[:, 1:], -100)
            nll += F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                   reduction="sum").item()
            tokens += int((labels != -100).sum())
    return {"embeddings": torch.cat(embeddings), "predictions": torch.cat(predictions) if predictions else None,
            "perplexity": float(torch.tensor(nll / tokens).exp()) if tokens else None}


def relu_zeros(model, batches) -> dict[str, float]:
    """{ReLU module: the fraction of its outputs that are exactly zero}, over the real (unpadded) tokens of
    ``batches``: the activation sparsity a sparse kernel can skip, layer by layer (:func:`~lambda_gelu.core.zeros.
    exact_zeros`, the library's one count)."""
    return {key: site["zero_fraction"] for key, site in exact_zeros(model, batches).items()}


def scores(ev: dict, ref: dict) -> dict:
    e, r = ev["embeddings"], ref["embeddings"]

    def neighbours(v):
        return (v @ v.T).fill_diagonal_(-2.0).topk(10, dim=-1).indices

    a, b = neighbours(e), neighbours(r)
    overlap = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / (10 * len(e))
    scores = {"cosine": (e * r).sum(-1).mean().item(), "top10_overlap": overlap}
    if ev["perplexity"] is not None:
        scores["perplexity_ratio"] = ev["perplexity"] / ref["perplexity"]
    if ev["predictions"] is not None:
        scores["agreement"] = (ev["predictions"] == ref["predictions"]).float().mean().item()
    return scores


def _mean_zeros(zeros: dict) -> str:
    return f"{100 * sum(zeros.values()) / len(zeros):.1f}%" if zeros else "—"


def _other_text(r: dict, metrics) -> list[str]:
    """The report's table of the checkpoint on the further held-out sets (text of other kinds than the training
    text), where it has them."""
    sets = r.get("held_out_sets")
    if not sets:
        return []
    lines = ["## On text of other kinds", "",
             "The checkpoint against the original once the conversion ended, on held-out text of kinds other than its "
             "training text, none of it trained on; the exact zeros averaged over the layers:", ""]
    lines += [f"- *{name}*: {s['source']}." for name, s in sets.items()]
    lines += ["", "| text | sentences | " + " | ".join(label for _, label, _ in metrics) + " | exact zeros |",
              "|---|---|" + "---|" * (len(metrics) + 1)]
    lines += [f"| {name} | {s['sentences']} | " + " | ".join(fmt.format(s[key]) for key, _, fmt in metrics)
              + f" | {_mean_zeros(s.get('zeros'))} |" for name, s in sets.items()]
    return lines + [""]


def markdown(r: dict) -> str:
    metrics = [m for m in METRICS if m[0] in r["reluized"]]

    def cells(s: dict) -> str:
        return " | ".join(fmt.format(s[key]) for key, _, fmt in metrics)

    head, rule = " | ".join(label for _, label, _ in metrics), "|".join("---" for _ in metrics)
    settings = r.get("settings") or {}
    lines = [f"# {r['model']} → exact ReLU", "",
             f"`reluize` with schedule `{r['schedule']}`"
             + (f" (the last {r['repair']:.0%} of the steps end to end)" if r.get("repair") else "")
             + (f", after a least-squares refit of {len(r['refit'])} layers over {r['refit_sentences']} sentences "
                "(step 0)" if r.get("refit") else "")
             + (f" ({r['refit_note']})" if r.get("refit_note") and not r.get("refit") else "")
             + f": {r['steps']} steps of {r['batch_size']} sentences "
             f"(≤ {r['max_tokens']} tokens{', grouped by length' if r.get('batching') == 'length' else ''})"
             + (f", the learning rate {settings['lr']:g}" if settings.get("lr") is not None else
                ", the learning rate" if r.get("lr_schedule") == "linear" else "")
             + (" falling linearly to 0" if r.get("lr_schedule") == "linear" else "")
             + (", the matrix products in bfloat16 (autocast; weights and loss in float32)"
                if r.get("precision") == "bfloat16" else "")
             + (f" and {r['training_attention']} attention" if r.get("training_attention") == "eager" else "")
             + (", the token embeddings and the output layer left as the original's" if r.get("embeddings") == "freeze"
                else "")
             + (f", an L1 penalty on the activations rising to {settings['sparsity']:g}" if settings.get("sparsity")
                else "")
             + (f", the loss's hidden-state term weighed {settings['hidden_weight']:g}"
                if settings.get("hidden_weight", 1.0) != 1.0 else "")
             + (f", the gates' threshold lowered {'at once to' if settings.get('gate_zeros_at_once') else 'towards'} "
                f"{settings['gate_zeros']:.0%} exact zeros" if settings.get("gate_zeros") else "")
             + f" in {r['seconds'] / 60:.1f} min"
             + (f" (and {r['planning_seconds']:.1f} s before it, timed to plan the steps)"
                if r.get("planning_seconds") else "")
             + (f" (the --minutes budget ended it; {r['planned_steps']} steps were planned)"
                if r["steps"] < r.get("planned_steps", r["steps"]) else
                " (the --minutes budget ended it after the refit, before a step was planned)"
                if r["steps"] == 0 and r.get("budget_minutes") and r.get("refit_sentences") else "")
             + f"; {len(r['replaced'])} activations replaced by `nn.ReLU`"
             + (f" (left as it was, no module to replace: {'; '.join(r['functional'])} as a function)"
                if r.get("functional") else "")
             + (f"; {len(r['kept'])} left as they were, never reached by text (from '{r['kept'][0]}'), which "
                "training on text cannot train" if r.get("kept") else "")
             + (f"; trained in float32, written in {r['dtype']} as the original was" if r.get("dtype", "float32")
                != "float32" else "") + ". "
             f"Measured on {r['held_out_sentences']} held-out standard-library docstring "
             "sentences (from files never used in training) against the original model: mean cosine of the "
             "mean-pooled sentence embeddings, and the share of each sentence's 10 nearest neighbours kept"
             + ("; the perplexity ratio" if "perplexity_ratio" in r["reluized"] else "")
             + (f"; {AGREEMENT}" if "agreement" in r["reluized"] else "")
             + (" (an encoder-decoder's: its decoder's, reading each sentence after its start token, as in training)"
                if r.get("encoder_decoder") else "") + ".", "",
             *([f"Exact zeros of the ReLU activations on the held-out sentences' real tokens: "
                f"{100 * sum(r['zeros'].values()) / len(r['zeros']):.1f}% averaged over the {len(r['zeros'])} layers "
                f"(from {100 * min(r['zeros'].values()):.1f}% to {100 * max(r['zeros'].values()):.1f}%; "
                "each layer's in the JSON report).", ""] if r.get("zeros") else []),
             f"| model | {head} |", f"|---|{rule}|",
             f"| direct swap to ReLU, no training | {cells(r['direct_swap'])} |",
             f"| this checkpoint | {cells(r['reluized'])} |", "", *_other_text(r, metrics),
             "## Along the conversion", "",
             *([f"Measured on {r['curve_sentences']} of the held-out sentences (every few batches, so that the curve "
                "takes at most 5% of --minutes), the last row on all of them.", ""]
               if r.get("curve_sentences", r["held_out_sentences"]) < r["held_out_sentences"] else []),
             f"| step | minutes | λ | {head} |", f"|---|---|---|{rule}|"]
    for c in r["curve"]:
        lam = "ReLU" if c["lam"] is None else f"{c['lam']:.3g}"
        lines.append(f"| {c['step']} | {c['minutes']:.2f} | {lam} | {cells(c)} |")
    return "\n".join(lines) + "\n"

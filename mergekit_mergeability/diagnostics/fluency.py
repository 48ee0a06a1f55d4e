"""Signal 7: whether the merge as written still speaks, probes or none.

Merges that emit gibberish are the failure users report most plainly (a TIES or SLERP of
fine-tunes whose updates fight, a scale symmetry that one update used and another did not).
Before any merge, the config's own merge is built in memory (``rehearsal.stream``: mergekit's
plan, tensor by tensor) and its perplexity read on a short general English text shipped with the
package (``configs/text/general.txt``), beside the base's and each parent's own:

    falls apart  ⇔  ppl(merge) > FALLS_APART · max(ppl(base), ppl(parent_1), …)

A merge that falls apart is an error finding where some model has no probe: the verdict is
``do_not_merge``, with the numbers, before any GPU merge runs. Where every model has a probe it is
a warning, and the rehearsal of each one's own task decides: on the demo's translators (each
already 4-6x the base's perplexity on general text) the task_arithmetic merge of the shared-target
pair measured 76,669 against its models' 122-177, yet kept 0.83 and 0.94 of their chrF; the rule
as first written refused it (changed after that run, docs/prediction.md). The factor was set before any merge was measured with it: a merge of
sound fine-tunes lands near its parents (a few percent either way), gibberish lands many times
above them, and twice the worst parent leaves room for both.

The same passes give each model a probe it did not have to write, its *signature*: the tokens of
the text where its own log-prob of the next token moves furthest from the base's (the top
SIGNATURE_SHARE of |ℓ_i − ℓ_base|), and how much of that shift the merge keeps,

    signature_kept_i = Σ_S (ℓ_merge − ℓ_base)(ℓ_i − ℓ_base) / Σ_S (ℓ_i − ℓ_base)²

1 where the merge moves those tokens as the model does, 0 where it is back at the base. Where a
model has no probe, the precheck reports it as that model's derived prediction (clipped to
[0, 1]), and says so; the rule was written down before it was measured against mergeability,
and measured it does not rank models (docs/prediction.md, "Without probes").
"""

from __future__ import annotations

import math

import torch

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, Need
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import FluencyStats
from mergekit_mergeability.rehearsal.sums import summed
from mergekit_mergeability.rehearsal.stream import Job, as_planned, walk
from mergekit_mergeability.resources import shipped
from mergekit_mergeability.sources import load_causal_lm

FALLS_APART = 2.0
SIGNATURE_SHARE = 0.1
TEXT = "text/general.txt"
WINDOW = 256  # tokens per forward pass


def token_logprobs(module: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """log p(next token) for every token of ``windows`` (rows of token ids) but each row's first."""
    with torch.no_grad():
        logits = module(input_ids=windows.to(module.device)).logits[:, :-1].float()
    targets = windows[:, 1:].to(logits.device)
    return logits.log_softmax(-1).gather(-1, targets[..., None]).flatten().cpu()


def perplexity(logprobs: torch.Tensor) -> float:
    """exp of the mean next-token negative log-likelihood."""
    return math.exp(-logprobs.mean().item())


def signature_kept(
    model: torch.Tensor, base: torch.Tensor, merged: torch.Tensor, share: float = SIGNATURE_SHARE
) -> float:
    """How much of a model's own log-prob shift from the base the merge keeps, on the tokens where
    that shift is largest (the top ``share``): the projection of the merge's shift on the model's."""
    own = model - base
    signature = own.abs().argsort(descending=True)[: max(1, int(share * len(own)))]
    along = (own[signature] ** 2).sum()
    return float(((merged - base)[signature] * own[signature]).sum() / along) if along > 0 else 1.0


def windows(tokenizer, text: str, size: int = WINDOW) -> torch.Tensor:
    """The text's token ids cut into whole windows of ``size`` (the last, shorter one dropped when
    there is more than one). The text is tokenised whole, longer than a model may read at once:
    ``verbose=False`` keeps transformers from warning of sequences longer than that (it is cut)."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False, verbose=False)["input_ids"][0]
    count = max(1, len(ids) // size)
    size = min(size, len(ids))
    return ids[: count * size].reshape(count, size)


class Fluency:
    name = "fluency"
    needs = frozenset({Need.BASE_MODEL, Need.WEIGHTS})

    unit = "window"  # its passes read WINDOW tokens of the shipped text, not a probe line

    def passes(self, inputs: DiagnosticInputs, tokenizer) -> int:
        """Windows of the text read by the base, each model and the merge (0 where it will skip)."""
        if not inputs.written:
            return 0
        return (len(inputs.models) + 2) * len(windows(tokenizer, shipped(TEXT).read_text()))

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        names = set().union(*inputs.touched.values())
        if not inputs.written:
            message = "fluency: skipped, the merge as written cannot be built on the loaded base here"
            result.findings.append(
                Finding("info", f"{message} (a hub model, slices that change the depth, or a rebuilt vocabulary)")
            )
            return result
        settings = inputs.settings
        module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
        text = windows(tokenizer, shipped(TEXT).read_text())
        with task(
            "fluency: perplexity of the base, each model and the merge", len(inputs.models) + 2, settings.quiet
        ) as advance:
            at_base = token_logprobs(module, text)
            advance(1)

            def ask() -> torch.Tensor:
                found = token_logprobs(module, text)
                advance(1)
                return found

            # each model alone and the merge as written, in one walk up the blocks
            alone = [
                summed(f"alone {i}", str(inputs.base.path), [(str(m.path), 1.0, inputs.touched[m.name])])
                for i, m in enumerate(inputs.models)
            ]
            candidates = [*alone, as_planned("written", inputs.merge)]
            everyone = [inputs.base.path, *(m.path for m in inputs.models)]
            *read, at_merge = walk(module, candidates, [Job(c.name, ask) for c in candidates], everyone, names)
            logprobs = {m.name: found for m, found in zip(inputs.models, read)}
        own = {name: perplexity(values) for name, values in logprobs.items()}
        ppl_base, merged = perplexity(at_base), perplexity(at_merge)
        for model in inputs.models:
            result.per_model[model.name] = FluencyStats(
                perplexity=own[model.name],
                base_perplexity=ppl_base,
                merged_perplexity=merged,
                signature_kept=signature_kept(logprobs[model.name], at_base, at_merge),
            ).json()
        worst = max(ppl_base, *own.values())
        if not merged <= FALLS_APART * worst:  # NaN falls apart too
            # where every model has a probe, the rehearsal of each one's own task speaks for the merge
            probed = all(m.probes for m in inputs.models)
            result.findings.append(
                Finding(
                    "warning" if probed else "error",
                    f"the merge as written falls apart: its perplexity on general text is {merged:.4g}, against "
                    f"the base's {ppl_base:.4g} and its models' {min(own.values()):.4g}–{max(own.values()):.4g} "
                    f"(over {FALLS_APART:g}× the worst); "
                    + (
                        "it may still answer its models' tasks: read their rehearsed scores"
                        if probed
                        else "do not run this merge"
                    ),
                )
            )
        return result

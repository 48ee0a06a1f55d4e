"""Signal 7: whether the merge as written still speaks, probes or none.

Merges that emit gibberish are the failure users report most plainly (a TIES or SLERP of
fine-tunes whose updates fight, a scale symmetry that one update used and another did not).
Before any merge, the config's own merge is built in memory (``dilution.as_written``: mergekit's
plan, tensor by tensor) and its perplexity read on a short general English text shipped with the
package (``configs/text/general.txt``), beside the base's and each parent's own:

    falls apart  ⇔  ppl(merge) > FALLS_APART · max(ppl(base), ppl(parent_1), …)

A merge that falls apart is an error finding: the verdict is ``do_not_merge``, with the numbers,
before any GPU merge runs. The factor was set before any merge was measured with it: a merge of
sound fine-tunes lands near its parents (a few percent either way), gibberish lands many times
above them, and twice the worst parent leaves room for both.
"""

from __future__ import annotations

import math
from typing import Dict

import torch

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, Need
from mergekit_mergeability.diagnostics.dilution import as_written, changed, diluted, writable
from mergekit_mergeability.progress import task
from mergekit_mergeability.resources import shipped
from mergekit_mergeability.sources import TensorReader, load_causal_lm

FALLS_APART = 2.0
TEXT = "text/general.txt"
WINDOW = 256  # tokens per forward pass


def perplexity(module: torch.nn.Module, windows: torch.Tensor) -> float:
    """exp of the mean next-token negative log-likelihood over ``windows`` (rows of token ids)."""
    with torch.no_grad():
        logits = module(input_ids=windows.to(module.device)).logits[:, :-1].float()
    targets = windows[:, 1:].to(logits.device)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return math.exp(loss.item())


def windows(tokenizer, text: str, size: int = WINDOW) -> torch.Tensor:
    """The text's token ids cut into whole windows of ``size`` (the last, shorter one dropped when
    there is more than one)."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    count = max(1, len(ids) // size)
    size = min(size, len(ids))
    return ids[: count * size].reshape(count, size)


class Fluency:
    name = "fluency"
    needs = frozenset({Need.BASE_MODEL, Need.WEIGHTS})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        base = TensorReader(inputs.base.path)
        touched = {m.name: changed(base, m.path) for m in inputs.models}
        names = set().union(*touched.values())
        if not writable(inputs.merge, base, names):
            message = "fluency: skipped, the merge as written cannot be built on the loaded base here"
            result.findings.append(
                Finding("info", f"{message} (a hub model, slices that change the depth, or a rebuilt vocabulary)")
            )
            return result
        settings = inputs.settings
        module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
        text = windows(tokenizer, shipped(TEXT).read_text())
        own: Dict[str, float] = {}
        with task(
            "fluency: perplexity of the base, each model and the merge", len(inputs.models) + 2, settings.quiet
        ) as advance:
            ppl_base = perplexity(module, text)
            advance(1)
            for model in inputs.models:
                with diluted(module, base, model.path, 1.0):
                    own[model.name] = perplexity(module, text)
                advance(1)
            everyone = [inputs.base.path, *(m.path for m in inputs.models)]
            with as_written(module, inputs.merge, everyone, names):
                merged = perplexity(module, text)
            advance(1)
        for model in inputs.models:
            result.per_model[model.name] = {
                "perplexity": own[model.name],
                "base_perplexity": ppl_base,
                "merged_perplexity": merged,
            }
        worst = max(ppl_base, *own.values())
        if not merged <= FALLS_APART * worst:  # NaN falls apart too
            result.findings.append(
                Finding(
                    "error",
                    f"the merge as written falls apart: its perplexity on general text is {merged:.4g}, against "
                    f"the base's {ppl_base:.4g} and its models' {min(own.values()):.4g}–{max(own.values()):.4g} "
                    f"(over {FALLS_APART:g}× the worst); do not run this merge",
                )
            )
        return result

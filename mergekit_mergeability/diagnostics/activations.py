"""Teacher-forced forward passes over probe instances: continuation log-probs and pooled hidden states.

Each sequence is prompt + continuation, tokenised like lm-eval's loglikelihood
requests (the continuation's tokens are whatever the full text adds to the
prompt's). Hidden states come at the embedding output and after every decoder
block, mean-pooled over the prompt span and over the continuation span.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from mergekit_mergeability.tasks.probes import Instance


@dataclass
class Scored:
    continuation_logprobs: torch.Tensor  # (continuation tokens,) log p of each actual token
    distribution: Optional[torch.Tensor]  # (continuation tokens, vocab) log-softmax, if asked for
    continuation_ids: torch.Tensor
    prompt_pool: Optional[torch.Tensor]  # (layers + 1, hidden)
    continuation_pool: Optional[torch.Tensor]


def encode(tokenizer, prompt: str, continuation: str) -> Tuple[List[int], List[int]]:
    context = tokenizer(prompt)["input_ids"] if prompt else []
    whole = tokenizer(prompt + continuation)["input_ids"]
    if whole[: len(context)] != context:  # the boundary merged: tokenise the two sides apart
        whole = context + tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not context:  # the first continuation token needs something to be predicted from
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        context, whole = [start], [start, *whole]
    return context, whole[len(context) :]


def pad(encoded: Sequence[Tuple[List[int], List[int]]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and attention mask for (prompt ids, continuation ids) pairs."""
    length = max(len(p) + len(c) for p, c in encoded)
    ids = torch.zeros(len(encoded), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (p, c) in enumerate(encoded):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        mask[row, : len(p) + len(c)] = 1
    return ids, mask


@torch.inference_mode()
def score(
    model,
    tokenizer,
    sequences: Sequence[Tuple[str, str]],
    batch_size: int = 16,
    hidden_states: bool = False,
    distribution: bool = False,
    progress=None,
) -> Iterator[Scored]:
    """Score (prompt, continuation) pairs in batches, in order."""
    device = next(model.parameters()).device
    encoded = [encode(tokenizer, p, c) for p, c in sequences]
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start : start + batch_size]
        ids, mask = pad(batch)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=hidden_states)
        logprobs = torch.log_softmax(out.logits.float(), dim=-1)
        layers = torch.stack(out.hidden_states).float() if hidden_states else None  # (L+1, B, T, H)
        for row, (p, c) in enumerate(batch):
            span = slice(len(p), len(p) + len(c))
            predicting = logprobs[row, len(p) - 1 : len(p) + len(c) - 1]  # position t predicts token t+1
            answer = torch.tensor(c, device=predicting.device)
            yield Scored(
                continuation_logprobs=predicting.gather(1, answer[:, None]).squeeze(1).cpu(),
                distribution=predicting.cpu() if distribution else None,
                continuation_ids=answer.cpu(),
                prompt_pool=layers[:, row, : len(p)].mean(dim=1).cpu() if hidden_states else None,
                continuation_pool=layers[:, row, span].mean(dim=1).cpu() if hidden_states else None,
            )
        if progress is not None:
            progress(len(batch))


def choice_logprobs(model, tokenizer, instances: Sequence[Instance], batch_size: int = 16, progress=None):
    """Per instance: for multiple choice, the summed log-prob of each choice and of each
    letter (None without letters); for generation, the answer's per-token distribution."""
    for instance in instances:
        if instance.kind == "multiple_choice":
            scores = shared_prompt_logprobs(
                model, tokenizer, instance.prompt, instance.continuations + instance.letters
            )
            options, letters = scores[: len(instance.continuations)], scores[len(instance.continuations) :]
            found = options, (letters if instance.letters else None)
        else:
            (scored,) = score(model, tokenizer, [(instance.prompt, instance.gold)], distribution=True)
            found = scored.distribution, scored.continuation_ids
        if progress is not None:  # before the yield: a caller that stops at the last one still counts it
            progress(len(instance.continuations) + len(instance.letters))
        yield found


@torch.inference_mode()
def shared_prompt_logprobs(model, tokenizer, prompt: str, continuations: Sequence[str]) -> torch.Tensor:
    """The summed log-prob of each continuation after one prompt, the prompt run once.

    A few-shot prompt is long and the options are short: the prompt's keys and values
    are computed once and repeated for every option (equal to scoring each
    prompt + option alone; tests check it).
    """
    if cache_argument(model) is None:  # a model without a key/value cache: score each option whole
        return torch.stack(
            [s.continuation_logprobs.sum() for s in score(model, tokenizer, [(prompt, c) for c in continuations])]
        )
    encoded = [encode(tokenizer, prompt, c) for c in continuations]
    return options_pass(model, *prompt_pass(model, encoded[0][0]), [c for _, c in encoded]).cpu()


def cache_argument(model) -> Optional[str]:
    """The name ``model.forward`` takes its key/value cache by (transformers ≥ 5.2x renamed it); None: it takes none."""
    parameters = inspect.signature(model.forward).parameters
    return next((a for a in ("cache", "past_key_values") if a in parameters), None)


def prompt_pass(model, context: List[int]):
    """The prompt's ids run once: (log-probs of the token after it, its key/value cache, its length)."""
    device = next(model.parameters()).device
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=torch.tensor([context], device=device), use_cache=True, **last_only)
    return torch.log_softmax(out.logits[0, -1].float(), dim=-1), out[cache_argument(model)], len(context)


def options_pass(model, first: torch.Tensor, cache, prompted: int, options: Sequence[List[int]]) -> torch.Tensor:
    """Each option's summed log-prob after a prompt of ``prompted`` tokens whose ``prompt_pass`` gave
    ``first`` and ``cache``: the options run as one batch on the cache, repeated for each (which it changes)."""
    device = first.device
    cache.batch_repeat_interleave(len(options))
    ids, mask = pad([([], c) for c in options])
    mask = torch.cat([torch.ones(len(options), prompted, dtype=mask.dtype), mask], dim=1)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), **{cache_argument(model): cache}).logits
    following = torch.log_softmax(logits.float(), dim=-1)
    totals = [
        first[c[0]] + following[row, : len(c) - 1].gather(1, torch.tensor(c[1:], device=device)[:, None]).sum()
        for row, c in enumerate(options)
    ]
    return torch.stack(totals)

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


def batches(tokenizer, sequences: Sequence[Tuple[str, str]], batch_size: int):
    """(prompt, continuation) pairs tokenised (``encode``), ``batch_size`` at a time: each batch's
    (prompt ids, continuation ids) and its right-padded ids and attention mask (``pad``)."""
    encoded = [encode(tokenizer, p, c) for p, c in sequences]
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start : start + batch_size]
        yield (batch, *pad(batch))


@torch.inference_mode()
def score(
    model,
    tokenizer,
    sequences: Sequence[Tuple[str, str]],
    batch_size: int = 16,
    distribution: bool = False,
    progress=None,
) -> Iterator[Scored]:
    """Score (prompt, continuation) pairs in batches, in order."""
    device = next(model.parameters()).device
    for batch, ids, mask in batches(tokenizer, sequences, batch_size):
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device))
        logprobs = torch.log_softmax(out.logits.float(), dim=-1)
        for row, (p, c) in enumerate(batch):
            predicting = logprobs[row, len(p) - 1 : len(p) + len(c) - 1]  # position t predicts token t+1
            answer = torch.tensor(c, device=predicting.device)
            yield Scored(
                continuation_logprobs=predicting.gather(1, answer[:, None]).squeeze(1).cpu(),
                distribution=predicting.cpu() if distribution else None,
                continuation_ids=answer.cpu(),
            )
        if progress is not None:
            progress(len(batch))


@torch.inference_mode()
def hidden_means(
    model, tokenizer, sequences: Sequence[Tuple[str, str]], batch_size: int = 16, progress=None, before=None
) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Per (prompt, continuation) pair, in order: its hidden states at the embedding output and after
    every decoder block, mean-pooled over the prompt span and over the continuation span, each
    (layers + 1, hidden). No position's logits are computed but the last one's. ``before(batch,
    ids)``, where given, is told each batch (``batches``) before its forward pass."""
    device = next(model.parameters()).device
    for batch, ids, mask in batches(tokenizer, sequences, batch_size):
        if before is not None:
            before(batch, ids)
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            output_hidden_states=True,
            **_given(model, "logits_to_keep", 1),
        )
        layers = torch.stack(out.hidden_states).float()  # (L+1, B, T, H)
        for row, (p, c) in enumerate(batch):
            yield layers[:, row, : len(p)].mean(dim=1).cpu(), layers[:, row, len(p) : len(p) + len(c)].mean(dim=1).cpu()
        if progress is not None:
            progress(len(batch))


ITEMS_AT_ONCE = 16  # choice_logprobs reads this many instances at a time


def choice_logprobs(model, tokenizer, instances: Sequence[Instance], batch_size: int = ITEMS_AT_ONCE, progress=None):
    """Per instance: for multiple choice, the summed log-prob of each choice and of each
    letter (None without letters); for generation, the answer's per-token distribution.
    ``batch_size`` instances are read at a time (``prompts_logprobs`` runs their prompts together)."""
    for start in range(0, len(instances), batch_size):
        window = instances[start : start + batch_size]
        chosen = [i for i in window if i.kind == "multiple_choice"]
        asked = iter(prompts_logprobs(model, tokenizer, [(i.prompt, i.continuations + i.letters) for i in chosen]))
        for instance in window:
            if instance.kind == "multiple_choice":
                scores = next(asked)
                options, letters = scores[: len(instance.continuations)], scores[len(instance.continuations) :]
                found = options, (letters if instance.letters else None)
            else:
                (scored,) = score(model, tokenizer, [(instance.prompt, instance.gold)], distribution=True)
                found = scored.distribution, scored.continuation_ids
            if progress is not None:  # before the yield: a caller that stops at the last one still counts it
                progress(instance.sequences)
            yield found


def shared_prompt_logprobs(model, tokenizer, prompt: str, continuations: Sequence[str]) -> torch.Tensor:
    """The summed log-prob of each continuation after one prompt (``prompts_logprobs`` of one)."""
    return prompts_logprobs(model, tokenizer, [(prompt, continuations)])[0]


CALL_TOKENS = 2048  # one batched call's tokens at most, its padding and its options' prompts included


@dataclass(frozen=True)
class Asked:
    """One prompt and its options as they run: the prompt's ids, the options' common first tokens
    (``shared``, run with the prompt), and each option's tokens after them (``rest``)."""

    context: List[int]
    shared: List[int]
    rest: List[List[int]]

    @property
    def run(self) -> List[int]:
        return [*self.context, *self.shared]

    @property
    def runs(self) -> List[Tuple[int, ...]]:
        """What runs after the prompt: each option of two tokens or more without its last token,
        once where options share it (``36`` and ``38`` after one prompt both run ``3``)."""
        return list(dict.fromkeys(tuple(o[:-1]) for o in self.rest if len(o) > 1))

    @property
    def rows(self) -> int:
        return len(self.runs)


def asked(tokenizer, prompt: str, continuations: Sequence[str]) -> Asked:
    encoded = [encode(tokenizer, prompt, c) for c in continuations]
    shared, rest = split([c for _, c in encoded])
    return Asked(encoded[0][0], shared, rest)


def split(options: Sequence[List[int]]) -> Tuple[List[int], List[List[int]]]:
    """The options' common first tokens, and each option's tokens after them."""
    shared = 0
    while all(len(o) > shared for o in options) and len({o[shared] for o in options}) == 1:
        shared += 1
    return list(options[0][:shared]), [list(o[shared:]) for o in options]


def together(items: Sequence[Asked], tokens: int = CALL_TOKENS) -> Iterator[List[Asked]]:
    """``items`` in order, in groups that run as one prompts' call and one options' call each: as
    many as keep both within ``tokens`` padded tokens (an option's row counts its prompt), one at least."""
    group: List[Asked] = []
    for item in items:
        if group and padded([*group, item]) > tokens:
            yield group
            group = []
        group.append(item)
    if group:
        yield group


def calls(group: Sequence[Asked]) -> Tuple[int, int]:
    """The tokens ``prompt_pass`` and ``options_pass`` run for ``group``, padding included (0: no call)."""
    run = [len(r) for a in group for r in a.runs]
    return len(group) * max(len(a.run) for a in group), len(run) * max(run, default=0)


def padded(group: Sequence[Asked]) -> int:
    """The padded tokens of ``group``'s larger call: its prompts', or its options' rows with their prompts."""
    length = max(len(a.run) for a in group)
    longest = max((len(o) - 1 for a in group for o in a.rest), default=0)
    return max(len(group) * length, sum(a.rows for a in group) * (length + longest))


@torch.inference_mode()
def prompts_logprobs(model, tokenizer, pairs: Sequence[Tuple[str, Sequence[str]]]) -> List[torch.Tensor]:
    """Per (prompt, continuations): the summed log-prob of each continuation, as scoring each prompt
    + continuation whole gives (tests check it), with far fewer tokens run. Each prompt runs once with
    its options' common first tokens, keeping its keys and values; its options of two tokens or more
    then run on them, each without its last token (what that predicts is not read). Prompts run
    together, left-padded, as many at once as ``together`` allows, and so do their options."""
    if cache_argument(model) is None:  # a model without a key/value cache: score each option whole
        return [
            torch.stack([s.continuation_logprobs.sum() for s in score(model, tokenizer, [(p, c) for c in options])])
            for p, options in pairs
        ]
    found: List[torch.Tensor] = []
    for group in together([asked(tokenizer, p, options) for p, options in pairs]):
        found += options_pass(model, *prompt_pass(model, group), group)
    return [f.cpu() for f in found]


def cache_argument(model) -> Optional[str]:
    """The name ``model.forward`` takes its key/value cache by (transformers ≥ 5.2x renamed it); None: it takes none."""
    parameters = inspect.signature(model.forward).parameters
    return next((a for a in ("cache", "past_key_values") if a in parameters), None)


def _given(model, name: str, value) -> dict:
    """``{name: value}`` where ``model.forward`` takes ``name``."""
    return {name: value} if name in inspect.signature(model.forward).parameters else {}


def prompt_pass(model, group: Sequence[Asked]):
    """``group``'s prompts, each with its options' common first tokens, run once as one left-padded
    batch (every prompt ends at the last position): (per prompt, log-probs of the token after it,
    the summed log-prob of its ``shared``; the batch's key/value cache and attention mask)."""
    device = next(model.parameters()).device
    length, keep = max(len(a.run) for a in group), max(len(a.shared) for a in group) + 1
    ids = torch.zeros(len(group), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, item in enumerate(group):
        ids[row, length - len(item.run) :] = torch.tensor(item.run)
        mask[row, length - len(item.run) :] = 1
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        use_cache=True,
        **_given(model, "position_ids", (mask.cumsum(1) - 1).clamp(min=0).to(device)),
        **_given(model, "logits_to_keep", keep),
    )
    logprobs = torch.log_softmax(out.logits[:, -keep:].float(), dim=-1)
    said = [
        logprobs[row, keep - 1 - len(item.shared) : keep - 1]
        .gather(1, torch.tensor(item.shared, dtype=torch.long, device=device)[:, None])
        .sum()
        for row, item in enumerate(group)
    ]
    return logprobs[:, -1], torch.stack(said), out[cache_argument(model)], mask


def options_pass(
    model, first: torch.Tensor, said: torch.Tensor, cache, mask: torch.Tensor, group
) -> List[torch.Tensor]:
    """Per item of ``group``, each option's summed log-prob, after ``prompt_pass`` gave ``first``,
    ``said``, ``cache`` and ``mask``. Only options of two tokens or more run, as one batch, each a row
    on its own prompt's keys and values (``cache`` is changed) without its last token: what that
    predicts is not read; options of one prompt that share those tokens share a row. Where none
    has two, nothing runs."""
    device = first.device
    totals = [
        torch.stack([first[row, o[0]] if o else first.new_zeros(()) for o in item.rest]) + said[row]
        for row, item in enumerate(group)
    ]
    rows = [(row, run) for row, item in enumerate(group) for run in item.runs]
    if not rows:
        return totals
    owners = torch.tensor([row for row, _ in rows])
    cache.batch_select_indices(owners.to(device))
    ids, added = pad([([], list(run)) for _, run in rows])
    prompts = mask[owners]
    positions = prompts.sum(1, keepdim=True) + torch.arange(ids.shape[1])
    logits = model(
        input_ids=ids.to(device),
        attention_mask=torch.cat([prompts, added], dim=1).to(device),
        **_given(model, "position_ids", positions.to(device)),
        **{cache_argument(model): cache},
    ).logits
    batched = {row: b for b, row in enumerate(rows)}
    for row, item in enumerate(group):  # option by option: no float copy of every row's logits at once
        for j, option in enumerate(item.rest):
            if len(option) > 1:
                after = torch.tensor(option[1:], device=device)
                following = torch.log_softmax(logits[batched[row, tuple(option[:-1])], : len(after)].float(), dim=-1)
                totals[row][j] += following.gather(1, after[:, None]).sum()
    return totals

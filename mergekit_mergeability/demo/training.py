"""Small experts trained on CPU: a low-rank update ΔW = B·A of a few linear modules
(``mlp.up_proj`` by default; attention and MLP projections for LoRA-style pools).

Like the single-fact experts of Will it Merge? (arXiv 2601.06672): each update
teaches the base one fact (trained until the gold choice has p ≥ 0.9 on every
phrasing, in the format the fact is scored in: cloze, or the options listed after
a few solved examples) or one mapping (English into an invented language).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from mergekit_mergeability.diagnostics.activations import choice_logprobs, encode, pad
from mergekit_mergeability.tasks import probes
from mergekit_mergeability.tasks.probes import Instance

UP = ("mlp.up_proj",)
Factors = Dict[str, Tuple[torch.Tensor, torch.Tensor]]  # tensor name -> (A: rank × in, B: out × rank)


def _batch(tokenizer, pairs: Sequence[Tuple[str, str]]):
    """Inputs, mask and labels with the loss on the continuation tokens only."""
    encoded = [encode(tokenizer, p, c) for p, c in pairs]
    ids, mask = pad(encoded)
    labels = torch.full_like(ids, -100)
    for row, (p, c) in enumerate(encoded):
        labels[row, len(p) : len(p) + len(c)] = torch.tensor(c)
    return ids, mask, labels


def train_low_rank(
    model,
    tokenizer,
    layers: Sequence[int],
    pairs: Sequence[Tuple[str, str]],
    done: Callable[[], bool],
    rank: int = 16,
    lr: float = 3e-3,
    min_steps: int = 5,
    max_steps: int = 150,
    seed: int = 0,
    batch_size: Optional[int] = None,
    modules: Sequence[str] = UP,
    advance: Callable[[int], None] = lambda n: None,
) -> Factors:
    """Train ΔW = B·A on each layer's ``modules`` until ``done()`` (checked every 5 steps), on
    all ``pairs`` each step or on the next ``batch_size`` of them in turn, calling ``advance(1)``
    after each step; returns the factors by tensor name (``updated`` turns them into matrices).
    ``model`` is left unchanged.

    The blocks below the first trained one never change, so their output is computed once
    per batch and each step runs only the blocks above it, with logits for the continuation
    tokens only: the same loss, a fraction of the cost."""
    generator = torch.Generator().manual_seed(seed)
    factors: Factors = {}
    hooks = []
    for layer in layers:
        for path in modules:
            target = model.model.layers[layer].get_submodule(path)
            a = (torch.randn(rank, target.in_features, generator=generator) / target.in_features**0.5).requires_grad_()
            b = torch.zeros(target.out_features, rank, requires_grad=True)
            factors[f"model.layers.{layer}.{path}.weight"] = (a, b)
            hooks.append(
                target.register_forward_hook(lambda module, inputs, out, a=a, b=b: out + (inputs[0] @ a.T) @ b.T)
            )
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    size = batch_size or len(pairs)
    batches = [_batch(tokenizer, pairs[i : i + size]) for i in range(0, len(pairs), size)]
    first = min(layers)
    with torch.no_grad():
        batches = [(_hidden_before(model, ids, mask, first), mask, labels) for ids, mask, labels in batches]
    optimiser = torch.optim.Adam([t for pair in factors.values() for t in pair], lr=lr)
    try:
        for step in range(max_steps):
            if step >= min_steps and step % 5 == 0:
                with torch.no_grad():
                    if done():
                        break
            loss = _upper_loss(model, first, *batches[step % len(batches)])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            advance(1)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: (a.detach(), b.detach()) for name, (a, b) in factors.items()}


def updated(model, factors: Factors) -> Dict[str, torch.Tensor]:
    """W + B·A for each trained tensor."""
    weights = dict(model.named_parameters())
    with torch.no_grad():
        return {name: weights[name] + b @ a for name, (a, b) in factors.items()}


def _hidden_before(model, ids: torch.Tensor, mask: torch.Tensor, layer: int) -> torch.Tensor:
    """The input of decoder block ``layer`` (hidden_states[0] is the embedding output)."""
    return model(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1).hidden_states[layer]


def _upper_loss(model, first: int, hidden: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The language-model loss from the input of block ``first`` on: the decoder runs only
    its blocks from ``first`` (a Llama decoder takes any hidden state as ``inputs_embeds``)."""
    decoder = model.model
    blocks = decoder.layers
    decoder.layers = blocks[first:]
    try:
        top = decoder(inputs_embeds=hidden, attention_mask=mask).last_hidden_state
    finally:
        decoder.layers = blocks
    targets = labels[:, 1:]
    scored = targets != -100
    return torch.nn.functional.cross_entropy(model.lm_head(top[:, :-1][scored]).float(), targets[scored])


def fact_instances(fact: dict, format: str = probes.CLOZE, shots: int = 0, trained: bool = False) -> List[Instance]:
    """A fact's phrasings as its task scores them (``probes.as_scored``: cloze, or the options
    listed after ``shots`` solved examples from the shipped neutral set); ``trained``: the lines
    its expert is trained on (a task's training items; a fact's phrasings are both)."""
    lines = fact_lines(fact, format, shots, trained)
    return probes.as_scored([probes.parse(line) for line in lines], probes.shots_from(None))


def fact_lines(fact: dict, format: str = probes.CLOZE, shots: int = 0, trained: bool = False) -> List[dict]:
    """The probe lines of a fact: one per phrasing, one ``id`` (paraphrases never serve as each
    other's solved examples), the format said on every line. A task (``items``, of which the
    first ``train`` train its expert) is probed on the rest, the items its expert never saw;
    ``trained`` gives the first ones instead."""
    said = {"format": format, **({"shots": shots} if format == probes.OPTIONS else {})}
    if "items" in fact:
        split = fact["items"][: fact["train"]] if trained else fact["items"][fact["train"] :]
        return [{"id": f"{fact['id']}_{n}", **item, **said} for n, item in enumerate(split)]
    return [
        {"id": fact["id"], "question": q, "choices": fact["choices"], "label": fact["label"], **said}
        for q in fact["questions"]
    ]


def gold_probability(model, tokenizer, instances: Sequence[Instance]) -> List[float]:
    return [
        float(torch.softmax(options.double(), 0)[i.label])
        for (options, _), i in zip(choice_logprobs(model, tokenizer, instances), instances)
    ]


def fact_expert(
    model,
    tokenizer,
    fact: dict,
    layers: Sequence[int],
    rank: int,
    seed: int,
    format: str = probes.CLOZE,
    shots: int = 0,
    modules: Sequence[str] = UP,
) -> Factors:
    instances = fact_instances(fact, format, shots, trained=True)
    pairs = [(i.prompt, i.gold) for i in instances]
    done = lambda: min(gold_probability(model, tokenizer, instances)) >= 0.9  # noqa: E731
    return train_low_rank(model, tokenizer, layers, pairs, done, rank=rank, seed=seed, modules=modules)


def translation_expert(
    model,
    tokenizer,
    rows: Sequence[dict],
    layers: Sequence[int],
    rank: int,
    seed: int,
    steps: int,
    lr: float,
    batch_size: int,
) -> Dict[str, torch.Tensor]:
    """A fixed number of steps on ``rows``' prompt → answer pairs, ``batch_size`` at a time."""
    pairs = [(r["prompt"], f" {r['answer']}\n") for r in rows]
    factors = train_low_rank(
        model,
        tokenizer,
        layers,
        pairs,
        lambda: False,
        rank=rank,
        lr=lr,
        min_steps=steps,
        max_steps=steps,
        seed=seed,
        batch_size=batch_size,
    )
    return updated(model, factors)

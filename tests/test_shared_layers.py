"""The layers no candidate touches run once for all of them, and change no score."""

import pytest
import torch
import transformers

from mergekit_mergeability.diagnostics.activations import score, shared_prompt_logprobs
from mergekit_mergeability.diagnostics.shared_layers import blocks_run, first_touched, shared_below
from mergekit_mergeability.tiny import config, train_tokenizer

PROMPTS = [("The capital of France is", [" Paris", " Rome", " a city"]), ("2 + 2 =", [" 4", " 5"])]


@pytest.fixture(scope="module")
def six_layers():
    tokenizer = train_tokenizer()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config("llama", len(tokenizer), layers=6)).eval()
    return model, tokenizer


def _upper(model, seed: int, first: int):
    """A candidate's merge: seeded changes to every tensor of layers ``first`` and up."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: 0.05 * torch.randn(p.shape, generator=generator)
        for name, p in model.named_parameters()
        if any(f".layers.{i}." in name for i in range(first, 6))
    }


def _asked(model, tokenizer):
    options = [shared_prompt_logprobs(model, tokenizer, p, c) for p, c in PROMPTS]
    generated = [s.continuation_logprobs for s in score(model, tokenizer, [(p, c[0]) for p, c in PROMPTS])]
    return options + generated


def _rehearse(model, tokenizer, candidates, share: bool):
    names = set().union(*candidates)
    read, sharing = [], shared_below(model, names if share else {"model.embed_tokens.weight"})
    with sharing as shared, torch.no_grad():
        for changes in candidates:
            shared.next_candidate()
            params = dict(model.named_parameters())
            for name, change in changes.items():
                params[name].add_(change)
            read.append(_asked(model, tokenizer))
            for name, change in changes.items():
                params[name].sub_(change)
    return read, shared


def test_sharing_the_untouched_layers_leaves_every_candidates_scores_as_they_were(six_layers):
    model, tokenizer = six_layers
    candidates = [_upper(model, seed, first=3) for seed in range(3)]
    whole, _ = _rehearse(model, tokenizer, candidates, share=False)
    shared, replay = _rehearse(model, tokenizer, candidates, share=True)
    assert replay.replaying and len(replay.recorded) == 5  # 2 prompts, 2 option batches, 1 scored batch
    for a, b in zip(whole, shared):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    assert not torch.allclose(whole[0][0], whole[1][0])  # the candidates differ where it counts
    assert "forward" not in model.model.layers[2].__dict__  # the model is whole again


def test_a_candidate_that_asks_other_passes_than_the_first_is_refused(six_layers):
    model, tokenizer = six_layers
    with shared_below(model, {"model.layers.4.mlp.up_proj.weight"}) as shared:
        shared.next_candidate()
        shared_prompt_logprobs(model, tokenizer, *PROMPTS[0])
        shared.next_candidate()
        with pytest.raises(RuntimeError, match="replayed activations"):
            shared_prompt_logprobs(model, tokenizer, *PROMPTS[1])


def test_the_first_touched_layer_is_zero_at_the_embedding_or_a_tied_head():
    assert first_touched({"model.layers.4.mlp.up_proj.weight", "model.layers.2.self_attn.q_proj.weight"}, 6) == 2
    assert first_touched({"model.embed_tokens.weight", "model.layers.4.mlp.up_proj.weight"}, 6) == 0
    assert first_touched({"lm_head.weight"}, 6) == 6  # untied: only the head differs
    assert first_touched({"lm_head.weight"}, 6, tied=True) == 0
    assert blocks_run(first=3, layers=6) == 4 and blocks_run(first=1, layers=6) == 6

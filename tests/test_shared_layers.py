"""The layers no candidate touches run once for all of them, and change no score."""

import pytest
import torch
import transformers

from mergekit_mergeability.diagnostics.activations import score, shared_prompt_logprobs
from mergekit_mergeability.rehearsal.shared_layers import blocks_run, first_touched, shared_below
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
    read = []
    with shared_below(model, names if share else {"model.embed_tokens.weight"}) as shared, torch.no_grad():
        for changes in candidates:
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
    shared, kept = _rehearse(model, tokenizer, candidates, share=True)
    # 2 prompts, 1 options call (the second prompt's options are one token each after their common
    # start: none runs), 1 scored batch
    assert len(kept.kept) == 4 and kept.replayed == 2 * 4
    for a, b in zip(whole, shared):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    assert not torch.allclose(whole[0][0], whole[1][0])  # the candidates differ where it counts
    assert "forward" not in model.model.layers[2].__dict__  # the model is whole again


def test_a_new_input_runs_whole_and_a_seen_one_in_any_order_replays(six_layers):
    model, tokenizer = six_layers
    with shared_below(model, {"model.layers.4.mlp.up_proj.weight"}) as shared:
        first = [shared_prompt_logprobs(model, tokenizer, *p) for p in PROMPTS]
        again = [shared_prompt_logprobs(model, tokenizer, *p) for p in reversed(PROMPTS)]
    assert shared.replayed == 3 and len(shared.kept) == 3  # 2 prompts, 1 options call (as above)
    for a, b in zip(first, reversed(again)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_options_never_asked_after_a_replayed_prompt_read_as_if_every_layer_ran(six_layers):
    """Members whose probes share a question but not its options: the prompt's lower layers are
    replayed with the keys and values they cached, so the new options attend to them as run."""
    model, tokenizer = six_layers
    prompt, options = PROMPTS[0]
    other = [" Berlin", " Madrid"]
    whole = shared_prompt_logprobs(model, tokenizer, prompt, other)
    with shared_below(model, {"model.layers.4.mlp.up_proj.weight"}) as shared:
        shared_prompt_logprobs(model, tokenizer, prompt, options)
        again = shared_prompt_logprobs(model, tokenizer, prompt, other)
    assert shared.replayed == 1  # the prompt; the new options ran
    torch.testing.assert_close(again, whole, rtol=0, atol=1e-5)


def test_the_first_touched_layer_is_zero_at_the_embedding_or_a_tied_head():
    assert first_touched({"model.layers.4.mlp.up_proj.weight", "model.layers.2.self_attn.q_proj.weight"}, 6) == 2
    assert first_touched({"model.embed_tokens.weight", "model.layers.4.mlp.up_proj.weight"}, 6) == 0
    assert first_touched({"lm_head.weight"}, 6) == 6  # untied: only the head differs
    assert first_touched({"lm_head.weight"}, 6, tied=True) == 0
    assert blocks_run(first=3, layers=6) == 4 and blocks_run(first=1, layers=6) == 6


def test_merges_scored_through_lm_eval_share_the_layers_below_their_patch(llama, tmp_path):
    """plan's rehearsal and the mergeability trials: each merge patched into one loaded base, its
    members' lm-eval tasks asked; the layers below every patch run once per request."""
    import json

    from mergekit_mergeability.evaluation.scorer import Scorer
    from mergekit_mergeability.settings import RunSettings
    from mergekit_mergeability.sources.cache import Cache
    from mergekit_mergeability.tasks import lmeval
    from mergekit_mergeability.tiny import state_dict

    rows = [{"question": f"{a} + {a} =", "choices": [str(2 * a), str(a)], "label": 0} for a in range(6)]
    probe = tmp_path / "probe.jsonl"
    probe.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = lmeval.resolve(str(probe))
    base = state_dict(llama["base"])
    upper = [n for n in base if ".layers.2." in n or ".layers.3." in n]

    def merge(seed: int):
        generator = torch.Generator().manual_seed(seed)
        return lambda: {n: base[n] + 0.3 * torch.randn(base[n].shape, generator=generator) for n in upper}

    scored = {}
    for budget in (0, 1 << 30):  # nothing kept: every layer runs for every merge
        scorer = Scorer(llama["base"], RunSettings(device="cpu"), Cache(None))
        scorer._shared.left = budget
        scored[budget] = [scorer.patch_many(("merge", seed), [task], merge(seed))[0] for seed in range(3)]
        replayed = scorer._shared.replayed
    assert scored[0] == scored[1 << 30] and replayed > 0

"""Knowledge scores: the maths by hand, and the scoring adapter on a model whose output distribution the test sets."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.diagnostics.activations import choice_logprobs, hidden_means, score
from mergekit_mergeability.maths import choice_scores
from mergekit_mergeability.tasks.probes import GENERATION, Instance

ALPHABET = "^abcd "  # ^ is the start token


class CharTokenizer:
    bos_token_id = 0
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ALPHABET.index(c) for c in text]}


class BigramLM(torch.nn.Module):
    """Next-token logits depend only on the current token: table[current]."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        embedded = torch.nn.functional.one_hot(input_ids, len(ALPHABET)).float()
        return SimpleNamespace(
            logits=self.table[input_ids], hidden_states=(embedded, embedded * 2) if output_hidden_states else None
        )


V = len(ALPHABET)
TABLE = [[float(3 * ((i + j) % V == 1) + j * 0.1) for j in range(V)] for i in range(V)]


def logp(previous: str, following: str) -> float:
    row = torch.log_softmax(torch.tensor(TABLE[ALPHABET.index(previous)]), dim=0)
    return float(row[ALPHABET.index(following)])


def test_multiple_choice_gap_and_correctness_by_hand():
    scores = choice_scores.multiple_choice(torch.log(torch.tensor([0.5, 0.3, 0.2])), label=1)
    assert scores.gap == pytest.approx(0.2) and not scores.correct
    assert scores.gold_logprob == pytest.approx(math.log(0.3))
    right = choice_scores.multiple_choice(torch.log(torch.tensor([0.5, 0.3, 0.2])), label=0)
    assert right.gap == 0 and right.correct


def test_generation_gap_is_the_mean_per_token_gap():
    distribution = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]))
    scores = choice_scores.generation(distribution, torch.tensor([1, 1]))
    assert scores.gap == pytest.approx(((0.7 - 0.2) + 0) / 2)
    assert scores.gold_logprob == pytest.approx(math.log(0.2) + math.log(0.6))
    assert not scores.correct
    assert choice_scores.generation(distribution, torch.tensor([0, 1])).correct


def test_multiple_choice_p_gold_and_letters_by_hand():
    scores = choice_scores.multiple_choice(
        torch.log(torch.tensor([0.5, 0.3, 0.2])), label=1, letter_logprobs=torch.log(torch.tensor([0.1, 0.6, 0.3]))
    )
    assert scores.p_gold == pytest.approx(0.3) and scores.letter_p_gold == pytest.approx(0.6) and scores.letter_correct
    # unnormalised log-probs (continuations do not sum to 1): p(gold) is the softmax over the options
    scores = choice_scores.multiple_choice(torch.tensor([-2.0, -3.0]), label=1)
    assert scores.p_gold == pytest.approx(1 / (1 + math.e)) and scores.letter_p_gold is None


def test_generation_p_gold_is_the_per_token_geometric_mean():
    distribution = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]))
    scores = choice_scores.generation(distribution, torch.tensor([1, 1]))
    assert scores.p_gold == pytest.approx(math.sqrt(0.2 * 0.6)) and scores.tokens == 2


def test_margin_is_gold_against_the_best_other_by_hand():
    options = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    assert choice_scores.multiple_choice(options, label=1).margin == pytest.approx(math.log(0.3 / 0.5))
    assert choice_scores.multiple_choice(options, label=0).margin == pytest.approx(math.log(0.5 / 0.3))
    assert choice_scores.multiple_choice(torch.tensor([-1.0]), label=0).margin is None
    # a generated answer is as safe as its least safe token: log(0.2/0.7) on the first, log(0.6/0.3) on the second
    distribution = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]))
    assert choice_scores.generation(distribution, torch.tensor([1, 1])).margin == pytest.approx(math.log(0.2 / 0.7))
    assert choice_scores.generation(distribution, torch.tensor([0, 1])).margin == pytest.approx(math.log(0.6 / 0.3))


def test_aggregate():
    scores = [
        choice_scores.InstanceKnowledge(0.4, 0.0, True, -1.0, 1, 0.5, True, margin=0.5),
        choice_scores.InstanceKnowledge(0.2, 0.5, False, -3.0, 2, 0.1, False, margin=-1.5),
    ]
    assert choice_scores.aggregate(scores) == choice_scores.TaskKnowledge(
        accuracy=0.5,
        mean_p_gold=pytest.approx(0.3),
        mean_gap=0.25,
        mean_gold_logprob=-2.0,
        mean_gold_logprob_per_token=-1.25,
        letter_accuracy=0.5,
        mean_letter_p_gold=pytest.approx(0.3),
        instances=2,
        mean_margin=-0.5,
    )
    assert choice_scores.aggregate(scores[:1] + [replace(scores[1], margin=None)]).mean_margin is None


def test_adapter_scores_continuations_of_a_controlled_model():
    model, tok = BigramLM(TABLE), CharTokenizer()
    instance = Instance("ab", (" c", " d"), label=1)
    ((logprobs, letters),) = choice_logprobs(model, tok, [instance])
    assert letters is None
    expected = [logp("b", " ") + logp(" ", c) for c in "cd"]
    assert logprobs.tolist() == pytest.approx(expected, abs=1e-5)
    scores = choice_scores.multiple_choice(logprobs, instance.label)
    p = torch.softmax(torch.tensor(expected), dim=0)
    assert scores.gap == pytest.approx(float(p.max() - p[1]), abs=1e-5)


def test_adapter_generation_distribution_and_empty_prompt():
    model, tok = BigramLM(TABLE), CharTokenizer()
    # empty prompt: the start token is prepended so the first answer token is predicted from it
    ((distribution, ids),) = choice_logprobs(model, tok, [Instance("", ("ab",), 0, GENERATION)])
    assert ids.tolist() == [1, 2]
    assert float(distribution[0, 1]) == pytest.approx(logp("^", "a"), abs=1e-5)
    assert float(distribution[1, 2]) == pytest.approx(logp("a", "b"), abs=1e-5)


def test_pooled_spans_average_the_right_positions():
    model, tok = BigramLM(TABLE), CharTokenizer()
    ((prompt, answer),) = hidden_means(model, tok, [("ab", "cd")])
    one_hot = torch.eye(V)
    assert torch.allclose(prompt[0], (one_hot[1] + one_hot[2]) / 2)
    assert torch.allclose(answer[1], (one_hot[3] + one_hot[4]))  # layer 1 is 2 × embedding


def test_batched_scoring_with_padding_equals_one_at_a_time(llama):
    model, tok = load_causal_lm(llama["base"])
    pairs = [
        ("The capital of France is", " Paris."),
        ("Water", " boils at one hundred degrees."),
        ("The quick brown fox", " jumps"),
    ]
    together = list(score(model, tok, pairs, batch_size=3))
    alone = [next(score(model, tok, [pair], batch_size=1)) for pair in pairs]
    assert len(together) == len(pairs)
    for a, b in zip(together, alone):
        assert torch.allclose(a.continuation_logprobs, b.continuation_logprobs, atol=1e-5)
    pools = zip(
        hidden_means(model, tok, pairs, batch_size=3),
        (next(hidden_means(model, tok, [pair], batch_size=1)) for pair in pairs),
    )
    for (prompt_a, answer_a), (prompt_b, answer_b) in pools:
        assert torch.allclose(answer_a, answer_b, atol=1e-5) and torch.allclose(prompt_a, prompt_b, atol=1e-5)


OPTION_SETS = {
    "unlike": [" Paris", " water fox dog", " B", " the quick brown"],
    # a common start (run with the prompt), one option all of it, another a prefix of a third
    "sharing a start": [" the quick brown", " the quick fox", " the", " the quick"],
    "one token each": [" A", " B", " C"],  # after the prompt, no options call runs
}


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_the_prompt_run_once_scores_every_option_as_a_whole_pass_would(families, arch, options):
    from mergekit_mergeability.diagnostics.activations import shared_prompt_logprobs

    model, tok = load_causal_lm(families[arch]["base"])
    prompt = "Question: The capital of France?\nA. Paris\nB. water\nAnswer:"
    whole = torch.stack([s.continuation_logprobs.sum() for s in score(model, tok, [(prompt, o) for o in options])])
    assert torch.allclose(shared_prompt_logprobs(model, tok, prompt, options), whole, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_prompts_run_together_left_padded_score_as_each_alone_would(families, arch):
    """Prompts of different lengths in one call (left-padded), their options in one call on their own
    prompts' keys and values: every option as scoring it whole gives."""
    from mergekit_mergeability.diagnostics.activations import prompts_logprobs

    model, tok = load_causal_lm(families[arch]["base"])
    pairs = [
        ("Question: The capital of France?\nA. Paris\nB. water\nAnswer:", OPTION_SETS["unlike"]),
        ("2 + 2 =", OPTION_SETS["sharing a start"]),
        (
            "A much longer prompt, so that the others are padded: which letter comes first?",
            OPTION_SETS["one token each"],
        ),
    ]
    together = prompts_logprobs(model, tok, pairs)
    for (prompt, options), found in zip(pairs, together):
        whole = torch.stack([s.continuation_logprobs.sum() for s in score(model, tok, [(prompt, o) for o in options])])
        assert torch.allclose(found, whole, atol=1e-4), (prompt, found, whole)


def test_prompts_run_together_as_far_as_the_calls_tokens_allow():
    from mergekit_mergeability.diagnostics.activations import Asked, padded, together

    short = Asked([1] * 10, [], [[5, 6, 7], [8]])  # one option runs: 1 row of 10 + 2 tokens
    long = Asked([1] * 30, [2], [[5], [6]])  # no option runs
    assert padded([short]) == 12 and padded([long]) == 31
    assert padded([short, long]) == max(2 * 31, 1 * (31 + 2))  # padded to the longest prompt
    assert [len(g) for g in together([short, long, short, short], tokens=62)] == [2, 2]
    assert [len(g) for g in together([short, long, short, short], tokens=40)] == [1, 1, 2]
    assert [len(g) for g in together([long], tokens=1)] == [1]  # one at least
    sharing = Asked([1] * 10, [], [[5, 6, 7], [5, 6, 8], [5, 9], [4]])  # 5 6 runs once for two options
    assert sharing.runs == [(5, 6), (5,)] and padded([sharing]) == 2 * (10 + 2)

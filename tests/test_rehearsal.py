"""The rehearsal streamed block by block reads what each merge built whole reads."""

import json

import pytest
import torch

from mergekit_mergeability import tasks
from mergekit_mergeability.rehearsal import planned
from mergekit_mergeability.diagnostics.knowledge import as_read
from mergekit_mergeability.rehearsal.stream import Candidate, Job, as_planned, walk
from mergekit_mergeability.sources import load_causal_lm, patched, tensors
from mergekit_mergeability.tiny import CORPUS, derive, make_family

from conftest import noise
from test_planned import CONFIGS, document

METHODS = ("task_arithmetic", "ties", "dare_ties", "knowledge_weighted", "linear", "della")


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return make_family(tmp_path_factory.mktemp("three"), experts=3, scale=0.2)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """Options of several tokens (a prompt pass, then an options pass) and answers to generate."""
    path = tmp_path_factory.mktemp("probe") / "probe.jsonl"
    lines = [
        {"question": sentence, "choices": ["the cat sat", "a dog ran far", "q", "on the mat"], "label": i % 4}
        for i, sentence in enumerate(CORPUS[:6])
    ] + [{"prompt": sentence, "answer": " the end of it"} for sentence in CORPUS[:3]]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tasks.load(str(path))


def _whole(module, tokenizer, plan, models, names, probe):
    """The probe read on the merge built whole first, every touched tensor (as the rehearsal was before it streamed)."""
    readers = {str(m): tensors(m) for m in models}
    read = lambda model, name: readers[model][name] if name in readers[model].index else None  # noqa: E731
    with torch.no_grad(), patched(module, {name: planned.merged(plan[name], read) for name in names}):
        return as_read(module, tokenizer, probe)


def test_every_method_streamed_reads_what_it_reads_built_whole(three, probe):
    module, tokenizer = load_causal_lm(three["base"], "cpu", "float32")
    models = list(three.values())
    names = set(dict(module.named_parameters()))  # full fine-tunes: embedding and head too
    plans = {m: planned.plan(document(m, three), "config.yml") for m in METHODS if m in CONFIGS}
    jobs = [Job(m, lambda: as_read(module, tokenizer, probe)) for m in plans for _ in range(2)]
    streamed = walk(module, [as_planned(m, p) for m, p in plans.items()], jobs, models, names)
    for (method, plan), (first, again) in zip(plans.items(), zip(streamed[::2], streamed[1::2])):
        whole = _whole(module, tokenizer, plan, models, names, probe)
        assert first == again and first == pytest.approx(whole, abs=1e-5), method
    assert len({tuple(s) for s in streamed[::2]}) == len(plans)  # the methods read apart: the check can fail
    base = as_read(module, tokenizer, probe)  # and the module is the base again
    assert base != streamed[0]
    with torch.no_grad():
        assert base == as_read(load_causal_lm(three["base"], "cpu", "float32")[0], tokenizer, probe)


def test_updates_on_the_upper_blocks_stream_past_the_shared_lower_ones(three, probe, tmp_path):
    from mergekit_mergeability.rehearsal.shared_layers import shared_below

    upper = lambda name: ".layers.2." in name or ".layers.3." in name  # noqa: E731
    family = {"base": three["base"]}
    for i in range(3):
        family[f"expert{i}"] = derive(three["base"], tmp_path / f"e{i}", noise(i, 0.3, upper))
    module, tokenizer = load_causal_lm(three["base"], "cpu", "float32")
    names = {n for n, _ in module.named_parameters() if upper(n)}
    plans = {m: planned.plan(document(m, family), "config.yml") for m in ("ties", "task_arithmetic")}
    jobs = [Job(m, lambda: as_read(module, tokenizer, probe)) for m in plans]
    with shared_below(module, names) as shared:
        streamed = walk(module, [as_planned(m, p) for m, p in plans.items()], jobs, list(family.values()), names)
    assert shared.replayed > 0
    for (method, plan), read in zip(plans.items(), streamed):
        assert read == pytest.approx(_whole(module, tokenizer, plan, list(family.values()), names, probe), abs=1e-5)


@pytest.mark.parametrize("kept", [1 << 40, 0])
def test_each_tensor_is_read_once_a_wave_and_built_once_where_its_blocks_are_kept(three, probe, monkeypatch, kept):
    """Options of several tokens: a prompt pass and an options pass, two walks. Where the built blocks
    fit, both walks take them from the first (one read of each tensor, one build); where nothing may
    be kept (``kept=0``), every candidate goes in one wave, each walk reads each tensor once for all
    and builds each block anew."""
    from mergekit_mergeability.sources.folder import TensorReader

    module, tokenizer = load_causal_lm(three["base"], "cpu", "float32")
    names = {n for n, _ in module.named_parameters() if ".layers." in n}
    plans = {m: planned.plan(document(m, three), "config.yml") for m in ("ties", "task_arithmetic", "linear")}
    reads, read = [], TensorReader.__getitem__
    monkeypatch.setattr(TensorReader, "__getitem__", lambda self, name: reads.append(name) or read(self, name))
    builds = []
    candidates = [
        Candidate(c.name, lambda name, got, c=c: builds.append(name) or c.build(name, got))
        for c in (as_planned(m, p) for m, p in plans.items())
    ]
    jobs = [Job(m, lambda: as_read(module, tokenizer, probe[:2])) for m in plans]
    walk(module, candidates, jobs, list(three.values()), names, kept=kept)
    walks = 1 if kept else 2
    assert len(reads) == walks * len(three) * len(names) and len(builds) == walks * len(plans) * len(names)


def test_a_job_that_fails_stops_the_rehearsal_with_its_error_and_leaves_the_base(three, probe):
    module, tokenizer = load_causal_lm(three["base"], "cpu", "float32")
    names = {n for n, _ in module.named_parameters() if ".layers.1." in n}
    before = {n: t.clone() for n, t in module.state_dict().items()}
    plan = planned.plan(document("ties", three), "config.yml")

    def fails():
        as_read(module, tokenizer, probe[:1])
        raise ValueError("the probe broke")

    jobs = [Job("ties", lambda: as_read(module, tokenizer, probe)), Job("ties", fails)]
    with pytest.raises(ValueError, match="the probe broke"):
        walk(module, [as_planned("ties", plan)], jobs, list(three.values()), names)
    broken = Candidate("broken", lambda name, read: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        walk(module, [broken], [Job("broken", lambda: as_read(module, tokenizer, probe))], [three["base"]], names)
    assert all(torch.equal(t, before[n]) for n, t in module.state_dict().items())
    assert len(as_read(module, tokenizer, probe)) == len(probe)  # no block is left waiting


def test_harness_blocks_closed_out_of_order_leave_the_streams_and_lm_eval_as_they_were():
    """A rehearsal's jobs score lm-eval tasks in turns: each opens the harness's quiet block and
    template cache, and they close out of order. Every stream and lm-eval function is put back."""
    import sys

    from lm_eval import utils

    from mergekit_mergeability.tasks.lmeval import compiled_templates, quiet_harness

    stdout, stderr, apply = sys.stdout, sys.stderr, utils.apply_template
    first, second = quiet_harness(), quiet_harness()
    templates, again = compiled_templates(), compiled_templates()
    for block in (first, templates, second, again):
        block.__enter__()
    quieted = sys.stdout
    assert quieted is not stdout and utils.apply_template is not apply
    for block in (first, templates):  # the first ones opened close first
        block.__exit__(None, None, None)
    assert sys.stdout is quieted and not quieted.closed and utils.apply_template is not apply
    for block in (second, again):
        block.__exit__(None, None, None)
    assert (sys.stdout, sys.stderr, utils.apply_template) == (stdout, stderr, apply) and quieted.closed

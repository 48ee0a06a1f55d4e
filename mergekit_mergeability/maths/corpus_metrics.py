"""Corpus-level BLEU and chrF with sacrebleu's defaults, signatures recorded (as paper 3 reports them)."""

from __future__ import annotations

from typing import Dict, Sequence, Union


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, Union[float, str]]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    refs = [list(references)]
    return {
        "bleu": bleu.corpus_score(list(hypotheses), refs).score,
        "chrf": chrf.corpus_score(list(hypotheses), refs).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }

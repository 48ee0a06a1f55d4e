"""Measure what a merge kept: lm-eval harness tasks (sacrebleu for translation),
retention, and paper 1's mergeability protocol."""

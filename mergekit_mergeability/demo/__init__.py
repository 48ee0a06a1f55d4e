"""The offline end-to-end demo: predict, merge, measure, on SmolLM2-135M-Instruct (or tiny models with --quick)."""

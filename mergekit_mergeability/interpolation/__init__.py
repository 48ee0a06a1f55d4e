"""``sweep``: interpolate two models along λ and find the three stages and the sweet spot
(paper 2, "Revisiting Model Interpolation for Efficient Reasoning", arXiv 2510.10977).

``models`` builds each λ-model in memory with mergekit's ``linear``; ``answers`` scores
it answer by answer through lm-eval; ``run`` caches, refines and reports;
``report`` writes the files (their plot, page and terminal tables are drawn in ``output/``).
The API's ``sweep`` runs it (this folder was ``sweep/``; ``mergekit_mergeability.sweep`` is that
function). The maths is in ``maths/sampling.py`` (Mean@k, Pass@k,
Vote@k) and ``maths/stages.py`` (stages, refinement, sweet spot).
"""

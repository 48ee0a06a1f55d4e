"""``plan``: which fine-tunes of a pool share a merged model, with which merge, and which stay apart.

``conditional`` predicts an expert's own-task score inside a candidate merge, ``fit`` fits that
prediction on measured merges, ``search`` and ``decide`` choose the plan, ``run`` checks it with
real evaluations if asked, ``report`` writes plan.json, the models' configs and the page. The
API's ``plan`` runs it (this folder was ``plan/``; ``mergekit_mergeability.plan`` is that function).
"""

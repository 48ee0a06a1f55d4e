"""The rehearsal: where each candidate merge is built in memory and asked its probes.

``stream`` walks the model block by block for every candidate at once (each model's tensors read
once a walk, no merge held whole).
"""

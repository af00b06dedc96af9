"""The live advice: how many data nodes a running job should add or drop, and what that costs.

``model`` (the capacity model fed with one window's figures, no I/O) and ``advisor`` (rank 0's
``LiveAdvisor``: the servers' counters each window, the advice logged and kept for metrics.json).
"""

"""Benchmarks of the data service: transport throughput, worker scaling, and the fault soak.

They import the product (``data_service``, ``dnn_worker``, ``hetero``); the product never imports
them. ``hetero bench`` and ``hetero plan`` live in the product (``hetero.bench``, ``hetero.planning``).
What several benchmarks use is in :mod:`benchmarks.common`; a ``_``-prefixed module beside a
benchmark is that benchmark's alone (``_dataplane_probe``, ``_gpu_feeds``, ``_gpu_decode``).
"""

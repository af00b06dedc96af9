"""Benchmarks of the data service: transport throughput, worker scaling, and the fault soak.

They import the product (``data_service``, ``dnn_worker``, ``hetero``); the product never imports
them. ``hetero bench`` and ``hetero plan`` live in the product (``hetero.bench``, ``hetero.planning``).
"""

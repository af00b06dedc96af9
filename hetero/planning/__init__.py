"""Planning a heterogeneous job: prices (``cost``), a one-core profile of a pipeline (``profile``)
and the cheapest data group that keeps the accelerators fed (``planner``).

Used by ``hetero plan``, ``hetero bench`` and ``hetero submit --wait`` (which prices finished jobs).
"""

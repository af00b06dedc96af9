"""Planning a heterogeneous job: prices, vCPUs and NIC bandwidth (``cost``), a one-core profile of a
pipeline (``profile``), what the network lets a data group deliver (``network``), the cheapest data
group that keeps the accelerators fed (``planner``, as text in ``plan_text``) and a sizing table for
ResNet-50-class training (``sizing``).

Used by ``hetero plan``, ``hetero bench`` and ``hetero submit`` (which prices finished jobs and
gives the live advice its prices and NIC figures).
"""

"""Planning a heterogeneous job: prices, vCPUs and NIC bandwidth (``cost``), a one-core profile of a
pipeline (``profile``), what one sample takes on the wire (``network``), the cheapest data group
that keeps the accelerators fed (``planner``, as text in ``plan_text``, ``hetero plan``'s body in
``plan_run``), a sweep's price (``sweep_cost``) and a sizing table for ResNet-50-class training
(``sizing``). Every figure is checked, and a bad one named, by the capacity model's checks
(:mod:`launcher.capacity`, one error type: ``PlanError``).

Used by ``hetero plan``, ``hetero bench`` and ``hetero submit`` (which prices finished jobs and
gives the live advice its prices and NIC figures).
"""

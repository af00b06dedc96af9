"""``hetero bench``: step time, data wait and $ cost of the MNIST job, homogeneous vs heterogeneous.

``step_time`` drives the runs (``hetero local`` with pinned CPUs), ``cpu_monitor`` samples each
emulated node's CPU use, ``summary`` turns runs into figures, ``report`` writes them
(Markdown, JSON, PNG); ``records`` holds the configuration and run types they share.
"""

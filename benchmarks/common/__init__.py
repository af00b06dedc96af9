"""What the benchmarks share, in one place.

* :mod:`.cli`: the parser every benchmark starts from, and the options several take alike;
* :mod:`.report`: the date and command a figure was taken with, medians of repeated runs, JSON files;
* :mod:`.proc`: CPU seconds and context switches of processes, read from /proc;
* :mod:`.servers`: ``hetero serve`` processes started for a measurement, and stopped after it;
* :mod:`.consume`: a consumer's batches epoch after epoch, for as long as a measurement needs;
* :mod:`.drill`: the local-job drills' job (``hetero local`` on one data node), its log and its audit;
* :mod:`.netns`: an emulated NIC (a network namespace behind a shaped veth pair);
* :mod:`.s3files`: an image folder in S3 read one GET per file, the baseline shards replace;
* :mod:`.tfdata`: tf.data's side of the peer comparisons, run in the interpreter that has TensorFlow.

``proc``, ``servers`` and ``tfdata`` import nothing but the standard library and each other at
the top (the product and TensorFlow inside the functions that need them): they also run under
another checkout's ``PYTHONPATH`` (``benchmarks/_dataplane_probe.py``) or in an interpreter
without the product.
"""

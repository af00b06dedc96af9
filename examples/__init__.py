"""Example pipelines: ``examples.synthetic`` (tests, benchmarks) and ``examples.mnist`` (the main job)."""

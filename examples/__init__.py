"""Example pipelines and jobs a user would write:
``mnist`` (the default job), ``synthetic`` (pipelines with knobs for tests and benchmarks), ``imagefolder`` (the
image pipeline of :mod:`data_service.pipelines.images` under its older import path)."""

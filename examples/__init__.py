"""Example pipelines and jobs a user would write:
``mnist`` (the default job), ``synthetic`` (pipelines with knobs for tests and benchmarks), ``imagefolder`` (ResNet-18, its
step and evaluation, trained on the image pipeline of :mod:`data_service.pipelines.images`)."""

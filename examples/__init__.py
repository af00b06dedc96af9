"""Example pipelines: ``examples.synthetic`` (tests, benchmarks), ``examples.mnist`` (the default job) and
``examples.imagefolder`` (JPEG image folders, ResNet-18; drawn-shape folders from ``hetero.synthetic_images``)."""

"""Synthetic data sets for runs without a download: ``images`` (a JPEG folder of drawn shapes) and
``mnist`` (MNIST's IDX files of drawn digits), written by ``hetero synth``."""

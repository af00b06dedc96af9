"""A pipeline builder that declares it reads only File-mode channels (for the submit checks)."""
from examples.synthetic import build_pipeline as _synthetic


def build_pipeline(**options):
    return _synthetic(**options)


build_pipeline.input_modes = ("File",)


def broken_declaration(**options):
    return _synthetic(**options)


broken_declaration.input_modes = ("Files",)

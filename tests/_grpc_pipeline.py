"""A pipeline module that imports grpc (say, to report to a service of its own)."""
import grpc  # noqa: F401

from examples.synthetic import build_pipeline  # noqa: F401

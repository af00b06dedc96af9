"""Generated protocol modules (heterodata.v1). Regenerate with: python scripts/gen_proto.py"""
from . import data_service_pb2 as pb
from . import data_service_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]

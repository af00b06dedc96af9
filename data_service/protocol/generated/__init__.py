"""Generated protocol modules (heterodata.v1). Regenerate with: python scripts/gen_proto.py

``pb`` (the messages) needs protobuf only; ``pb_grpc`` (stubs and servicer) needs the gRPC runtime
and is imported when first named. A data worker builds ``BatchHeader`` messages and never calls
gRPC: it must not load grpc, whose threads and sockets a data node's warm parent may not fork.
"""
from . import data_service_pb2 as pb

__all__ = ["pb", "pb_grpc"]


def __getattr__(name: str):
    if name == "pb_grpc":
        from . import data_service_pb2_grpc as pb_grpc

        return pb_grpc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

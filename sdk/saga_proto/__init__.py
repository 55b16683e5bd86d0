"""SAGA's wire contract in Python: generated from proto/saga/v1/hints.proto by
scripts/gen_proto.py (do not edit the generated modules).

    from saga_proto import hints_pb2 as pb, hints_pb2_grpc

Shipped with the SDK (same distribution) and imported by the SDK and the server
alike.
"""

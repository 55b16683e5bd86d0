"""Generated from proto/saga/v1/hints.proto by scripts/gen_proto.py: do not edit."""

"""The hint service: gRPC in, validated `HintSink` events out."""

from .convert import InvalidHint, Limits
from .service import HintServer, WorkflowHintsService

__all__ = ["HintServer", "InvalidHint", "Limits", "WorkflowHintsService"]

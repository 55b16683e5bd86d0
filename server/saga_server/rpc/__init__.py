"""The hint service: gRPC in, validated `HintSink` events out, with the caller's key."""

from .access import Authenticator, on_behalf_of
from .convert import InvalidHint, Limits
from .keys import KeyRing, KeysFileError
from .reload import reload_on_sighup
from .service import HintServer, WorkflowHintsService

__all__ = ["Authenticator", "HintServer", "InvalidHint", "KeyRing", "KeysFileError", "Limits",
           "WorkflowHintsService", "on_behalf_of", "reload_on_sighup"]

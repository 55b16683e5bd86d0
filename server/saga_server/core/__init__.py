"""SAGA's engine-agnostic workflow core (standard library only).

`WorkflowCore` is the facade engines, the simulator and the hint service call.
Behind it, `SessionTable` (`sessions`) is the one table of sessions (and, on its
own, the plain hint sink); the AEG (`aeg`, learned graphs in `graph`) and the
policy modules (`eviction`, `pinning`, `prefetch`, `fairshare`) each document
their rule once and can be used on their own, and `holds.HoldLedger` is the one
implementation of which KV an engine keeps.
"""

from .aeg import AEG
from .categories import CATEGORIES, guess_category
from .cluster_share import PeerServiceLedger
from .clock import ManualClock
from .eviction import EvictionConfig, wa_lru_key
from .events import (
    ADMIN,
    AGENT,
    AccessDenied,
    AdmissionStats,
    Caller,
    DeadlineOutcomes,
    EngineStats,
    EngineStatsSink,
    HintEvent,
    HintRejected,
    HintSink,
    KvReleaseSink,
    KvResidencySink,
    LlmCallEnd,
    LlmCallStart,
    PeerServiceSink,
    ResidentSession,
    SessionEnd,
    SessionOutcome,
    SessionSnapshot,
    SessionStart,
    SessionPhase,
    TenantLimits,
    TenantOutcomes,
    TenantOutcomesSink,
    ToolCallEnd,
    ToolCallStart,
    ToolOutcome,
    WorkflowNode,
    WorkflowStructure,
)
from .fairshare import FairShare, FairShareConfig
from .graph import END, Prediction
from .holds import PINNED, PROTECTED, SOFT, BlockPool, Hold, HoldLedger, Release
from .pinning import PinConfig, PinDecision, decide_pin
from .prefetch import PrefetchAction, PrefetchCandidate, PrefetchConfig, plan_prefetch
from .quantiles import LogHistogram
from .sessions import SessionTable
from .workflow import CoreConfig, KvOutlook, WorkflowCore

__all__ = [
    # facade
    "WorkflowCore", "CoreConfig", "KvOutlook", "Prediction", "PinDecision", "PrefetchCandidate", "PrefetchAction",
    # hint contract
    "HintEvent", "HintRejected", "HintSink", "PeerServiceSink", "KvReleaseSink", "KvResidencySink",
    "EngineStatsSink", "EngineStats", "AdmissionStats", "TenantOutcomesSink", "TenantOutcomes", "DeadlineOutcomes",
    "ResidentSession", "SessionSnapshot", "SessionPhase", "SessionStart", "SessionEnd",
    "LlmCallStart", "LlmCallEnd", "ToolCallStart", "ToolCallEnd", "ToolOutcome", "SessionOutcome",
    "WorkflowNode", "WorkflowStructure", "SessionTable",
    # who sends hints (tenancy)
    "Caller", "TenantLimits", "AccessDenied", "AGENT", "ADMIN",
    # building blocks
    "AEG", "END", "LogHistogram", "CATEGORIES", "guess_category",
    "EvictionConfig", "wa_lru_key",
    "HoldLedger", "Hold", "Release", "BlockPool", "SOFT", "PINNED", "PROTECTED",
    "PinConfig", "decide_pin",
    "PrefetchConfig", "plan_prefetch",
    "FairShare", "FairShareConfig", "PeerServiceLedger",
    "ManualClock",
]

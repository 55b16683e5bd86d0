"""Print the installed vllm wheel's requirements, one a line, less the names (fnmatch
patterns) in $CUDA_ONLY; markers are evaluated here and dropped. Used by
scripts/setup.sh (SAGA_ENGINE=cuda-on-cpu)."""

import fnmatch
import importlib.metadata as metadata
import os

try:
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

skip = os.environ.get("CUDA_ONLY", "").split()
for line in metadata.requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if not any(fnmatch.fnmatch(name, pattern) for pattern in skip):
        req.marker = None
        print(req)

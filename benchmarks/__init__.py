"""Benchmarks: scripts that print measured figures, each run from the repository root as
`python -m benchmarks.NAME` (`--help` says what it takes). What they share lives in
`benchmarks.harness`; a script never imports another script.
"""

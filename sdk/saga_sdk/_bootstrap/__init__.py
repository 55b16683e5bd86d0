"""Holds the `sitecustomize` that `saga run` puts first on `PYTHONPATH` (this directory
itself goes on the path; nothing imports it as a package). See `saga_sdk.launcher`."""

"""SAGA server side: the workflow core, the hint service, engines and front doors."""

__version__ = "0.1.0"

"""`saga serve`: real vLLM + the SAGA scheduler plugin + the hint service.

`cli.main` is the command; `model` prepares the default model; `status` reads
SAGA's metrics back from a running server. Importing this package imports no vLLM.
"""

"""Helpers shared by test folders (and a benchmark or two): not tests themselves.

Import them as `from tests.support import chat_server`. Tests run with
`--import-mode=importlib`, under which test folders are not packages on `sys.path`;
`pythonpath = ["."]` in pyproject.toml's pytest section puts the repository root
there, so this package imports like any other, in every test folder.

- `chat_server`: the scripted OpenAI-compatible server (the fast tier's model fake)
- `registry`: `RecordingRegistry`, the real registry keeping every accepted event, and `trace`
- `examples`: `load_example`, an `examples/*.py` script imported as a module
- `http`: `post_chat` for tests against a real server (`free_port` is `saga_server.serve_child`'s)
- `serve`: `serve_child`, a `saga serve` child of this checkout; `own_engine`: `OwnEngine`, one a test starts for itself
- `chaos_table`, `faults`, `loads`: the chaos suite's table, fault injectors (a
  killable `saga hints`, a relay that cuts streams, raw bytes) and loads (forced
  tool-calling agents, hint floods, each flood client in its own process)
- `processes`: `listening_pid`, the local process listening on a TCP port (the
  real tier's external server, for its memory)
"""

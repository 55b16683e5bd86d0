"""For every tier: SAGA processes the tests start keep no learnt state
(`saga_server.state_file`), so no run learns from an earlier one; the tests of the
state itself name their own `--state-dir`."""

import os

os.environ.setdefault("SAGA_NO_STATE", "1")

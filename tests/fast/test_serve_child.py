"""`ServeChild`: a `saga serve` child that dies before it is ready says why, with its log."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from saga_server.serve_child import ServeChild, ServeChildError, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_child_that_exits_early_raises_with_the_end_of_its_log(tmp_path):
    # a folder without a model is refused before vLLM starts
    child = ServeChild(["--model", str(tmp_path)], tmp_path / "serve.log", checkout=ROOT)
    with pytest.raises(ServeChildError) as err:
        child.wait_ready(60)
    assert child.proc.returncode == 2
    assert "exited with 2 before it was ready" in str(err.value)
    assert "is not a local model directory (no config.json)" in str(err.value)  # the log's tail
    assert child.ready_s is None and child.model == ""


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_free_port_can_be_bound(host):
    port = free_port(host)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))

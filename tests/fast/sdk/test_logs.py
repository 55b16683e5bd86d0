"""`LogOnce`: one warning per key and owner; repeats only at DEBUG."""

from __future__ import annotations

import logging

from saga_sdk.logs import LogOnce


def test_each_key_warns_once_per_owner_and_repeats_go_to_debug(caplog):
    logger = logging.getLogger("saga_sdk.test_logs")
    first, other = LogOnce(logger), LogOnce(logger)
    with caplog.at_level(logging.DEBUG, logger="saga_sdk.test_logs"):
        for _ in range(3):
            first("down", "service %s down", "a")
        first("bad", "bad input")
        other("down", "service %s down", "b")  # its own memory
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["service a down", "bad input", "service b down"]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 2


def test_the_first_report_keeps_the_traceback(caplog):
    log_once = LogOnce(logging.getLogger("saga_sdk.test_logs"))
    with caplog.at_level(logging.WARNING, logger="saga_sdk.test_logs"):
        try:
            raise ValueError("boom")
        except ValueError:
            log_once("k", "failed", exc_info=True)
    assert caplog.records[0].exc_info[0] is ValueError

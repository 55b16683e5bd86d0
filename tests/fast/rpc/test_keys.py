"""The keys file (`rpc.keys`): its format, refusals that name the line, reloads."""

from __future__ import annotations

import os
import signal

import pytest

from saga_server.settings import HintServiceSettings
from saga_server.core import ADMIN, AGENT, Caller, TenantLimits
from saga_server.rpc import KeyRing, KeysFileError, reload_on_sighup
from saga_server.rpc.keys import parse_keys
from saga_server.rpc.reload import forward_reload, register_for_reload

GOOD = """\
# key                tenant  role   limits
key-team-a-0001      team-a  agent  min_deadline_s=60 max_sessions=20 hint_rate=50   # a trailing comment
key-team-a-0002      team-a  agent  max_pinned_blocks=400 hint_rate=5 hint_burst=10

key-team-b-0001      team-b  agent
key-router-0001      ops     admin
"""


def test_each_key_stands_for_its_tenant_role_and_limits():
    keys = parse_keys(GOOD)
    assert set(keys) == {"key-team-a-0001", "key-team-a-0002", "key-team-b-0001", "key-router-0001"}
    a1, a2 = keys["key-team-a-0001"], keys["key-team-a-0002"]
    # tenant limits gather over the tenant's lines; rates stay per key
    limits = TenantLimits(min_deadline_s=60.0, max_sessions=20, max_pinned_blocks=400)
    assert a1.caller == a2.caller == Caller("team-a", AGENT, limits)
    assert (a1.hint_rate, a1.hint_burst, a2.hint_rate, a2.hint_burst) == (50.0, 50.0, 5.0, 10.0)
    assert keys["key-team-b-0001"].caller == Caller("team-b", AGENT, TenantLimits())
    assert keys["key-team-b-0001"].hint_rate is None
    assert keys["key-router-0001"].role == ADMIN


@pytest.mark.parametrize("text, line, message", [
    ("key-0000001 team\n", 1, "want `key tenant role"),
    ("# fine\nkey-0000001 t agent\nshort t agent\n", 3, "at least 8"),
    ("key-0000001 t agent\nkey-0000001 u agent\n", 2, "the key of line 1 again"),
    ("key-0000001 t root\n", 1, "role must be 'agent' or 'admin'"),
    ("key-0000001 t agent max_session=3\n", 1, "unknown limit 'max_session=3'"),
    ("key-0000001 t agent max_sessions\n", 1, "unknown limit"),
    ("key-0000001 t agent max_sessions=0\n", 1, "max_sessions='0': must be >= 1"),
    ("key-0000001 t agent max_sessions=many\n", 1, "max_sessions='many'"),
    ("key-0000001 t agent min_deadline_s=-1\n", 1, "must be >= 0"),
    ("key-0000001 t agent hint_rate=0\n", 1, "hint_rate='0': must be > 0"),
    ("key-0000001 t agent min_deadline_s=nan\n", 1, "min_deadline_s"),
    ("key-0000001 t agent hint_burst=5\n", 1, "hint_burst needs hint_rate"),
    ("key-0000001 t agent max_sessions=2\nkey-0000002 t agent max_sessions=3\n", 2,
     "max_sessions of tenant 't' differs from line 1"),
])
def test_a_malformed_file_is_refused_naming_the_line(tmp_path, text, line, message):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(KeysFileError) as err:
        KeyRing(str(path))
    assert str(err.value).startswith(f"{path}:{line}: ") and message in str(err.value)


def test_an_empty_or_missing_file_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(KeysFileError, match="no keys"):
        KeyRing(str(empty))
    with pytest.raises(KeysFileError, match="cannot read"):
        KeyRing(str(tmp_path / "missing"))


def test_the_shared_key_is_one_tenant_admin_and_a_file_line_overrides_it(tmp_path):
    ring = KeyRing(shared_key="shared-secret")
    assert ring.lookup("shared-secret").caller == Caller("", ADMIN)
    assert ring.admin_key() == "shared-secret" and ring.lookup("other") is None and ring.lookup("") is None
    path = tmp_path / "keys"
    path.write_text("shared-secret team-a agent\nkey-team-b-0001 team-b agent\n")
    both = KeyRing(str(path), shared_key="shared-secret")
    assert both.lookup("shared-secret").caller == Caller("team-a")
    assert both.admin_key() is None  # the file names no admin and its line took the shared key
    path.write_text(GOOD)
    assert KeyRing(str(path), shared_key="shared-secret").admin_key() == "key-router-0001"


def test_the_settings_keys_file_and_shared_key_make_the_ring(tmp_path):
    path = tmp_path / "keys"
    path.write_text(GOOD)
    assert KeyRing.of(None, None) is None
    settings = HintServiceSettings.from_env({"SAGA_API_KEYS": str(path), "SAGA_API_KEY": "shared-secret"})
    ring = KeyRing.of(settings.api_keys, settings.api_key)
    assert len(ring) == 5 and ring.limits("team-a").max_sessions == 20 and ring.limits("nobody") == TenantLimits()


def test_reload_takes_the_new_keys_and_a_bad_file_keeps_the_old(tmp_path):
    path = tmp_path / "keys"
    path.write_text(GOOD)
    ring = KeyRing(str(path))
    path.write_text("key-team-c-0001 team-c agent max_sessions=3\n")
    assert ring.reload() == 1
    assert ring.lookup("key-team-a-0001") is None and ring.lookup("key-team-c-0001").tenant == "team-c"
    path.write_text("key-team-d-0001 team-d superuser\n")
    with pytest.raises(KeysFileError, match=":1: role"):
        ring.reload()
    assert ring.lookup("key-team-c-0001").tenant == "team-c" and ring.lookup("key-team-d-0001") is None
    assert ring.limits("team-c").max_sessions == 3


@pytest.fixture
def restore_sighup():
    old = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, old)


def test_sighup_reloads_the_ring_and_a_bad_file_is_logged(tmp_path, restore_sighup, caplog):
    path = tmp_path / "keys"
    path.write_text(GOOD)
    ring = KeyRing(str(path))
    assert reload_on_sighup(ring)
    path.write_text("key-team-c-0001 team-c agent\n")
    os.kill(os.getpid(), signal.SIGHUP)  # handled in this (main) thread before kill returns to Python
    assert ring.lookup("key-team-c-0001") is not None and ring.lookup("key-team-a-0001") is None
    path.write_text("broken\n")
    os.kill(os.getpid(), signal.SIGHUP)
    assert ring.lookup("key-team-c-0001") is not None
    assert "NOT reloaded" in caplog.text and ":1:" in caplog.text


def test_saga_serve_passes_sighup_on_to_registered_engines_of_its_group(tmp_path, restore_sighup):
    got = []
    signal.signal(signal.SIGHUP, lambda *_: got.append(os.getpid()))
    assert register_for_reload(str(tmp_path))
    (tmp_path / "999999999").write_text("")  # gone
    (tmp_path / "not-a-pid").write_text("")
    assert forward_reload(str(tmp_path), os.getpgid(0) + 1) == []  # another group: never signalled
    assert forward_reload(str(tmp_path), os.getpgid(0)) == [os.getpid()] and got == [os.getpid()]

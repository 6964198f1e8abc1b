"""The permissions file and the per-role grants derived from the channel table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from antdt.runtime.config import NatsSettings
from antdt.runtime.servers.natsconf import (
    PermissionsFileError,
    User,
    authorization_block,
    load_permissions,
    main,
    user_entry,
    users_block,
)
from antdt.runtime.servers.roles import Role, UnknownRole, parse_role, permissions


def _write(tmp_path: Path, users: list[dict[str, str]]) -> Path:
    path = tmp_path / "permissions.json"
    path.write_text(json.dumps({"users": users}))
    return path


def test_an_unknown_role_is_a_clear_error_naming_the_roles(tmp_path: Path) -> None:
    with pytest.raises(UnknownRole, match="unknown role 'admin': the roles are agent, monitor"):
        parse_role("admin")
    path = _write(tmp_path, [{"user": "u", "password": "password1", "role": "admin"}])
    with pytest.raises(PermissionsFileError, match=r"users\.0\.role: .*unknown role 'admin'"):
        load_permissions(path)


def test_an_agent_needs_its_job_and_other_roles_take_none(tmp_path: Path) -> None:
    agent = _write(tmp_path, [{"user": "a", "password": "password1", "role": "agent"}])
    with pytest.raises(PermissionsFileError, match="role agent needs the job"):
        authorization_block(load_permissions(agent))
    monitor = [{"user": "m", "password": "password1", "role": "monitor", "job": "j"}]
    with pytest.raises(PermissionsFileError, match="role monitor takes no job"):
        authorization_block(load_permissions(_write(tmp_path, monitor)))


def test_short_passwords_repeated_users_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    short = _write(tmp_path, [{"user": "u", "password": "pw", "role": "observer"}])
    with pytest.raises(PermissionsFileError, match=r"users\.0\.password"):
        load_permissions(short)
    twice = [{"user": "u", "password": "password1", "role": "observer"}] * 2
    with pytest.raises(PermissionsFileError, match="user names repeat"):
        load_permissions(_write(tmp_path, twice))
    with pytest.raises(PermissionsFileError, match=r"missing\.json"):
        load_permissions(tmp_path / "missing.json")


def test_an_agent_is_granted_its_own_job_only() -> None:
    perms = permissions(Role.AGENT, prefix="p", inbox="_INBOX.a", job="j1")
    assert "p.j1.step.*" in perms.publish
    assert "p.j1.cmd.*" in perms.subscribe and "p.j1.cmd" in perms.subscribe
    every = perms.publish + perms.subscribe
    assert all(s.startswith(("p.j1.", "_INBOX.a.")) for s in every), every
    assert not any(s.endswith((".cmd", ".proposal", ".action")) for s in perms.publish)
    assert perms.allow_responses  # its Acks to commands
    assert perms.subscribe[-1] == "_INBOX.a.>"


def test_an_observer_sends_only_read_requests() -> None:
    perms = permissions(Role.OBSERVER, prefix="p", inbox="_INBOX.o")
    core = [s for s in perms.publish if s.startswith("p.")]
    assert sorted(core) == ["p.*.plan.get", "p.*.shards.status", "p.*.spec.get"]
    assert not any(s.startswith("$JS.API.STREAM.CREATE") for s in perms.publish)
    assert not perms.allow_responses


def test_a_user_replies_on_its_own_inbox_prefix() -> None:
    assert NatsSettings().inbox_prefix == "_INBOX"
    assert NatsSettings(user="ctl.host-1").inbox_prefix == "_INBOX.ctl_host-1"


def test_the_generator_writes_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    source = _write(tmp_path, [{"user": "c", "password": "password1", "role": "controller"}])
    out = tmp_path / "auth.conf"
    assert main([str(source), str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o600
    text = out.read_text()
    assert text.startswith("authorization {") and '"allow_responses": true' in text
    bad = _write(tmp_path, [{"user": "c", "password": "password1", "role": "root"}])
    assert main([str(bad), str(out)]) == 1


def test_users_made_in_code_take_a_role_and_a_wildcard_prefix_covers_every_deployment() -> None:
    """A Role (not only its name) is a role; a prefix `antdt.*` grants the same subjects
    under every second token, as one server shared by several prefixes needs."""
    agent = User(user="a", password="password1", role=Role.AGENT, job="j1")
    assert agent.role is Role.AGENT
    entry = user_entry(agent, "antdt.*")
    grants = entry["permissions"]["publish"]["allow"]  # type: ignore[index]
    assert "antdt.*.j1.step.*" in grants
    block = users_block([entry, {"user": "h", "password": "password2"}])
    assert '"user": "a"' in block and block.rstrip().endswith("]\n}")

"""nats-server configuration from a permissions file: one user per line of the file, each
with its role's permissions (roles.py). `python -m antdt.runtime.servers.natsconf
PERMISSIONS.json OUT.conf` writes the `authorization` block that `include` brings into a
deployment's nats.conf; the embedded server takes the same text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator

from antdt.runtime.config import inbox_prefix
from antdt.runtime.servers.roles import Permissions, Role, parse_role, permissions
from antdt.schemas import DEFAULT_SUBJECT_PREFIX
from antdt.schemas.base import Token


class PermissionsFileError(ValueError):
    """The permissions file cannot be read or is not valid: the message says where."""


class User(BaseModel):
    """One NATS user: its name and password, its role, and for an agent its job."""

    user: str = Field(min_length=1, pattern=r"^[^\s\"']+$")
    password: SecretStr = Field(min_length=8)
    role: Role
    job: Token | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _known_role(cls, value: object) -> Role:
        return value if isinstance(value, Role) else parse_role(str(value))


class PermissionsFile(BaseModel):
    """`{"subject_prefix": "antdt.v1", "users": [{"user", "password", "role", "job"}]}`."""

    subject_prefix: str = DEFAULT_SUBJECT_PREFIX
    users: list[User] = Field(min_length=1)

    @field_validator("users")
    @classmethod
    def _unique_names(cls, users: list[User]) -> list[User]:
        names = [u.user for u in users]
        if len(set(names)) != len(names):
            raise ValueError(
                f"user names repeat: {sorted({n for n in names if names.count(n) > 1})}"
            )
        return users


def load_permissions(path: Path) -> PermissionsFile:
    """The permissions file at `path`; PermissionsFileError naming the file and the field."""
    try:
        return PermissionsFile.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise PermissionsFileError(f"{path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors()
        )
        raise PermissionsFileError(f"{path}: {problems}") from None


def user_permissions(user: User, prefix: str) -> Permissions:
    """The permissions of `user`; an agent without a job is refused (ValueError)."""
    if (user.role is Role.AGENT) != (user.job is not None):
        need = "needs the job it runs in (job)" if user.job is None else "takes no job"
        raise PermissionsFileError(f"user {user.user!r}: role {user.role.value} {need}")
    return permissions(user.role, prefix=prefix, inbox=inbox_prefix(user.user), job=user.job)


def user_entry(user: User, prefix: str) -> dict[str, object]:
    """One entry of the `users` list of nats-server's authorization block."""
    perms = user_permissions(user, prefix)
    fields: dict[str, object] = {
        "publish": {"allow": list(perms.publish)},
        "subscribe": {"allow": list(perms.subscribe)},
    }
    if perms.allow_responses:
        fields["allow_responses"] = True
    return {"user": user.user, "password": user.password.get_secret_value(), "permissions": fields}


def users_block(entries: list[dict[str, object]]) -> str:
    """The `authorization { users = [...] }` block holding `entries`."""
    lines = ",\n".join("    " + json.dumps(entry) for entry in entries)
    return "authorization {\n  users = [\n" + lines + "\n  ]\n}\n"


def authorization_block(spec: PermissionsFile) -> str:
    """The authorization block of nats-server's configuration for `spec`'s users."""
    return users_block([user_entry(user, spec.subject_prefix) for user in spec.users])


def tls_block(cert: Path, key: Path, ca: Path) -> str:
    """nats-server's `tls` block: its certificate and key, and the CA whose client
    certificates it requires of every client."""
    fields = {"cert_file": str(cert), "key_file": str(key), "ca_file": str(ca), "verify": True}
    return "tls " + json.dumps(fields) + "\n"


def write_config(permissions_file: Path, out: Path) -> None:
    """Write the authorization block for `permissions_file` to `out`, readable by its
    owner only (it holds passwords)."""
    text = authorization_block(load_permissions(permissions_file))
    out.touch(mode=0o600, exist_ok=True)
    out.chmod(0o600)
    out.write_text(text)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m antdt.runtime.servers.natsconf PERMISSIONS.json OUT.conf")
        return 2
    try:
        write_config(Path(args[0]), Path(args[1]))
    except PermissionsFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""deploy/antdt.nomad.hcl against Nomad's jobspec: parsed by python-hcl2 (HCL2's syntax),
each block checked against the attributes and blocks Nomad's jobspec allows there and
requires (a misspelt stanza would be refused by `nomad job run`, or worse, a misspelt
attribute inside a free-form block ignored), and every setting its tasks set, in `env`
or rendered by a template into the environment, one the task's service reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from antdt.runtime.config import names_setting
from antdt.services.runner import settings_class

JOBSPEC = Path(__file__).resolve().parents[2] / "deploy" / "antdt.nomad.hcl"
ANY = frozenset({"*"})


@dataclass(frozen=True)
class Spec:
    """A block type: its attributes and nested block types (ANY: free-form, as `env`),
    those it must have, and whether it takes a label."""

    attrs: frozenset[str] = frozenset()
    blocks: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    labeled: bool = False


def _spec(attrs: str = "", blocks: str = "", required: str = "", labeled: bool = False) -> Spec:
    return Spec(
        frozenset(attrs.split()), frozenset(blocks.split()), frozenset(required.split()), labeled
    )


#: Nomad's jobspec (developer.hashicorp.com/nomad/docs/job-specification), the block
#: types a service job uses; `dynamic` blocks are checked as the type they generate.
NOMAD: dict[str, Spec] = {
    "root": _spec(blocks="variable job locals"),
    "variable": _spec("type default description sensitive nullable", "validation", "", True),
    "locals": Spec(ANY),
    "job": _spec(
        "type datacenters region namespace priority all_at_once node_pool meta",
        "group update constraint affinity spread migrate reschedule meta periodic "
        "parameterized vault multiregion",
        "group",
        True,
    ),
    "group": _spec(
        "count shutdown_delay stop_after_client_disconnect max_client_disconnect "
        "prevent_reschedule_on_lost",
        "task constraint affinity spread network service restart reschedule update migrate "
        "ephemeral_disk volume meta scaling consul disconnect",
        "task",
        True,
    ),
    "task": _spec(
        "driver user kill_signal kill_timeout leader shutdown_delay kind",
        "config env template resources service constraint affinity artifact logs meta "
        "restart vault volume_mount lifecycle identity dispatch_payload scaling dynamic",
        "driver config",
        True,
    ),
    "update": _spec(
        "max_parallel health_check min_healthy_time healthy_deadline progress_deadline "
        "auto_revert auto_promote canary stagger"
    ),
    "constraint": _spec("attribute operator value"),
    "network": _spec("mode hostname", "port dns"),
    "port": _spec("static to host_network", labeled=True),
    "service": _spec(
        "name port provider tags canary_tags address_mode address task enable_tag_override "
        "meta on_update",
        "check connect check_restart identity",
    ),
    "check": _spec(
        "type path interval timeout name port protocol method address_mode initial_status "
        "grpc_service grpc_use_tls tls_skip_verify expose command args task on_update "
        "success_before_passing failures_before_critical body",
        "header check_restart",
        "type interval timeout",
    ),
    "restart": _spec("attempts interval delay mode render_templates"),
    "template": _spec(
        "data source destination env perms change_mode change_signal left_delimiter "
        "right_delimiter splay uid gid error_on_missing_key",
        "wait change_script",
        "destination",
    ),
    "resources": _spec("cpu cores memory memory_max", "device numa"),
    "logs": _spec("max_files max_file_size disabled"),
    "env": Spec(ANY),
    "meta": Spec(ANY),
    "config": Spec(ANY, required=frozenset({"image"})),  # the docker driver's
    "dynamic": _spec("for_each iterator labels", "content", "for_each content", True),
    "content": Spec(ANY),  # checked as the block type its `dynamic` generates
}


def problems(parsed: dict[str, Any], kind: str = "root", where: str = "") -> list[str]:
    """What in the parsed block `parsed` of type `kind` Nomad's jobspec does not allow."""
    spec, found = NOMAD[kind], []
    names = {k for k in parsed if not k.startswith("__")}
    for name in sorted(names):
        value, here = parsed[name], f"{where}{name}"
        is_block = isinstance(value, list) and value and all(_is_block(v) for v in value)
        if spec.attrs is ANY:
            continue
        if not is_block:
            if name not in spec.attrs:
                found.append(f"{here}: no attribute {name!r} in a {kind} block")
            continue
        if name not in spec.blocks:
            found.append(f"{here}: no block {name!r} in a {kind} block")
            continue
        for each in value:
            found += _nested(name, each, here)
    missing = spec.required - names
    found += [f"{where.rstrip('.') or kind}: a {kind} block needs {m!r}" for m in sorted(missing)]
    return found


def _is_block(value: Any) -> bool:
    return isinstance(value, dict) and (
        value.get("__is_block__") or (len(value) == 1 and _is_block(next(iter(value.values()))))
    )


def _nested(name: str, block: dict[str, Any], where: str) -> list[str]:
    """A nested block `name`: its label unwrapped where it takes one."""
    if not NOMAD[name].labeled:
        return problems(block, name, f"{where}.")
    [(label, body)] = block.items()
    if name != "dynamic":
        return problems(body, name, f"{where}.{label.strip(chr(34))}.")
    generated = label.strip('"')
    found = problems(body, "dynamic", f"{where}.{generated}.")
    for content in body.get("content", []):
        found += problems(content, generated, f"{where}.{generated}.content.")
    return found


def tasks(parsed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each task by its name."""
    [job] = [body for each in parsed["job"] for body in each.values()]
    return {
        label.strip('"'): body
        for group in job["group"]
        for named in group.values()
        for task in named["task"]
        for label, body in task.items()
    }


def task_settings(task: dict[str, Any]) -> set[str]:
    """The ANTDT_* names a task sets: in `env`, and in templates rendered with env = true."""
    names = {k for env in task.get("env", []) for k in env if k.startswith("ANTDT_")}
    for template in task.get("template", []):
        if template.get("env") is True:
            names |= set(re.findall(r"^\s*(ANTDT_[A-Z0-9_]+)=", template["data"], re.M))
    return names


def unknown_settings(parsed: dict[str, Any]) -> dict[str, list[str]]:
    found = {}
    for name, task in tasks(parsed).items():
        cls = settings_class(task["config"][0]["args"][0].strip('"'))
        unknown = sorted(s for s in task_settings(task) if not names_setting(cls, s))
        if unknown:
            found[name] = unknown
    return found


def _parse(text: str) -> dict[str, Any]:
    hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 (the dev extra) is not installed")
    parsed: dict[str, Any] = hcl2.loads(text)
    return parsed


def test_the_nomad_job_has_only_stanzas_nomad_knows_with_what_they_require() -> None:
    parsed = _parse(JOBSPEC.read_text())
    assert problems(parsed) == []
    assert sorted(tasks(parsed)) == ["controller", "monitor", "shards"]


def test_a_misspelt_or_misplaced_stanza_or_a_missing_one_is_caught() -> None:
    text = JOBSPEC.read_text()
    checks = {
        "restart {\n      attempts = 10": (
            "restrat {\n      attempts = 10",
            ["no block 'restrat'"],
        ),
        "kill_timeout = ": ("kill_timout = ", ["no attribute 'kill_timout'"]),
        'interval = "10s"': (
            'intervall = "10s"',
            ["no attribute 'intervall' in a check", "a check block needs 'interval'"],
        ),
        'driver       = "docker"': ("# no driver", ["a task block needs 'driver'"]),
        "    constraint {": (
            '    task "x" {}\n    constraint {',
            ["a task block needs 'config'", "a task block needs 'driver'"],
        ),
    }
    for right, (wrong, said) in checks.items():
        assert right in text, right
        found = problems(_parse(text.replace(right, wrong, 1)))
        assert [next(s for s in said if s in f) for f in found], (wrong, found)
        assert all(any(s in f for f in found) for s in said), (wrong, found)


def test_every_setting_of_the_nomad_tasks_is_one_their_service_reads() -> None:
    parsed = _parse(JOBSPEC.read_text())
    for name, task in tasks(parsed).items():
        assert {"ANTDT_NATS__URL", "ANTDT_NATS__PASSWORD", "ANTDT_ETCD__PASSWORD"} <= (
            task_settings(task)
        ), name
    assert unknown_settings(parsed) == {}


def test_a_setting_the_services_do_not_know_is_caught_in_env_and_in_templates() -> None:
    text = JOBSPEC.read_text()
    renamed = text.replace("ANTDT_ETCD__ENDPOINT ", "ANTDT_ETCD__ENDPIONT ", 1)
    assert unknown_settings(_parse(renamed)) == {"monitor": ["ANTDT_ETCD__ENDPIONT"]}
    rendered = text.replace("ANTDT_NATS__PASSWORD=", "ANTDT_NATS__PASSWD=", 1)
    assert unknown_settings(_parse(rendered)) == {"monitor": ["ANTDT_NATS__PASSWD"]}

"""What the decoder fuzz tests share: how many inputs (ANTDT_FUZZ_INPUTS, set high by
`make chaos`), a valid seed for any model (built from its JSON Schema), the strategies
(arbitrary bytes; structure-aware mutations of a valid message) and the crash corpus.

Each hypothesis example is one drawn input and VARIANTS - 1 byte-level variants of it
(flips, cuts, inserts, deletions from a drawn seed): drawing costs ~100x a decode, so
this is what makes 100,000 inputs per decoder an hour's run, not a day's."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

#: Inputs per decoder and strategy: 1,280 in `make test`, 100,000 in `make chaos`.
INPUTS = int(os.environ.get("ANTDT_FUZZ_INPUTS", "1280"))
#: Inputs fed per hypothesis example: the drawn one and its byte-level variants.
VARIANTS = 16
#: Past crashes, one file per input: every decoder reads every one (test_fuzz_*.py).
CORPUS = Path(__file__).parent / "fuzz_corpus"

FUZZ = settings(
    max_examples=-(-INPUTS // VARIANTS),
    deadline=None,
    database=None,  # the corpus, not hypothesis's cache, keeps what was found
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.bin"))


# -- valid seeds -------------------------------------------------------------------------


def seed(target: Any, overrides: dict[str, Any] | None = None) -> Any:
    """A valid JSON value of `target` (a model or a TypeAdapter), built from its schema:
    every optional field set where the model takes that, else only the required ones;
    `overrides` on top. Raises if the model refuses both."""
    adapter = target if isinstance(target, TypeAdapter) else TypeAdapter(target)
    schema = adapter.json_schema()
    tried = []
    for full in (True, False):
        value = _example(schema, schema.get("$defs", {}), full)
        if overrides:
            value.update(overrides)
        tried.append(value)
        try:
            adapter.validate_python(value)
        except ValueError:
            continue
        return value
    adapter.validate_python(tried[-1])  # a seed that is not valid fuzzes nothing of interest
    return tried[-1]


def _example(schema: dict[str, Any], defs: dict[str, Any], full: bool) -> Any:
    if "$ref" in schema:
        return _example(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, full)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema and not (full and schema["default"] in (None, [], {})):
        return schema["default"]
    for union in ("anyOf", "oneOf"):
        if union in schema:
            options = [s for s in schema[union] if s.get("type") != "null"] or schema[union]
            return _example(options[0], defs, full)
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        names = props if full else schema.get("required", [])
        found = {name: _example(props[name], defs, full) for name in names}
        if full and not props and isinstance(schema.get("additionalProperties"), dict):
            found["a"] = _example(schema["additionalProperties"], defs, full)
        return found
    if kind == "array":
        items = schema.get("prefixItems") or [schema.get("items", {})] * max(
            schema.get("minItems", 0), int(full)
        )
        return [_example(item, defs, full) for item in items]
    if kind == "integer":
        return max(schema.get("minimum", 1), 1)
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return False
    if kind == "string":
        return "a" * max(schema.get("minLength", 1), 1)
    return None


# -- strategies ----------------------------------------------------------------------------

#: Values no field expects: wrong types, huge and non-finite numbers, long strings, junk.
JUNK: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=19, max_value=4200).map(lambda e: 10**e),  # past int64 and float
    st.integers(min_value=19, max_value=4200).map(lambda e: -(10**e)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 5e-324]),
    st.text(max_size=40),
    st.integers(min_value=0, max_value=400_000).map(lambda n: "x" * n),
    st.recursive(
        st.none() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=20,
    ),
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value where something could be put or dropped."""
    found = [at]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*at, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += _paths(inner, (*at, i))
    return found


def _mutate(value: Any, path: tuple[Any, ...], op: str, junk: Any, name: str) -> Any:
    """`value` (a fresh copy) with the thing at `path` dropped, replaced or given an
    unknown field `name`."""
    if not path:
        return junk if op != "add" or not isinstance(value, dict) else {**value, name: junk}
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    if not rest and op == "drop":
        del copy[head]
    else:
        copy[head] = _mutate(copy[head], rest, op, junk, name)
    return copy


@st.composite
def mutations(draw: Callable[..., Any], valid: Any) -> bytes:
    """`valid` (a JSON value) with one to three fields dropped, replaced by junk or added,
    then encoded (NaN and Infinity as JSON's non-standard tokens), sometimes cut short,
    a byte flipped, a number made thousands of digits long, or wrapped many levels deep."""
    value = valid
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(value)))
        op = draw(st.sampled_from(["drop", "replace", "add"] if path else ["replace", "add"]))
        value = _mutate(value, path, op, draw(JUNK), draw(st.text(min_size=1, max_size=12)))
    data = json.dumps(value, allow_nan=True).encode()
    damage = draw(st.sampled_from(["none", "none", "cut", "flip", "nest", "digits"]))
    if damage == "cut":
        data = data[: draw(st.integers(min_value=0, max_value=len(data)))]
    elif damage == "flip" and data:
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    elif damage == "digits" and (at := data.find(b"1")) >= 0:  # past Python's int parse limit
        data = data[:at] + b"9" * draw(st.integers(4300, 100_000)) + data[at:]
    elif damage == "nest":
        depth = draw(st.integers(min_value=1, max_value=20_000))
        data = b"[" * depth + data + b"]" * draw(st.integers(min_value=0, max_value=depth))
    return data


#: Arbitrary bytes, and bytes that are nearly JSON.
RAW: st.SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=512),
    st.text(alphabet='{}[]",:0123456789.eE-+ ntrufalsNI\\', max_size=256).map(str.encode),
)


def _variant(data: bytes, rng: random.Random) -> bytes:
    """`data` with one classic blind mutation."""
    if not data:
        return bytes([rng.randrange(256)])
    at = rng.randrange(len(data))
    op = rng.randrange(5)
    if op == 0:  # flip a byte
        return data[:at] + bytes([data[at] ^ rng.randrange(1, 256)]) + data[at + 1 :]
    if op == 1:  # cut short
        return data[:at]
    if op == 2:  # insert a byte JSON cares about, or any
        byte = rng.choice(b'{}[]",:\\0-eE.\x00\xff' + bytes([rng.randrange(256)]))
        return data[:at] + bytes([byte]) + data[at:]
    if op == 3:  # delete a slice
        return data[:at] + data[at + rng.randrange(1, 16) :]
    return data[:at] + data[at : at + 32] + data[at:]  # repeat a slice


def batches(strategy: st.SearchStrategy[bytes]) -> st.SearchStrategy[list[bytes]]:
    """Each drawn input of `strategy`, then VARIANTS - 1 variants of it."""

    def expand(drawn: tuple[bytes, random.Random]) -> list[bytes]:
        data, rng = drawn
        return [data, *(_variant(data, rng) for _ in range(VARIANTS - 1))]

    return st.tuples(strategy, st.randoms(use_true_random=False)).map(expand)

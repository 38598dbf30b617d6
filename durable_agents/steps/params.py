"""A run's parameters: the values a step needs beyond the task, the address and
the conversation (a refund's amount, an order id), given when the run starts
and recorded with it.

One mapping on the run, ``RunInputs.params``, rather than a field per value in
every engine's schema: the run record keeps it as one JSON column of the run
row, DBOS with the workflow's inputs. A step's request builder reads the ones
it needs (``inputs.params["amount"]``), so a new step's parameter needs no
engine's code. Fixed for the run's life, like the rest of its inputs, so a
resumed or replayed step builds the request the first attempt built.

On the command line, ``--param NAME=VALUE``, once per parameter: VALUE is read
as JSON when it is a JSON number, ``true``, ``false`` or a quoted string, and
as text otherwise (``--param amount=1250 --param order_id=A-1234``).

The rule: at most ``MAX_PARAMS`` parameters, each name 1-40 of ``a-z``,
``0-9`` and ``_`` starting with a letter, each value a string of at most
``MAX_PARAM_CHARS`` characters of single-line text, a whole number, a number
or a boolean: whatever else a step needs, it reads from the results of the
steps before it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping

from durable_agents.steps.limits import InputError, check_text

ParamValue = str | int | float | bool
"""One parameter's value: JSON's scalars."""

MAX_PARAMS = 10
MAX_PARAM_CHARS = 200
_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def check_params(params: Mapping[str, object] | None) -> dict[str, ParamValue]:
    """``params`` as recorded (a new dict, names sorted), or ``InputError`` naming what breaks the rule."""
    if not params:
        return {}
    if not isinstance(params, Mapping):
        raise InputError(f"a run's parameters are a mapping of names to values, got {type(params).__name__}")
    if len(params) > MAX_PARAMS:
        raise InputError(f"{len(params)} parameters; a run takes at most {MAX_PARAMS}")
    checked: dict[str, ParamValue] = {}
    for name in sorted(params):
        value = params[name]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InputError(f"parameter name {name!r} is not allowed: 1-40 of a-z, 0-9 and _, starting with a "
                             "letter, e.g. --param amount=1250")
        if isinstance(value, str):
            if len(value) > MAX_PARAM_CHARS:
                raise InputError(f"parameter {name} is {len(value)} characters; the limit is {MAX_PARAM_CHARS}")
            check_text(f"parameter {name}", value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"parameter {name} is {value}: give a finite number")
        elif not isinstance(value, (bool, int, float)):
            raise InputError(f"parameter {name} is a {type(value).__name__}: give a string, a number or a boolean")
        checked[name] = value
    return checked


def parse_params(pairs: Iterable[str] | None) -> dict[str, ParamValue]:
    """``NAME=VALUE`` pairs (``--param``) as checked parameters: see the module docstring."""
    found: dict[str, object] = {}
    for pair in pairs or ():
        name, sep, raw = pair.partition("=")
        if not sep:
            raise InputError(f"--param {pair!r}: give NAME=VALUE, e.g. --param amount=1250")
        if name in found:
            raise InputError(f"--param {name} is given twice: give each parameter once")
        found[name] = _value(raw)
    return check_params(found)


def _value(raw: str) -> object:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, (str, int, float, bool)) else raw

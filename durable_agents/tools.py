"""A tool is declared data: its name, what the model is told of it, its arguments' schema, its effect, its handler.

The contract:

- **Arguments are untrusted model output**, checked before the handler sees them (``Toolbox.check``): a JSON
  text, each key once (JSON parsers disagree on which of two equal keys wins, pydantic keeps the last, so a
  key given twice is refused before pydantic reads the text), no ``NaN`` or ``Infinity`` (not JSON), then the
  tool's pydantic model in strict mode (no ``"5"`` for 5, no ``1e3`` or ``true`` for an integer) with no field
  it does not declare. What is wrong becomes a ``ToolRefused``: a short reason the model can act on (what
  was wrong, what to give), quoting the model's text through ``repr`` cut to 40 characters, so the reason is
  safe to print and to hand back.
- **An unknown tool is refused back to the model**, never dispatched to another tool.
- **A tool with an effect** (``effect``: the kind of it, e.g. ``"refund"``) is handed the call's idempotency key
  (``ToolContext.idempotency_key``), the same on every retry, resume and replay of that call; its handler
  passes it to the service that applies the effect, which must apply one request per key. A read-only tool
  (``effect=None``) gets no key.
- **The handler** is an async function of the checked arguments (the model's instance) and a ``ToolContext``.
  It returns a ``ToolOutput`` (what goes back to the model, JSON-able) or raises ``ToolRefused`` when the
  call is refused with nothing applied; any other exception is a failure the engine retries under the
  same key. A value that must not come from the model (an address to write to) is read from the run's
  parameters (``ToolContext.params``), not declared as an argument.
- **A lookup by key** (``Tool.lookup``, for a tool with an effect): an async function of a key and the
  worker's services asking the tool's own service what it applied under that key, answering an ``Applied``
  or None (no request with that key reached it). ``settle`` asks it for each call of a run; the retry of a
  call that may have been applied (an attempt after the first) asks it before sending again, and takes the
  stored answer when the service gives one. Without a lookup the retry sends again under the same key (the
  service must replay) and ``settle`` says it cannot ask.
- **A call that waits for a person** (``Tool.approval``, an ``Approval``): always, or when its rule says so of
  the checked arguments. Whether a call waits is decided when its turn is recorded, and recorded with it;
  the call then waits, recorded as waiting, for a decision from outside bound to it (its key and a digest
  of its checked arguments), until its deadline; a denial goes back to the model as the call's refusal,
  nothing applied (docs/approvals.md).
- **The signature** (``Toolbox.signature``): one line per tool, ``tool NAME:KIND:field=type,...`` (``?`` after an
  optional field's type, and `` approval=...`` when the tool has one), recorded with every run so that code
  whose tools changed shape does not resume a run recorded under other tools. Descriptions and text rules
  are not in it: they change what the model is told, not what a recorded call means.

This module imports nothing of the project: it is the adapter's, and an agent builder's code imports it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Applied", "Approval", "Arguments", "Lookup", "Tool", "ToolContext", "ToolOutput", "ToolRefused",
           "Toolbox"]

MAX_NAME_CHARS = 64
"""A tool's name: 1-64 letters, digits, ``_`` and ``-`` (what chat-completions servers accept)."""
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
SHOWN_CHARS = 40
"""How much of the model's text a refusal quotes (its ``repr``, cut)."""
MAX_REASONS = 3
"""How many of the validator's findings a refusal names (the model corrects them and is told the rest)."""


class Arguments(BaseModel):
    """A base for a tool's arguments: frozen and closed (a field the model adds is refused, not ignored).
    Any pydantic model whose ``model_config`` forbids extra fields may be declared instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)


A = TypeVar("A", bound=BaseModel)


class ToolRefused(Exception):
    """The call is refused back to the model with nothing applied; ``reason`` says what was wrong and what to
    give. ``Toolbox.check`` raises it for arguments it cannot accept, a handler for a call its service refuses."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class ToolContext:
    """What a handler is told of the call it runs, beside its arguments.

    ``run_id``, ``turn`` (from 1) and ``index`` (the call's place in its turn, from 0) name the call;
    ``call_id`` is the model's id of it (untrusted text: never a key, never printed raw); ``attempt`` the
    engine's attempt number when it knows one (None otherwise); ``idempotency_key`` the call's key when the
    tool has an effect (None for a read-only tool); ``params`` the run's own parameters, fixed for its life
    (the lab's: the customer's ``email``); ``services`` what the worker was given to reach the outside world
    (the lab's: its ``durable_agents.steps.flow.StepDeps``)."""

    run_id: str
    turn: int
    index: int
    call_id: str = ""
    attempt: int | None = None
    idempotency_key: str | None = None
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    services: Any = None

    @property
    def key(self) -> str:
        """The call's idempotency key, for a handler of a tool with an effect to pass to its service;
        ``ValueError`` when there is none (a read-only tool)."""
        if not self.idempotency_key:
            raise ValueError(f"call {self.turn}/{self.index} of run {self.run_id} has no idempotency key: only "
                             "a tool declared with an effect is given one")
        return self.idempotency_key


@dataclass(frozen=True)
class ToolOutput:
    """What a handler gives back: ``content``, the JSON-able result the model is shown; for an effect, the
    service's id of it (``effect_id``) and whether the service answered from its store (``replayed``: an
    earlier attempt applied it)."""

    content: Mapping[str, Any]
    effect_id: str | None = None
    replayed: bool = False


Handler = Callable[[A, ToolContext], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class Applied:
    """A tool's service's answer to a lookup by key: whether it applied an effect under the key. When it did:
    ``output``, what the handler gives back for that effect (None where the service does not keep its answer:
    a retry then sends again under the key), ``applied_at`` (the service's time, as text) and ``ids`` (the
    service's ids of what it made). ``requests``: how many requests carried the key, where the service counts
    them (None: it does not say)."""

    applied: bool
    output: ToolOutput | None = None
    applied_at: str | None = None
    ids: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    requests: int | None = None


Lookup = Callable[[str, Any], Awaitable[Applied | None]]
"""``lookup(key, services)``: what the tool's service holds under ``key`` (``services``: the worker's, as
``ToolContext.services``), or None when no request with that key reached it."""


MIN_APPROVAL_WAIT = timedelta(seconds=1)
MAX_APPROVAL_WAIT = timedelta(days=30)
"""The bounds of ``Approval.within``: a run's execution timeout makes room for its longest wait."""
EXPIRY_OUTCOMES = ("refuse", "fail")


@dataclass(frozen=True)
class Approval:
    """A tool's calls wait for a person's decision before they run.

    ``when``: None (every call waits) or a rule of the checked arguments (the tool's pydantic model
    instance) answering True when the call must wait, e.g. ``lambda a: a.amount > 5000``. It is asked once,
    when the call's turn is recorded, and its answer is recorded with the call, so it must be a pure
    function of the arguments (no clock, no I/O, no state): a deploy that changes it changes the tool's
    signature, never a recorded call. ``within``: how long a call waits for its decision, from when it
    began waiting (1 second to 30 days). ``on_expiry``: what a call with no decision by then does:
    ``"refuse"`` (refused back to the model, nothing applied) or ``"fail"`` (the run ends failed, naming the
    call). ``ValueError`` for a declaration outside these, when it is made."""

    when: Callable[[Any], bool] | None = None
    within: timedelta = timedelta(hours=24)
    on_expiry: Literal["refuse", "fail"] = "refuse"

    def __post_init__(self) -> None:
        if self.when is not None and not callable(self.when):
            raise ValueError(f"an approval's rule is a function of the checked arguments, or None; got {self.when!r}")
        if not (isinstance(self.within, timedelta) and MIN_APPROVAL_WAIT <= self.within <= MAX_APPROVAL_WAIT):
            raise ValueError(f"an approval's wait (within) is a timedelta from {MIN_APPROVAL_WAIT} to "
                             f"{MAX_APPROVAL_WAIT.days} days; got {self.within!r}")
        if self.on_expiry not in EXPIRY_OUTCOMES:
            raise ValueError(f"an approval's on_expiry is 'refuse' or 'fail'; got {self.on_expiry!r}")

    def applies(self, arguments: BaseModel) -> bool:
        """Whether a call with these checked arguments waits. A rule that raises is a bug in the declaration:
        the call then waits (a person decides), never runs unasked."""
        if self.when is None:
            return True
        try:
            return bool(self.when(arguments))
        except Exception:  # noqa: BLE001 - the user's rule: failing safe, to a person
            return True

    def recorded(self) -> dict[str, Any]:
        """What the call's turn records of it: the wait and what its expiry does."""
        return {"within": self.within.total_seconds(), "on_expiry": self.on_expiry}

    def signature(self) -> str:
        rule = "always" if self.when is None else getattr(self.when, "__qualname__", type(self.when).__name__)
        return f"approval={rule}/{self.within.total_seconds():g}s/{self.on_expiry}"


@dataclass(frozen=True)
class Tool(Generic[A]):
    """One tool, declared: ``name`` (1-64 letters, digits, ``_``, ``-``), the ``description`` the model reads,
    ``arguments`` (a pydantic model closed to extra fields, e.g. a subclass of ``Arguments``), the
    ``handler``, the ``effect`` kind (None: read-only, no idempotency key) and, for a tool with an effect, its
    ``lookup`` by key (see the module docstring); ``approval``: its calls wait for a person's decision
    (``Approval``), or None. ``ValueError`` for a declaration that breaks these rules, when it is made."""

    name: str
    description: str
    arguments: type[A]
    handler: Handler[A]
    effect: str | None = None
    lookup: Lookup | None = None
    approval: Approval | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and 1 <= len(self.name) <= MAX_NAME_CHARS
                and set(self.name) <= _NAME_CHARS):
            raise ValueError(f"a tool's name is 1-{MAX_NAME_CHARS} letters, digits, '_' and '-'; "
                             f"got {_shown(self.name)}")
        if not (isinstance(self.arguments, type) and issubclass(self.arguments, BaseModel)):
            raise ValueError(f"tool {self.name}: arguments must be a pydantic model class (e.g. a subclass of "
                             f"durable_agents.Arguments), got {self.arguments!r}")
        if self.arguments.model_config.get("extra") != "forbid":
            raise ValueError(f"tool {self.name}: its arguments model must refuse extra fields: subclass "
                             "durable_agents.Arguments, or set model_config = ConfigDict(extra='forbid')")
        if self.effect is not None and not (self.effect and set(self.effect) <= _NAME_CHARS):
            raise ValueError(f"tool {self.name}: an effect kind is a word of letters, digits, '_' and '-', "
                             f"or None for a read-only tool; got {_shown(self.effect)}")
        if not callable(self.handler):
            raise ValueError(f"tool {self.name}: its handler must be an async function (arguments, context)")
        if self.lookup is not None and (self.effect is None or not callable(self.lookup)):
            raise ValueError(f"tool {self.name}: a lookup is an async function (key, services) of a tool with an "
                             "effect; a read-only tool applies nothing to look up")
        if self.approval is not None and not isinstance(self.approval, Approval):
            raise ValueError(f"tool {self.name}: approval is a durable_agents.Approval, or None; got "
                             f"{self.approval!r}")

    def parameters(self) -> dict[str, Any]:
        """The arguments' JSON Schema as the model is told it (pydantic's, without its generated titles)."""
        return _untitled(self.arguments.model_json_schema())

    def spec(self) -> dict[str, Any]:
        """The tool in the chat-completions form (one item of ``tools=``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters()}}

    def signature(self) -> str:
        """``tool NAME:KIND:field=type,...``: what a recorded call of this tool means (see the module docstring)."""
        schema = self.arguments.model_json_schema()
        required = set(schema.get("required", ()))
        defs = schema.get("$defs", {})
        fields = ",".join(f"{name}={_json_type(prop, defs)}{'' if name in required else '?'}"
                          for name, prop in schema.get("properties", {}).items())
        line = f"tool {self.name}:{self.effect or ''}:{fields}"
        return line if self.approval is None else f"{line} {self.approval.signature()}"


class Toolbox:
    """The tools of an agent, by name, in the order declared (the order the model is told them).
    ``ValueError`` for two tools of one name."""

    def __init__(self, tools: Iterable[Tool[Any]]) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise ValueError(f"a Toolbox holds durable_agents.Tool declarations, got {tool!r}")
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}: a name must say which tool runs")
            self._tools[tool.name] = tool
        # The tools are frozen: what is derived of them (pydantic builds a schema afresh on each ask) once.
        self._specs = [tool.spec() for tool in self._tools.values()]
        self._signature = tuple(tool.signature() for tool in self._tools.values())
        self._effects = MappingProxyType({t.name: t.effect for t in self._tools.values() if t.effect is not None})

    def __iter__(self) -> Iterator[Tool[Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    @property
    def effects(self) -> Mapping[str, str]:
        """Each tool with an effect and its kind; a read-only tool is absent."""
        return self._effects

    def specs(self) -> list[dict[str, Any]]:
        """The tools in the chat-completions form (``tools=``), from their arguments' JSON Schemas: a copy
        of its own for each caller, who may keep or change it."""
        return copy.deepcopy(self._specs)

    def signature(self) -> tuple[str, ...]:
        return self._signature

    def unknown(self, name: str) -> str:
        """The refusal of a call of a tool this toolbox does not hold (the name quoted, cut to 64)."""
        return f"unknown tool {name[:MAX_NAME_CHARS]!r}; the tools are {', '.join(self._tools)}"

    def check(self, name: str, arguments: str) -> BaseModel:
        """The call's arguments (the JSON text the model wrote; empty means ``{}``) checked and built into the
        tool's model; ``ToolRefused`` saying why not (see the module docstring)."""
        tool = self._tools.get(name)
        if tool is None:
            raise ToolRefused(self.unknown(name))
        text = arguments if arguments.strip() else "{}"
        try:
            parsed = json.loads(text, object_pairs_hook=_once, parse_constant=_no_constant)
        except _RepeatedKey as err:
            raise ToolRefused(f"the arguments of {name} give {err.key[:SHOWN_CHARS]!r} more than once; give each "
                              "field once (which one was meant cannot be told)") from None
        except ValueError:  # json.JSONDecodeError, and NaN or Infinity (_no_constant)
            raise ToolRefused(f"the arguments of {name} are not JSON; give a JSON object") from None
        if not isinstance(parsed, dict):
            raise ToolRefused(f"the arguments of {name} must be a JSON object")
        try:
            return tool.arguments.model_validate_json(text, strict=True)
        except ValidationError as err:
            raise ToolRefused(_explain(tool, err)) from None

    async def call(self, name: str, arguments: str, context: ToolContext) -> ToolOutput:
        """Check the call's arguments and run its tool's handler. ``ToolRefused`` for a call refused back to
        the model (nothing applied); whatever else the handler raises, as it raised it. A read-only tool's
        context loses any key; a tool with an effect needs one (``ValueError``: the engine's bug).

        An attempt after the first (``context.attempt`` above 1: an earlier one may have applied the effect)
        of a tool with a lookup asks it first: an effect applied under the key with its answer kept is that
        answer, ``replayed``, and nothing is sent; otherwise the handler runs, under the same key."""
        args = self.check(name, arguments)
        tool = self._tools[name]
        if tool.effect is None:
            context = replace(context, idempotency_key=None)
        elif not context.idempotency_key:
            raise ValueError(f"tool {name} has an effect ({tool.effect}): its context needs the call's "
                             "idempotency key")
        elif tool.lookup is not None and (context.attempt or 1) > 1:
            found = await tool.lookup(context.idempotency_key, context.services)
            if found is not None and found.applied and found.output is not None:
                return replace(found.output, replayed=True)
        return await tool.handler(args, context)


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _explain(tool: Tool[Any], err: ValidationError) -> str:
    """The validator's findings as one short reason: the fields the tool has not, then what each wrong field
    needs (a validator's own ``ValueError`` message as it wrote it)."""
    errors = err.errors(include_url=False)
    extra = [_where(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    reasons = []
    if extra:
        known = ", ".join(tool.arguments.model_fields) or "no arguments"
        reasons.append(f"{tool.name} takes {known}; it has no {', '.join(repr(x[:SHOWN_CHARS]) for x in extra)}")
    for e in errors:
        where = _where(e["loc"])
        if e["type"] == "extra_forbidden":
            continue
        if e["type"] == "missing":
            reasons.append(f"{tool.name} needs {where!r}")
        elif e["type"] == "value_error" and "error" in e.get("ctx", {}):
            reasons.append(str(e["ctx"]["error"]))
        else:
            msg = e["msg"][:1].lower() + e["msg"][1:]
            reasons.append(f"{where or 'the arguments'} of {tool.name}: {msg}, got {_shown(e['input'])}")
    more = len(reasons) - MAX_REASONS
    return "; ".join(reasons[:MAX_REASONS]) + (f"; and {more} more" if more > 0 else "")


def _untitled(schema: Any) -> Any:
    """``schema`` without the ``title`` pydantic gives every model and field (a field *named* title is kept)."""
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: _untitled(sub) for name, sub in value.items()}
        else:
            out[key] = _untitled(value)
    return out


def _json_type(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    """A field's JSON type as the signature writes it: its ``type``, or its definition's (``$ref``: a nested
    model is ``object``, an enum class its values' type); the types of an ``anyOf`` joined by ``|``."""
    if "type" in prop:
        return str(prop["type"])
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
        return _json_type(defs[ref[8:]], {})
    if "anyOf" in prop:
        return "|".join(_json_type(p, defs) for p in prop["anyOf"])
    if "enum" in prop:
        return "enum"
    return "any"

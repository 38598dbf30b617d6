"""A model behind any OpenAI-compatible chat-completions endpoint (Ollama, vLLM,
llama.cpp's server, OpenAI itself).

Contract:

- One :meth:`OpenAIChatModel.draft` call makes at most ``max_parse_attempts``
  HTTP requests, and more than one only when the model's answer could not be
  used as a draft. The client is built with ``max_retries=0``: retrying a failed
  request is the durable engine's job, so that every retry is counted, bounded
  and visible in the run's history, and none happens hidden inside a step.
- The answer must be a JSON object ``{"subject", "body", "summary"}``. Code
  fences and prose around one object are tolerated; the values are checked by
  :func:`durable_agents.drafting.base.make_draft`. An unusable answer is shown back to the model
  with a short correction, and after ``max_parse_attempts`` requests in total
  the call raises :class:`PermanentError`.
- Errors are mapped for the engine: HTTP 408, 409, 429 and 5xx, connection
  failures and timeouts raise :class:`TransientError` (with ``retry_after`` from
  ``retry-after-ms`` or ``retry-after`` when the server sent one); any other 4xx
  raises :class:`PermanentError` saying which setting to check.
- The API key never appears in an exception message, a repr or a log line; the
  base URL is shown without user info or query string.

:meth:`OpenAIChatModel.turn` is the agent loop's model (``durable_agents.steps.ports.ToolModel``),
on the same client and under the same rules, with these differences:

- the request carries ``tools`` and no ``response_format``, and the messages go
  as given (no JSON instruction: the answer is text and tool calls, not a draft);
- ``labels`` (the run and the turn) go as the headers ``X-Lab-Run`` and
  ``X-Lab-Turn``, percent-encoded: a real server ignores them, the lab's
  stand-in (``durable_agents.testing.standin``) counts requests by them;
- the answer is ``choices[0].message``: its text (none: ``""``) and its function
  tool calls, in the model's order, each as ``durable_agents.steps.loop.AskedCall`` (id, name,
  arguments as the JSON text the model wrote: checked later, when the call runs).
  An answer with neither text nor a tool call, or with a tool call that has no
  id or name or is not a function call, is shown back with a correction, and
  after ``max_parse_attempts`` requests the call raises :class:`PermanentError`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlsplit, urlunsplit

from durable_agents.steps.errors import PermanentError, StepError, TransientError

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam, ChatCompletionToolUnionParam
from durable_agents.steps.limits import MAX_BODY_CHARS, MAX_SUBJECT_CHARS, MAX_SUMMARY_CHARS
from durable_agents.steps.loop import AskedCall, ModelAnswer
from durable_agents.steps.retry import parse_retry_after

from .base import Draft, DraftError, make_draft

__all__ = ["OpenAIChatModel", "label_headers", "parse_answer", "parse_draft", "retry_after_seconds"]

log = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({408, 409, 429})
"""Plus every status >= 500. 409 is here because OpenAI-style servers use it for
a conflicting concurrent request, which clears by itself."""
OUTAGE_STATUSES = frozenset({408, 429, 502, 503, 504})
"""Of the transient ones, those that say the server did not take this request on (too busy, a gateway
without its upstream, a request timeout): an outage (``TransientError.outage``). A 500 or a 409 is the
server's answer to the request: the loop stops a turn on one that repeats
(``durable_agents.steps.retry.StepLedger``)."""

JSON_INSTRUCTION = (
    "Answer with one JSON object and nothing else, of the form "
    '{"subject": "...", "body": "...", "summary": "..."}, where all three values are strings: '
    f'"subject" is the subject line of the reply (one line, at most {MAX_SUBJECT_CHARS} characters), '
    f'"body" is the full text of the reply (plain text, at most {MAX_BODY_CHARS} characters), and '
    f'"summary" is one sentence on one line saying what the reply does (at most {MAX_SUMMARY_CHARS} characters).'
)

_EXCERPT_CHARS = 160
# What is shown back to the model of its unusable answer: enough to correct,
# bounded so a runaway answer cannot grow the next request without limit.
_ECHO_CHARS = 4000
# Bounds the scan for a JSON object in prose; a real answer has a handful of braces.
_MAX_OBJECT_STARTS = 64
# A label travels as an HTTP header: percent-encoded (a header may hold only ASCII, and no line break; the
# loop's run ids are safe, a label from elsewhere may not be) and bounded, so a label never fails a request.
_MAX_LABEL_CHARS = 200

RUN_HEADER = "X-Lab-Run"
TURN_HEADER = "X-Lab-Turn"


class AnswerError(ValueError):
    """A turn's answer the loop cannot use; the message says why (and is shown back to the model)."""


class OpenAIChatModel:
    """Drafts with a model served over the OpenAI chat-completions API.

    ``base_url`` is the API root, e.g. ``http://localhost:11434/v1`` for Ollama.
    ``api_key`` is optional because local servers ignore it. ``timeout`` (seconds)
    bounds each request. ``json_mode`` sends ``response_format={"type":
    "json_object"}``; turn it off for servers that refuse that field.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_parse_attempts: int = 2,
        json_mode: bool = True,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.strip():
            raise ValueError("base_url is empty: give the API root, e.g. http://localhost:11434/v1")
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model is empty: give the model name the server knows, e.g. llama3.1")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            math.isfinite(timeout) and timeout > 0
        ):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_parse_attempts, bool) or not isinstance(max_parse_attempts, int) or max_parse_attempts < 1:
            raise ValueError(f"max_parse_attempts must be an integer >= 1, got {max_parse_attempts!r}")

        self.base_url = base_url.strip()
        self.model = model.strip()
        self.name = f"openai-compatible:{self.model}"
        self.timeout = float(timeout)
        self.max_parse_attempts = max_parse_attempts
        self.json_mode = bool(json_mode)
        self._shown_url = _display_url(self.base_url)
        # Kept only to scrub it from error text that a server might echo back.
        self._secret = api_key or None
        self._client: openai.AsyncOpenAI | None = None

    def _connection(self) -> openai.AsyncOpenAI:
        """The client, built at the first request.

        ``openai`` is imported here, not at the top: it takes about half a
        second to import, and most processes that build a model (a resume
        past the draft, a status command, each process the grader kills)
        never ask it anything.
        """
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self._secret or "not-needed", max_retries=0, timeout=self.timeout)
        return self._client

    def preload(self) -> None:
        """Import the client library and build the client now, not at the first request.

        For a process that drafts on an event loop that must keep answering:
        the Temporal worker, whose heartbeats share that loop with every
        attempt. The first request otherwise holds the loop ~0.4-0.6 s
        (``openai``'s import, the client, its chat resource), long enough for a
        1 s heartbeat timeout to take a live worker for dead
        (docs/benchmarks.md, "The stall a busy worker has"). A process that may
        never draft does not call it, and pays nothing.
        """
        client = self._connection()
        _ = client.chat.completions  # a cached property: imports the resource modules the request uses

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self._shown_url!r}, model={self.model!r})"

    async def draft(self, messages: list[dict]) -> Draft:
        conversation = _with_instruction(messages)
        text, problem = "", "no request was made"
        for attempt in range(1, self.max_parse_attempts + 1):
            text, finish_reason = await self._complete(conversation)
            try:
                return parse_draft(text)
            except DraftError as exc:
                problem = str(exc)
                if finish_reason == "length":
                    problem += "; the answer was cut off at the server's token limit"
            log.warning(
                "%s: answer %d of %d was not a usable draft: %s",
                self.name, attempt, self.max_parse_attempts, self._scrub(problem),
            )
            if attempt < self.max_parse_attempts:
                conversation = conversation + _correction(text, problem)
        raise PermanentError(self._scrub(
            f"model output was not a JSON object with subject, body and summary after "
            f"{self.max_parse_attempts} attempts: {_excerpt(text)} ({problem})"
        ))

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> ModelAnswer:
        """One turn of the agent loop: ``messages`` (the window, system first) and ``tools`` (function specs)
        in, the model's text and tool calls out (see the module docstring)."""
        if not isinstance(messages, list) or not messages:
            raise PermanentError("the model's turn got no messages: pass the system prompt and the task")
        conversation = [dict(m) if isinstance(m, Mapping) else m for m in messages]
        headers = label_headers(labels)
        shown, problem = "", "no request was made"
        for attempt in range(1, self.max_parse_attempts + 1):
            # Function specs as dicts (durable_agents.steps.loop.tool_specs); the client's TypedDicts name the same
            # shape. None at all: left out, as servers refuse an empty list.
            extra = {"tools": cast("Iterable[ChatCompletionToolUnionParam]", tools)} if tools else {}
            completion = await self._request(conversation, extra_headers=headers, **extra)
            try:
                return parse_answer(completion)
            except AnswerError as exc:
                problem = str(exc)
                shown = _answer_text(completion)
                if _finish_reason(completion) == "length":
                    problem += "; the answer was cut off at the server's token limit"
            log.warning(
                "%s: answer %d of %d to a turn was not usable: %s",
                self.name, attempt, self.max_parse_attempts, self._scrub(problem),
            )
            if attempt < self.max_parse_attempts:
                conversation = conversation + _turn_correction(shown, problem)
        raise PermanentError(self._scrub(
            f"the model gave no usable answer to the turn (text, or tool calls each with an id and a name) after "
            f"{self.max_parse_attempts} attempts: {_excerpt(shown)} ({problem}); a model that cannot call tools "
            "cannot run the agent loop: check that LLM_MODEL supports tool calling"
        ))

    async def aclose(self) -> None:
        """Close the HTTP connection pool, if a request opened one."""
        if self._client is not None:
            await self._client.close()

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _complete(self, conversation: list[dict]) -> tuple[str, str | None]:
        """One draft request; returns the answer text ("" when there is none) and the finish reason."""
        extra: dict[str, Any] = {}
        if self.json_mode:
            extra["response_format"] = {"type": "json_object"}
        completion = await self._request(conversation, **extra)
        choices = getattr(completion, "choices", None) or []
        if not choices:
            return "", None
        choice = choices[0]
        message = getattr(choice, "message", None)
        content = getattr(message, "content", None)
        if not isinstance(content, str) or not content.strip():
            refusal = getattr(message, "refusal", None)
            content = f"(refused: {refusal})" if isinstance(refusal, str) and refusal else ""
        return content, getattr(choice, "finish_reason", None)

    async def _request(self, conversation: list[dict], **extra: Any) -> ChatCompletion:
        """One chat-completions request (``extra``: the client's keyword arguments), its failures mapped to
        ``TransientError`` or ``PermanentError`` (the module docstring): the draft's and the turn's alike."""
        import openai  # for the names of its errors (see _connection for why not at the top)

        try:
            # Chat-format dicts (memory's to_chat, checked there); the client's TypedDicts name the same shape.
            messages = cast("list[ChatCompletionMessageParam]", conversation)
            return await self._connection().chat.completions.create(model=self.model, messages=messages, **extra)
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from None
        except openai.APITimeoutError:
            raise TransientError(
                f"the LLM server at {self._shown_url} did not answer within {self.timeout:g} s; "
                "if the model is just slow, raise LLM_TIMEOUT", outage=True
            ) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise TransientError(self._scrub(
                f"could not reach the LLM server at {self._shown_url} ({type(cause).__name__}: {cause}); "
                "check that it is running and that LLM_BASE_URL points at it"
            ), outage=True) from None
        except (openai.APIResponseValidationError, json.JSONDecodeError) as exc:
            # A 200 that is not a chat completion (an HTML page, a different
            # API): the URL is wrong, and asking again will not change that.
            reason = exc.message if isinstance(exc, openai.APIError) else "the body is not JSON"
            raise PermanentError(self._scrub(
                f"the server at {self._shown_url} did not answer like an OpenAI-compatible API "
                f"({reason}); check that LLM_BASE_URL is the API root, e.g. http://localhost:11434/v1"
            )) from None

    def _status_error(self, exc: openai.APIStatusError) -> StepError:
        status = exc.status_code
        detail = _error_detail(exc)
        where = f"the LLM server at {self._shown_url} answered HTTP {status}: {detail}"
        if status in TRANSIENT_STATUSES or status >= 500:
            retry_after = retry_after_seconds(exc.response.headers)
            return TransientError(self._scrub(where), retry_after=retry_after, outage=status in OUTAGE_STATUSES)
        if status in (401, 403):
            hint = "check LLM_API_KEY (the key this server expects)"
        elif status == 404:
            hint = (
                f"check LLM_MODEL ({self.model!r}: is the model available on the server? "
                f"For Ollama, run `ollama pull {self.model}`) and LLM_BASE_URL (the API root, "
                "usually ending in /v1)"
            )
        elif self.json_mode and "response_format" in detail:
            hint = "this server may not support JSON mode: set LLM_JSON_MODE=0"
        elif "tool" in detail.lower():
            # Ollama: "<model> does not support tools"; the agent loop needs a model that does.
            hint = f"the agent loop needs a model that supports tool calling: check LLM_MODEL ({self.model!r})"
        else:
            hint = "retrying the same request will not help"
        return PermanentError(self._scrub(f"{where}; {hint}"))

    def _scrub(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, "***")
        return text


def parse_draft(text: str) -> Draft:
    """The Draft in a model's answer, or :class:`DraftError` saying why there is none.

    Accepts a bare JSON object, one inside a code fence, or one inside prose;
    key names are matched case-insensitively.
    """
    obj = _find_object(text)
    fields = {str(key).strip().lower(): value for key, value in obj.items()}
    missing = [name for name in ("subject", "body", "summary") if name not in fields]
    if missing:
        raise DraftError(f"the JSON object lacks {', '.join(missing)}")
    return make_draft(fields["subject"], fields["body"], fields["summary"])


def parse_answer(completion: Any) -> ModelAnswer:
    """The turn's answer in a chat completion, or :class:`AnswerError` saying why there is none.

    ``choices[0].message``: its text (none: ``""``; a refusal with no text: ``(refused: ...)``, a final answer)
    and its tool calls in the model's order. A call counts as a function call when its ``type`` is
    ``"function"`` or absent (some servers leave it out); it needs an id and a name; its arguments are kept
    as the text the model wrote (an object some servers send instead is written back as JSON text).
    """
    choices = _get(completion, "choices") or []
    if not choices:
        raise AnswerError("the answer held no choice")
    message = _get(choices[0], "message")
    content = _get(message, "content")
    text = content if isinstance(content, str) else ""
    if not text.strip():
        refusal = _get(message, "refusal")
        text = f"(refused: {refusal})" if isinstance(refusal, str) and refusal.strip() else ""
    calls = []
    for place, raw in enumerate(_get(message, "tool_calls") or []):
        kind = _get(raw, "type")
        function = _get(raw, "function")
        if kind not in (None, "function") or function is None:
            raise AnswerError(f"tool call {place} is a {kind!r} call; only function calls can run")
        call_id, name, arguments = _get(raw, "id"), _get(function, "name"), _get(function, "arguments")
        if not isinstance(call_id, str) or not call_id:
            raise AnswerError(f"tool call {place} has no id")
        if not isinstance(name, str) or not name:
            raise AnswerError(f"tool call {place} has no function name")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(AskedCall(call_id, name, arguments))
    if not calls and not text.strip():
        raise AnswerError("the answer had neither text nor a tool call")
    return ModelAnswer(text, tuple(calls))


def label_headers(labels: Mapping[str, str] | None) -> dict[str, str] | None:
    """The headers that carry a turn's labels (``{"run": ..., "turn": ...}``), percent-encoded so any run id
    fits a header; None without labels. The stand-in decodes them (``urllib.parse.unquote``)."""
    if not labels:
        return None
    out = {}
    for header, key in ((RUN_HEADER, "run"), (TURN_HEADER, "turn")):
        value = labels.get(key)
        if value is not None:
            # Cut before encoding, so no escape is cut in half; a lone surrogate is escaped, never an error.
            out[header] = quote(str(value)[:_MAX_LABEL_CHARS], safe="", errors="backslashreplace")
    return out or None


def _get(value: Any, name: str) -> Any:
    """A field of the client's answer objects, or of a plain dict where the client left one unparsed."""
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _answer_text(completion: Any) -> str:
    """The answer's text, to show it back: its content, else its tool calls as JSON (they may be malformed,
    so never sent back as ``tool_calls``, which the server would refuse)."""
    choices = _get(completion, "choices") or []
    message = _get(choices[0], "message") if choices else None
    content = _get(message, "content")
    if isinstance(content, str) and content.strip():
        return content
    calls = _get(message, "tool_calls") or []
    dumped = [c.model_dump() if hasattr(c, "model_dump") else c for c in calls]
    return json.dumps(dumped, ensure_ascii=False, default=str) if dumped else ""


def _finish_reason(completion: Any) -> Any:
    choices = _get(completion, "choices") or []
    return _get(choices[0], "finish_reason") if choices else None


def _turn_correction(text: str, problem: str) -> list[dict]:
    turn: list[dict] = []
    if text.strip():
        shown = text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."
        turn.append({"role": "assistant", "content": shown})
    turn.append({
        "role": "user",
        "content": (
            f"That answer could not be used: {problem}. Answer again: call one or more of the tools you were "
            "given (each call with its id, the tool's name and its arguments as a JSON object), or, when "
            "nothing is left to do, give your final answer as text with no tool call."
        ),
    })
    return turn


def _find_object(text: str) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise DraftError("the answer was empty")
    stripped = text.strip()
    try:
        whole = json.loads(stripped)
    except ValueError:
        pass
    else:
        if isinstance(whole, dict):
            return whole
    # Otherwise scan for objects embedded in prose or fences. Prefer the first
    # one that has the draft's fields, so a stray {example} in prose is skipped.
    decoder = json.JSONDecoder()
    found: list[dict] = []
    position, starts = 0, 0
    while starts < _MAX_OBJECT_STARTS:
        start = stripped.find("{", position)
        if start < 0:
            break
        starts += 1
        try:
            value, end = decoder.raw_decode(stripped, start)
        except ValueError:
            position = start + 1
            continue
        if isinstance(value, dict):
            if {"subject", "body", "summary"} <= {str(k).strip().lower() for k in value}:
                return value
            found.append(value)
        position = end
    if found:
        return found[0]
    raise DraftError("the answer held no JSON object")


def _with_instruction(messages: list[dict]) -> list[dict]:
    """A copy of ``messages`` with the JSON instruction added to the system prompt.

    Added to the first system message rather than as a second one, because some
    chat templates accept only one system message, at the start.
    """
    if not isinstance(messages, list) or not messages:
        raise PermanentError("the draft step got no messages: pass the system prompt and the task")
    out = [dict(m) if isinstance(m, Mapping) else m for m in messages]
    first = out[0]
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        first["content"] = f"{first['content'].rstrip()}\n\n{JSON_INSTRUCTION}"
    else:
        out.insert(0, {"role": "system", "content": JSON_INSTRUCTION})
    return out


def _correction(text: str, problem: str) -> list[dict]:
    turn: list[dict] = []
    if text.strip():
        shown = text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."
        turn.append({"role": "assistant", "content": shown})
    turn.append({
        "role": "user",
        "content": (
            f"That answer could not be used: {problem}. Reply again with only a JSON object with the "
            'string fields "subject", "body" and "summary", as described in the instructions, and no other text.'
        ),
    })
    return turn


def _excerpt(text: str) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    if not flat:
        return "(empty answer)"
    if len(flat) > _EXCERPT_CHARS:
        flat = flat[:_EXCERPT_CHARS] + "..."
    return repr(flat)


def _error_detail(exc: openai.APIStatusError) -> str:
    # The client unwraps {"error": ...}: OpenAI sends an object with a message,
    # Ollama and others send a bare string.
    body = exc.body
    detail: Any = None
    if isinstance(body, Mapping):
        detail = body.get("message") or body.get("error") or body.get("detail")
    elif isinstance(body, str):
        detail = body
    if not isinstance(detail, str) or not detail.strip():
        detail = exc.message
    detail = re.sub(r"\s+", " ", str(detail)).strip()
    return detail if len(detail) <= 300 else detail[:300] + "..."


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait before retrying, from ``retry-after-ms`` or ``retry-after``.

    Both are read by ``durable_agents.steps.retry.parse_retry_after``, the one rule for every
    client: seconds or an HTTP date, a past date is 0, garbage is None, and
    anything above ``MAX_RETRY_AFTER`` is capped there.
    """
    if headers is None:
        return None
    ms = parse_retry_after(_header(headers, "retry-after-ms"), now=now, unit=0.001)
    if ms is not None:
        return ms
    return parse_retry_after(_header(headers, "retry-after"), now=now)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


def _display_url(url: str) -> str:
    """The URL without user info or query, which may hold credentials."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

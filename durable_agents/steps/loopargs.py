"""The agent loop's command-line arguments, one definition for every command that starts a loop run
(``python starter.py loop``, ``python -m durable_agents.runrecord loop``, ``python -m durable_agents.dbosflow loop``):
the same flags, the same help, the same refusals.

``add_loop_arguments`` adds RUN_ID, TASK, ``--agent MODULE:ATTR``, ``--email``, ``--param NAME=VALUE ...``,
``--max-turns``, ``--window-tokens``, ``--window-messages`` and ``--orders ORDER=CENTS ...``; ``agent_given``,
``run_params``, ``loop_numbers`` and ``orders_given`` read them back, checked (``InputError`` saying what to
give), before anything is asked of a server or a file is opened.
"""

from __future__ import annotations

import argparse

from durable_agents.agent import Agent, load_agent
from durable_agents.steps import loop
from durable_agents.steps.limits import InputError, check_email, check_text
from durable_agents.steps.refund_agent import MAX_ORDER_ID_CHARS, REFUND_AGENT
from durable_agents.steps.served import agent_name


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument("task", metavar="TASK", help="what the customer asks, e.g. naming the orders to refund")
    parser.add_argument("--agent", default=None, metavar="MODULE:ATTR",
                        help="the agent the run is run by, a durable_agents.Agent by import string (e.g. "
                             "examples.scheduler.agent:AGENT; docs/your-agent.md); default: the lab's refund agent")
    parser.add_argument("--email", default=None,
                        help="the refund agent's customer address: the only one send_email writes to (needed "
                             "for it; another agent takes its own parameters with --param)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a run parameter the agent declares (its tools read it; never from the model); "
                             "repeatable")
    parser.add_argument("--max-turns", default=None, metavar="N",
                        help=f"the turn limit, 1-{loop.MAX_TURNS_LIMIT} (default {loop.DEFAULT_MAX_TURNS}): a turn "
                             "that still asks for tools at the limit fails the run, naming it")
    parser.add_argument("--window-tokens", default=None, metavar="N",
                        help=f"the prompt window's token bound, {loop.MIN_WINDOW_TOKENS}-{loop.MAX_WINDOW_TOKENS} "
                             f"(default {loop.DEFAULT_WINDOW_TOKENS}; a long task needs more than the least: the "
                             "refusal says how many); recorded, so a resume derives the same windows")
    parser.add_argument("--window-messages", default=None, metavar="N",
                        help=f"the prompt window's message bound (default {loop.DEFAULT_WINDOW_MESSAGES}); recorded")
    parser.add_argument("--orders", nargs="+", action="extend", default=[], metavar="ORDER=CENTS",
                        help="orders the provider (PROVIDER_URL) keeps first, each with its total in cents, e.g. "
                             "A-1001=2500; harmless when it keeps them already. An order it does not keep is "
                             "answered 'no order' to the model, and nothing is refunded")


def add_decision_commands(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], func,
                          accept_seconds: bool = False) -> None:
    """``approve`` and ``deny RUN_ID CALL [--by NAME] [--reason TEXT] [--digest HEX]``: a person's decision on a
    loop run's call that waits for one (``durable_agents.steps.approval``), the same on every engine's command
    line. ``accept_seconds``: Temporal's, how long a worker has to accept it before it is kept as a signal."""
    for verdict, words in (("approve", "approve a loop run's call that waits for a person: it runs, under its key"),
                           ("deny", "deny a loop run's call that waits for a person: the model is told, nothing "
                                    "applied")):
        p = sub.add_parser(verdict, help=words, parents=parents)
        p.add_argument("run_id", metavar="RUN_ID")
        p.add_argument("call", metavar="CALL", help="the waiting call, as status shows it: turn-N/call-I")
        p.add_argument("--by", default="", help="who decides (recorded as given: not an identity checked)")
        p.add_argument("--reason", default="", help="why, one line (at most 500 characters)")
        p.add_argument("--digest", default=None, metavar="HEX",
                       help="the digest status showed for the call (12 characters or more): refused if the waiting "
                            "call is not that one")
        if accept_seconds:
            p.add_argument("--accept-seconds", default=5.0, type=float, metavar="S",
                           help="how long a worker has to accept the decision before it is kept as a signal "
                                "(default 5)")
        p.set_defaults(func=func, verdict=verdict)


def given_number(raw: str | None, default: int) -> int | str:
    """A number as given on the command line: a whole number, or the text given (which the loop's own check
    then refuses in its words, saying what to give)."""
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return raw


def agent_given(spec: str | None) -> Agent:
    """The agent ``--agent`` names (the refund agent when none); ``InputError`` saying what is wrong."""
    if not spec:
        return REFUND_AGENT
    try:
        return load_agent(spec)
    except ValueError as err:
        raise InputError(str(err)) from None


def settled_agent(spec: str | None, recorded: str, command: str) -> Agent:
    """The agent whose tools ``settle`` asks for a run recorded by agent ``recorded``: ``--agent``'s (it must be
    that agent), the refund agent when none is given and the run is the refund agent's; ``InputError`` saying
    what to give (``command``, the command again with ``--agent``)."""
    agent = agent_given(spec)
    if agent.name != agent_name(recorded):
        if spec:
            raise InputError(f"--agent {spec} is agent {agent.name!r}, but the run was started by agent "
                             f"{agent_name(recorded)!r}: name that agent's import string")
        raise InputError(f"the run was started by agent {agent_name(recorded)!r}: its tools ask their own services; "
                         f"give its import string: {command}")
    return agent


def run_params(args: argparse.Namespace, agent: Agent) -> tuple[str, dict[str, str]]:
    """(the refund agent's customer address or "", the run's parameters) from ``--email`` and ``--param``,
    checked by ``agent``'s declaration; ``InputError`` saying what to give."""
    params: dict[str, str] = {}
    for item in args.param or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(f"--param takes NAME=VALUE, got {item[:40]!r}")
        if name in params:
            raise InputError(f"--param {name[:40]!r} is given twice; give each parameter once")
        params[name] = value
    if agent.name == REFUND_AGENT.name:
        email = args.email if args.email is not None else params.pop("email", None)
        if email is None:
            raise InputError("the refund agent needs --email ADDR: the customer's address, the only one "
                             "send_email writes to")
        if params:
            raise InputError(f"the refund agent takes no --param but email; got {', '.join(sorted(params))}")
        return check_email(email), {}
    if args.email is not None:
        raise InputError(f"--email is the refund agent's; agent {agent.name} takes --param "
                         f"{' '.join(f'{p}=...' for p in agent.params) or '(none)'}")
    try:
        return "", agent.check_params(params)
    except ValueError as err:
        raise InputError(str(err)) from None


def loop_numbers(args: argparse.Namespace, start_tokens: int | None = None,
                 agent: Agent = REFUND_AGENT) -> tuple[int, int, int]:
    """(max turns, window tokens, window messages), checked (``durable_agents.steps.loop.check_loop_inputs``; with
    ``start_tokens``, the window must hold the start and one round); the agent's bounds unless given."""
    return loop.check_loop_inputs(given_number(args.max_turns, agent.max_turns),
                                  given_number(args.window_tokens, agent.window_tokens),
                                  given_number(args.window_messages, agent.window_messages), start_tokens)


def orders_given(items: list[str]) -> dict[str, int]:
    """``--orders ORDER=CENTS ...`` as ``{order id: total in cents}``; ``InputError`` saying what to give."""
    orders: dict[str, int] = {}
    for item in items:
        order, sep, cents = item.partition("=")
        order = order.strip()
        if not sep or not order or not cents.strip().isdigit() or int(cents) < 1:
            raise InputError(f"--orders {item!r}: give ORDER=CENTS, an order id and its total in cents from 1, "
                             "e.g. --orders A-1001=2500 A-1002=4000")
        check_text("order id", order, what_to_do="Give the order id as the task names it")
        if len(order) > MAX_ORDER_ID_CHARS:
            raise InputError(f"--orders: order id {order[:20]!r}... is {len(order)} characters; at most "
                             f"{MAX_ORDER_ID_CHARS}")
        orders[order] = int(cents)
    return orders

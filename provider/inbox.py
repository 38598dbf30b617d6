"""The customers' inbox: ``GET /inbox[?run_id=]``, a read-only HTML page of the
emails the provider applied, newest first.

What a learner looks at to see "exactly once" from the customer's side: each
email's subject, recipient, time, idempotency key, the start of its body and
how many requests carried its key. A run that sent more than one email (the
in-memory "before", which draws a fresh key per execution) has each of its
emails marked as a duplicate: that is the customer reading the same
confirmation twice.

Every stored value is escaped for HTML here. The text rule the provider
applies on the way in refuses control characters, not markup, so a task that
says ``<script>`` reaches this page as text and must be shown as text. The
page carries no script, and its Content-Security-Policy (set by the server)
forbids any, so an escaping mistake would show, not run.

The provider's own, like the rest of it: it imports nothing of the client side.
"""

from __future__ import annotations

from html import escape
from typing import Any

INBOX_LIMIT = 200  # newest emails on the page; the page says how many more there are
BODY_START_CHARS = 400  # enough for the greeting and the quoted task; long lines wrap
BODY_START_LINES = 5
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #1d2330; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; }
p.lead { color: #4a5264; margin: 0 0 18px; }
article { border: 1px solid #cfd6e3; border-left: 5px solid #3b6fb6; border-radius: 6px; padding: 10px 14px;
          margin: 0 0 12px; background: #fff; }
article.dup { border-left-color: #c0392b; background: #fff7f6; }
.head { display: flex; gap: 14px; align-items: baseline; flex-wrap: wrap; }
.subject { font-weight: 600; font-size: 15px; overflow-wrap: anywhere; }
.to, .when { color: #4a5264; }
.duplicate { background: #c0392b; color: #fff; border-radius: 4px; padding: 1px 8px; font-weight: 600;
             font-size: 12px; }
dl { display: grid; grid-template-columns: max-content 1fr max-content 1.7fr; gap: 1px 12px; margin: 5px 0;
     font-size: 12.5px; }
dt { color: #6b7385; }
dd { margin: 0; font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
pre.body { white-space: pre-wrap; overflow-wrap: anywhere; background: #f4f6fa; padding: 6px 10px; margin: 4px 0 0;
           border-radius: 4px; font-size: 12px; line-height: 1.3; }
p.dups { background: #fdecea; border: 1px solid #e3a49c; border-radius: 6px; padding: 6px 12px; color: #b03a2e;
         font-weight: 600; }
.more { color: #6b7385; font-size: 12px; }
"""


def _text(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _when(iso: str) -> str:
    # 2026-12-01T02:09:53.224Z -> 2026-12-01 02:09:53.224 UTC: what a person reads.
    return iso.replace("T", " ").removesuffix("Z") + " UTC" if iso.endswith("Z") else iso


def _requests(n: int) -> str:
    if n == 1:
        return "1 (this email)"
    return f"{n}: this email, then {n - 1} more with the same key, none applied again"


def _email(row: dict[str, Any]) -> str:
    dup = row["run_emails"] > 1
    mark = (f'<span class="duplicate">duplicate: email {row["nth"]} of {row["run_emails"]} for this run</span>'
            if dup else "")
    start = "\n".join(row["body_start"].split("\n")[:BODY_START_LINES]).rstrip()
    body = _text(start)
    cut = row["body_chars"] - len(start)
    more = f'<div class="more">... and {cut} more characters</div>' if cut > 0 else ""
    return (
        f'<article class="email{" dup" if dup else ""}" data-run-id="{_text(row["run_id"])}" '
        f'data-key="{_text(row["idempotency_key"])}" data-duplicate="{"yes" if dup else "no"}">'
        f'<div class="head"><span class="subject">{_text(row["subject"])}</span>'
        f'<span class="to">to {_text(row["to"])}</span><span class="when">{_text(_when(row["created_at"]))}</span>'
        f"{mark}</div>"
        f"<dl><dt>run</dt><dd>{_text(row['run_id'])}</dd>"
        f"<dt>idempotency key</dt><dd>{_text(row['idempotency_key'])}</dd>"
        f"<dt>requests with this key</dt><dd>{_text(_requests(row['requests']))}</dd>"
        f"<dt>message id</dt><dd>{_text(row['message_id'])}</dd></dl>"
        f'<pre class="body">{body}</pre>{more}</article>'
    )


def render_inbox(rows: list[dict[str, Any]], total: int, run_id: str | None) -> str:
    """The page, from ``Store.inbox``'s rows (newest first) and the number of emails in all."""
    scope = f" of run <code>{_text(run_id)}</code>" if run_id is not None else ""
    runs = {r["run_id"]: r["run_emails"] for r in rows if r["run_emails"] > 1}
    lead = (f"{total} email{'' if total == 1 else 's'} applied{scope}, newest first"
            + (f" (the newest {len(rows)} shown)" if total > len(rows) else "") + ". Each idempotency key was "
            "applied at most once; a run that sent more than one email is marked.")
    dups = "".join(f'<p class="dups">Run <code>{_text(run)}</code> sent {n} emails: the customer got its '
                   f"confirmation {n} times.</p>" for run, n in runs.items())
    emails = "".join(_email(r) for r in rows) or "<p>No email has been applied yet.</p>"
    back = ' <a href="/inbox">All runs</a>.' if run_id is not None else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Inbox{' - ' + _text(run_id) if run_id is not None else ''}</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>The customers' inbox</h1>"
        f'<p class="lead">{lead}{back}</p>{dups}'
        f'<main id="emails">{emails}</main></body></html>'
    )

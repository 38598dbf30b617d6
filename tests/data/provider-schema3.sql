-- A provider store made by the provider of 7edebac (schema 3: emails, tickets and refunds, no orders), dumped as
-- SQL: tests/test_migrations.py builds the file from it. Never made again: it stands for the files in the field.
BEGIN TRANSACTION;
CREATE TABLE emails (
    message_id      TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    run_id          TEXT NOT NULL,
    to_address      TEXT NOT NULL,
    subject         TEXT NOT NULL,
    body            TEXT NOT NULL,
    created_at      TEXT NOT NULL
, metadata TEXT);
INSERT INTO "emails" VALUES('msg_8407877ff0a18d6156a6ff62','agentlab/v3-run/send_confirmation','v3-run','ada@example.com','Your refund','Hello Ada,

Done.
','2026-12-01T18:06:08.618Z',NULL);
CREATE TABLE "idempotency_keys" (
    key           TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL,            -- arrival order, for stable listings
    kind          TEXT NOT NULL CHECK (kind IN ('email', 'ticket', 'refund')),
    run_id        TEXT,
    requests      INTEGER NOT NULL,
    status_code   INTEGER,                     -- status of the latest response for this key
    method        TEXT,                        -- set, with the rest, once the effect is applied
    path          TEXT,
    fingerprint   TEXT,
    response_json TEXT,
    first_seen    TEXT NOT NULL,
    last_seen     TEXT NOT NULL
);
INSERT INTO "idempotency_keys" VALUES('agentlab/v3-run/send_confirmation',1,'email','v3-run',1,200,'POST','/v1/emails','c20af5dadac40c22d6a21db387a4b4476aa7d24d084333342578a657e441323e','{"message_id": "msg_8407877ff0a18d6156a6ff62", "run_id": "v3-run", "to": "ada@example.com", "subject": "Your refund", "idempotency_key": "agentlab/v3-run/send_confirmation", "created_at": "2026-12-01T18:06:08.618Z", "replayed": false}','2026-12-01T18:06:08.618Z','2026-12-01T18:06:08.618Z');
INSERT INTO "idempotency_keys" VALUES('agentlab/v3-run/issue_refund',2,'refund','v3-run',2,200,'POST','/v1/refunds','fcbca3efcaa147985dad9e84d47ec01c73e457e7f5877ec364d796ed0fbe0d8f','{"refund_id": "rfd_02e6b66b7ef4536995d20223", "run_id": "v3-run", "order_id": "A-3000", "amount": 1250, "idempotency_key": "agentlab/v3-run/issue_refund", "created_at": "2026-12-01T18:06:08.623Z", "replayed": false}','2026-12-01T18:06:08.623Z','2026-12-01T18:06:08.627Z');
INSERT INTO "idempotency_keys" VALUES('agentlab/v3-run/record_outcome',3,'ticket','v3-run',1,200,'POST','/v1/tickets','b11ca535b2900d56dd60a0cb3cfd899831fe6b113b1caba167abb2da0bdf82e2','{"ticket_id": "tkt_566a9c094127f4ca8a2633b1", "run_id": "v3-run", "summary": "Refund confirmed", "email_message_id": "msg_8407877ff0a18d6156a6ff62", "idempotency_key": "agentlab/v3-run/record_outcome", "created_at": "2026-12-01T18:06:08.630Z", "replayed": false}','2026-12-01T18:06:08.630Z','2026-12-01T18:06:08.630Z');
INSERT INTO "idempotency_keys" VALUES('agentlab/v3-other/issue_refund',4,'refund','v3-other',1,422,NULL,NULL,NULL,NULL,'2026-12-01T18:06:08.634Z','2026-12-01T18:06:08.634Z');
CREATE TABLE refunds (
    refund_id TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    run_id TEXT NOT NULL,
    order_id TEXT NOT NULL,
    amount INTEGER NOT NULL,
    metadata TEXT,
    created_at TEXT NOT NULL
);
INSERT INTO "refunds" VALUES('rfd_02e6b66b7ef4536995d20223','agentlab/v3-run/issue_refund','v3-run','A-3000',1250,'{"lab_start_id": "0123abcd"}','2026-12-01T18:06:08.623Z');
CREATE TABLE tickets (
    ticket_id        TEXT PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    run_id           TEXT NOT NULL,
    summary          TEXT NOT NULL,
    email_message_id TEXT NOT NULL,
    created_at       TEXT NOT NULL
, metadata TEXT);
INSERT INTO "tickets" VALUES('tkt_566a9c094127f4ca8a2633b1','agentlab/v3-run/record_outcome','v3-run','Refund confirmed','msg_8407877ff0a18d6156a6ff62','2026-12-01T18:06:08.630Z',NULL);
CREATE INDEX emails_run ON emails (run_id);
CREATE INDEX tickets_run ON tickets (run_id);
CREATE INDEX refunds_run ON refunds (run_id);
CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id, seq);
COMMIT;
PRAGMA user_version=3;

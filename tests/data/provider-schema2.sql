-- A provider store made by the provider of bae0eb8 (schema 2, emails and tickets only), dumped as SQL:
-- tests/test_migrations.py builds the file from it. Never made again: it stands for the files in the field.
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
INSERT INTO "emails" VALUES('msg_de7af356305d2cce1a2513db','agentlab/v2-run/send_confirmation','v2-run','ada@example.com','Your refund','Hello Ada,

Done.
','2026-12-01T15:45:05.665Z','{"lab_start_id": "0123abcd"}');
CREATE TABLE idempotency_keys (
    key           TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL,            -- arrival order, for stable listings
    kind          TEXT NOT NULL CHECK (kind IN ('email', 'ticket')),
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
INSERT INTO "idempotency_keys" VALUES('agentlab/v2-run/send_confirmation',1,'email','v2-run',2,200,'POST','/v1/emails','6cd90f63e06a2621195edef72b84190d499ab01b7a0eb387734754ae8bb87f97','{"message_id": "msg_de7af356305d2cce1a2513db", "run_id": "v2-run", "to": "ada@example.com", "subject": "Your refund", "idempotency_key": "agentlab/v2-run/send_confirmation", "created_at": "2026-12-01T15:45:05.665Z", "replayed": false}','2026-12-01T15:45:05.665Z','2026-12-01T15:45:05.671Z');
INSERT INTO "idempotency_keys" VALUES('agentlab/v2-run/record_outcome',2,'ticket','v2-run',1,200,'POST','/v1/tickets','142f256f741055b21161fe943a3c269a4cf5499071e2053a16eebcaabdb47960','{"ticket_id": "tkt_90db9ff80cada898f86f461f", "run_id": "v2-run", "summary": "Refund confirmed", "email_message_id": "msg_de7af356305d2cce1a2513db", "idempotency_key": "agentlab/v2-run/record_outcome", "created_at": "2026-12-01T15:45:05.689Z", "replayed": false}','2026-12-01T15:45:05.689Z','2026-12-01T15:45:05.689Z');
INSERT INTO "idempotency_keys" VALUES('agentlab/v2-other/record_outcome',3,'ticket','v2-other',1,422,NULL,NULL,NULL,NULL,'2026-12-01T15:45:05.694Z','2026-12-01T15:45:05.694Z');
CREATE TABLE tickets (
    ticket_id        TEXT PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    run_id           TEXT NOT NULL,
    summary          TEXT NOT NULL,
    email_message_id TEXT NOT NULL,
    created_at       TEXT NOT NULL
, metadata TEXT);
INSERT INTO "tickets" VALUES('tkt_90db9ff80cada898f86f461f','agentlab/v2-run/record_outcome','v2-run','Refund confirmed','msg_de7af356305d2cce1a2513db','2026-12-01T15:45:05.689Z',NULL);
CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id, seq);
CREATE INDEX emails_run ON emails (run_id);
CREATE INDEX tickets_run ON tickets (run_id);
COMMIT;
PRAGMA user_version=2;

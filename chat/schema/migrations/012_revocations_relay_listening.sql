-- 012_revocations_relay_listening: revoked tokens, and whether each relay's
-- LISTEN connection is up. Applied like 001 (search_path = the service's
-- schema, as its role). Shipped: never edit; add a later file instead.

-- One row per revocation, written by `outboxchat revoke` (an operator's
-- connection) and read by every API process of the service, which polls it
-- about once a second for rows whose version is above the last it saw:
--   kind 'user':  value is a token subject (sub); every token of that user
--                 issued (iat) at or before revoked_at is refused, and so is
--                 one without iat; a token issued later passes;
--   kind 'token': value is a token id (jti); that token is refused.
-- Revoking the same subject or id again moves revoked_at and version on
-- (ON CONFLICT DO UPDATE), so the pollers see the change.
CREATE SEQUENCE revoked_tokens_version;
CREATE TABLE revoked_tokens (
  kind       text        NOT NULL CHECK (kind IN ('user', 'token')),
  value      text        NOT NULL CHECK (value <> ''),
  revoked_at timestamptz NOT NULL DEFAULT now(),
  reason     text        NOT NULL DEFAULT '',
  version    bigint      NOT NULL DEFAULT nextval('revoked_tokens_version'),
  PRIMARY KEY (kind, value)
);
CREATE INDEX revoked_tokens_version_idx ON revoked_tokens (version);

-- The relay heartbeat also says whether that relay's LISTEN connection was
-- up (null: a poll-only relay, or one written before this migration), so
-- `outboxchat status` can name a relay that finds new rows only by its
-- poll.
ALTER TABLE relay_heartbeat ADD COLUMN listening boolean;

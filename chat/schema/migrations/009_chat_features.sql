-- 009_chat_features: edits and deletes as versioned events, read receipts,
-- the chat list. Applied like 001 (search_path = the service's schema, as
-- its role). Shipped: never edit; add a later file instead.

-- Each message, sent (messages) or received (inbox), carries its version:
-- 1 as sent, n+1 after each edit or the delete. A delete keeps the row
-- (its seq stays taken, the receiver's watermark stays whole) with an
-- empty body and deleted = true. Constant defaults: no table rewrite, and
-- the send path's and inbox's inserts are unchanged.
ALTER TABLE messages
  ADD COLUMN version   integer     NOT NULL DEFAULT 1 CHECK (version > 0),
  ADD COLUMN edited_at timestamptz,
  ADD COLUMN deleted   boolean     NOT NULL DEFAULT false;
ALTER TABLE inbox
  ADD COLUMN version   integer     NOT NULL DEFAULT 1 CHECK (version > 0),
  ADD COLUMN edited_at timestamptz,
  ADD COLUMN deleted   boolean     NOT NULL DEFAULT false;

-- Receiver: an edit or delete that arrived before its message (the queue
-- does not keep one message's events in order: reclaims, re-drives, two
-- workers). It is held here, acknowledged, and applied when the message
-- is in the inbox (receive.HeldChanges); a version the row already has or
-- passed is dropped then, and so is a change of a message at or below the
-- chat's floor (received once, deleted since). Empty in steady state.
CREATE TABLE inbox_held_changes (
  message_id uuid        NOT NULL,
  version    integer     NOT NULL CHECK (version > 1),
  chat_id    bigint      NOT NULL,
  seq        bigint      NOT NULL,
  body       text        NOT NULL,
  edited_at  timestamptz NOT NULL,
  deleted    boolean     NOT NULL,
  held_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (message_id, version)
);

-- Reader: up to which seq each user of this service has read the other
-- service's messages of a chat (POST /api/chats/{id}/read). One row per
-- (chat, user), moved forward only; the unread count is the inbox rows
-- above it (an index range of inbox (chat_id, seq)).
CREATE TABLE read_marks (
  chat_id  bigint      NOT NULL,
  reader   text        NOT NULL,
  upto_seq bigint      NOT NULL CHECK (upto_seq >= 0),
  read_at  timestamptz NOT NULL,
  PRIMARY KEY (chat_id, reader)
);

-- Sender: read receipts from the other service, as receipts (007): "every
-- message of chat_id with seq <= upto_seq was read at read_at" by someone
-- on the other side. Insert-only, and only above the chat's newest row,
-- so upto_seq and read_at grow along a chat's rows; a message's read_at is
-- the time of the first row at or above its seq.
CREATE TABLE reads (
  chat_id  bigint      NOT NULL,
  upto_seq bigint      NOT NULL CHECK (upto_seq > 0),
  read_at  timestamptz NOT NULL,
  PRIMARY KEY (chat_id, upto_seq)
);

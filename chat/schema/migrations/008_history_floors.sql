-- 008_history_floors: history that can be deleted without a chat's seq
-- going backwards on the sender or its watermark on the receiver. Applied
-- like 001 (search_path = the service's schema, as its role). Shipped:
-- never edit; add a later file instead.
--
-- A chat's next seq is max(seq)+1 and a receiver's watermark followed the
-- row below each new one, so any DELETE of rows (retention, an operator's
-- hand, a restore) used to hand out seqs again (the receiver's UNIQUE
-- (chat_id, seq) then dead-letters the new message, or an old receipt marks
-- it delivered before it was sent), and left the receiver's next message
-- held behind a predecessor that was gone (re-driven forever). Now what a
-- DELETE takes away is remembered, per chat, by a statement-level trigger
-- reading the statement's transition table: nothing is done per insert,
-- and one row per chat per DELETE statement.

-- Sender: "chat_id's seqs up to seq are taken", so the next seq is above
-- it. Only inserted into: by the trigger (the messages up to seq were
-- deleted), and by a receipt whose upto_seq is above the chat's newest
-- message (the other side holds seqs this side lost, e.g. to a restore).
-- The send's last-seq read takes the greater of max(seq) and the newest
-- floor (a backward step of the primary key).
CREATE TABLE seq_floors (
  chat_id bigint NOT NULL,
  seq     bigint NOT NULL,
  PRIMARY KEY (chat_id, seq)
);

-- SET search_path FROM CURRENT: the function is created in (and reads) the
-- schema the migration runs in, whatever the deleting session's path. A
-- TRUNCATE fires no DELETE trigger: before one, the same function reads the
-- whole table instead of the transition table (one pass over what the
-- TRUNCATE is about to drop).
CREATE FUNCTION record_seq_floor() RETURNS trigger LANGUAGE plpgsql
  SET search_path FROM CURRENT AS $$
BEGIN
  EXECUTE format('INSERT INTO seq_floors (chat_id, seq)
    SELECT g.chat_id, max(g.seq) FROM %I g GROUP BY g.chat_id
    ON CONFLICT DO NOTHING', CASE WHEN TG_OP = 'TRUNCATE' THEN TG_TABLE_NAME ELSE 'gone' END);
  RETURN NULL;
END $$;

CREATE TRIGGER messages_seq_floor AFTER DELETE ON messages
  REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION record_seq_floor();
CREATE TRIGGER messages_seq_floor_truncate BEFORE TRUNCATE ON messages
  FOR EACH STATEMENT EXECUTE FUNCTION record_seq_floor();

-- Receiver: a deleted inbox row that had every seq below it in the inbox
-- (not held, or held at or below the chat's newest gap fill) proves seqs
-- 1..seq were all received. That goes into inbox_gap_fills, whose meaning
-- becomes "seqs 1..upto have all been stored in the inbox" (some may be
-- deleted since): the inbox insert and the receipts' emit read the newest
-- one as the chat's floor, so a chat whose rows are gone keeps its
-- watermark, and a message at or below the floor whose row is gone is a
-- delivery of one already received (a duplicate), not a new one.
-- Rows deleted above the watermark (held behind a gap) prove nothing: the
-- sender has no receipt for them and publishes them again.
CREATE FUNCTION record_inbox_floor() RETURNS trigger LANGUAGE plpgsql
  SET search_path FROM CURRENT AS $$
BEGIN
  EXECUTE format('INSERT INTO inbox_gap_fills (chat_id, upto)
    SELECT g.chat_id, max(g.seq) FROM %I g
    WHERE NOT g.held OR g.seq <= coalesce((SELECT f.upto FROM inbox_gap_fills f
      WHERE f.chat_id = g.chat_id ORDER BY f.upto DESC LIMIT 1), 0)
    GROUP BY g.chat_id
    ORDER BY g.chat_id
    ON CONFLICT DO NOTHING', CASE WHEN TG_OP = 'TRUNCATE' THEN TG_TABLE_NAME ELSE 'gone' END);
  RETURN NULL;
END $$;

CREATE TRIGGER inbox_floor AFTER DELETE ON inbox
  REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION record_inbox_floor();
CREATE TRIGGER inbox_floor_truncate BEFORE TRUNCATE ON inbox
  FOR EACH STATEMENT EXECUTE FUNCTION record_inbox_floor();

-- The floors are the only record of what was deleted, so each chat's
-- newest floor stays: a DELETE that takes it away puts it back (rows below
-- it, which nothing reads, may go: retention prunes them), and a TRUNCATE
-- of a floor table is refused — also when it comes with the table whose
-- floor it records, whose own trigger writes the floor the TRUNCATE would
-- then empty.
CREATE FUNCTION keep_newest_floor() RETURNS trigger LANGUAGE plpgsql
  SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_TABLE_NAME = 'seq_floors' THEN
    INSERT INTO seq_floors (chat_id, seq)
      SELECT g.chat_id, max(g.seq) FROM gone g GROUP BY g.chat_id
      HAVING max(g.seq) > coalesce((SELECT f.seq FROM seq_floors f
        WHERE f.chat_id = g.chat_id ORDER BY f.seq DESC LIMIT 1), 0)
      ORDER BY g.chat_id
      ON CONFLICT DO NOTHING;
  ELSE
    INSERT INTO inbox_gap_fills (chat_id, upto)
      SELECT g.chat_id, max(g.upto) FROM gone g GROUP BY g.chat_id
      HAVING max(g.upto) > coalesce((SELECT f.upto FROM inbox_gap_fills f
        WHERE f.chat_id = g.chat_id ORDER BY f.upto DESC LIMIT 1), 0)
      ORDER BY g.chat_id
      ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END $$;

CREATE FUNCTION refuse_floor_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% holds each chat''s floor, which seq numbering and receipts need: delete history rows instead (the floors below each chat''s newest may be deleted)', TG_TABLE_NAME
    USING ERRCODE = 'restrict_violation';
END $$;

CREATE TRIGGER seq_floors_keep_newest AFTER DELETE ON seq_floors
  REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION keep_newest_floor();
CREATE TRIGGER seq_floors_no_truncate BEFORE TRUNCATE ON seq_floors
  FOR EACH STATEMENT EXECUTE FUNCTION refuse_floor_truncate();
CREATE TRIGGER inbox_gap_fills_keep_newest AFTER DELETE ON inbox_gap_fills
  REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION keep_newest_floor();
CREATE TRIGGER inbox_gap_fills_no_truncate BEFORE TRUNCATE ON inbox_gap_fills
  FOR EACH STATEMENT EXECUTE FUNCTION refuse_floor_truncate();

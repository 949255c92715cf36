package receive

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/inbox"
)

// changeQueries are the statements that apply the other service's edits,
// deletes (chat.Change) and read receipts (chat.ReadMark) in the inbox
// transaction (migration 009).
type changeQueries struct {
	// apply applies a batch's changes ($1 message ids, $2 chats, $3
	// versions, $4 bodies, $5 times, $6 deleted): per message, its highest
	// version in the batch is written when it is above the inbox row's,
	// which makes a duplicate, or an older version that comes late, a
	// no-op; each message updated gets a NOTIFY on $7
	// ("chat_id:origin:message_id"). The changes of a message that is not
	// in the inbox yet are held in inbox_held_changes (HeldChanges applies
	// them once it is); those of a message at or below the chat's floor
	// (received once and deleted since: migration 008) are dropped. It returns, per message of the batch, the version
	// that counts, whether it was applied, and whether it was held.
	apply string
	// reads records read receipts as apply of receipts does (insert-only,
	// one row per chat advanced, only above the chat's newest) in
	// <service>.reads and NOTIFYs $4 with the chats that advanced.
	reads string
}

func newChangeQueries(service string) changeQueries {
	s := pgx.Identifier{service}.Sanitize()
	return changeQueries{
		apply: `WITH e AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::text[], $5::timestamptz[], $6::bool[], $8::bigint[])
				AS e(id, chat, version, body, at, deleted, seq)),
			b AS (SELECT DISTINCT ON (id) * FROM e ORDER BY id, version DESC),
			upd AS (UPDATE ` + s + `.inbox i SET body = b.body, version = b.version, edited_at = b.at, deleted = b.deleted
				FROM b WHERE i.message_id = b.id AND i.chat_id = b.chat AND i.version < b.version
				RETURNING i.message_id, i.chat_id, i.sender),
			miss AS MATERIALIZED (SELECT b.id FROM b WHERE NOT EXISTS (SELECT 1 FROM ` + s + `.inbox i WHERE i.message_id = b.id)
				AND b.seq > coalesce((SELECT g.upto FROM ` + s + `.inbox_gap_fills g
					WHERE g.chat_id = b.chat ORDER BY g.upto DESC LIMIT 1), 0)),
			held AS (INSERT INTO ` + s + `.inbox_held_changes (message_id, version, chat_id, seq, body, edited_at, deleted)
				SELECT e.id, e.version, e.chat, e.seq, e.body, e.at, e.deleted FROM e WHERE e.id IN (SELECT id FROM miss)
				ON CONFLICT DO NOTHING),
			note AS (SELECT pg_notify($7, u.chat_id || ':' || u.sender || ':' || u.message_id) FROM upd u)
			SELECT b.id::text, b.version, u.message_id IS NOT NULL, b.id IN (SELECT id FROM miss), (SELECT count(*) FROM note)
			FROM b LEFT JOIN upd u ON u.message_id = b.id`,
		reads: watermarkCTEs(s+".reads", "read_at", "chat_id, upto_seq, read_at") + `,
			note AS (SELECT pg_notify($4, string_agg(chat_id || ':' || upto_seq || ':' ||
					(extract(epoch FROM read_at) * 1000000)::bigint, ',')) FROM ins HAVING count(*) > 0)
			SELECT (SELECT count(*) FROM note)`,
	}
}

// isChangeEvent reports whether name is an event changeBatch takes.
func isChangeEvent(name string) bool {
	return name == chat.EventMessageEdited || name == chat.EventMessageDeleted || name == chat.EventMessageRead
}

// changeBatch collects one inbox batch's changes and read receipts while
// QueueBatch walks the deliveries, and queues their statements after the
// batch's message insert (queue), so a change whose message is in the same
// batch finds it.
type changeBatch struct {
	rs            []inbox.BatchResult
	idx           []int // delivery index per change
	changes       []chat.Change
	rChats, rUpto []int64
	rAts          []time.Time
	channel       string
	readChan      string
	q             *changeQueries
}

// add takes delivery i (a change or read event, already verified): decoded
// and checked as checkDecoded does, or its result gets the error.
func (c *changeBatch) add(h *InboxHandler, d inbox.Delivery, i int, rs []inbox.BatchResult) {
	c.rs, c.q = rs, &h.cq
	c.channel, c.readChan = chat.ChangeChannel(h.service), chat.ReadChannel(h.service)
	if d.Name == chat.EventMessageRead {
		r, err := chat.DecodeReadMark(d.Payload)
		if err := h.checkDecoded(d, "read", r.ID, r.From, err); err != nil {
			rs[i].Err = err
			return
		}
		c.rChats, c.rUpto, c.rAts = append(c.rChats, r.ChatID), append(c.rUpto, r.UptoSeq), append(c.rAts, r.ReadAt)
		rs[i].Fresh, rs[i].Value = true, r
		return
	}
	ch, err := chat.DecodeChange(d.Name, d.Payload)
	if err := h.checkDecoded(d, "change", ch.ID, ch.From, err); err != nil {
		rs[i].Err = err
		return
	}
	c.idx, c.changes = append(c.idx, i), append(c.changes, ch)
}

// queue queues the batch's statements on b (none when it has no change).
func (c *changeBatch) queue(b *pgx.Batch) {
	if len(c.rChats) > 0 {
		b.Queue(c.q.reads, c.rChats, c.rUpto, c.rAts, c.readChan).Query(func(rows pgx.Rows) error {
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("apply read receipts: %w", err)
			}
			return nil
		})
	}
	if len(c.changes) == 0 {
		return
	}
	n := len(c.changes)
	ids, chats, versions, seqs := make([]string, n), make([]int64, n), make([]int32, n), make([]int64, n)
	bodies, ats, dels := make([]string, n), make([]time.Time, n), make([]bool, n)
	for k, ch := range c.changes {
		ids[k], chats[k], versions[k], seqs[k] = ch.MessageID, ch.ChatID, int32(ch.Version), ch.Seq
		bodies[k], ats[k], dels[k] = ch.Body, ch.EditedAt, ch.Deleted
	}
	b.Queue(c.q.apply, ids, chats, versions, bodies, ats, dels, c.channel, seqs).Query(func(rows pgx.Rows) error {
		type outcome struct {
			version       int32
			applied, held bool
		}
		got := map[string]outcome{}
		for rows.Next() {
			var id string
			var o outcome
			var notes int64
			if err := rows.Scan(&id, &o.version, &o.applied, &o.held, &notes); err != nil {
				return fmt.Errorf("apply changes: %w", err)
			}
			got[id] = o
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("apply changes: %w", err)
		}
		// A change counts as fresh when it is held, or is the version that
		// was applied (once per batch); any other is a duplicate, or one
		// superseded by a higher version.
		seen := map[string]bool{}
		for k, ch := range c.changes {
			o := got[ch.MessageID]
			key := ch.MessageID + ":" + fmt.Sprint(ch.Version)
			if seen[key] {
				continue
			}
			if o.held || (o.applied && o.version == int32(ch.Version)) {
				seen[key] = true
				c.rs[c.idx[k]].Fresh, c.rs[c.idx[k]].Value = true, ch
			}
		}
		return nil
	})
}

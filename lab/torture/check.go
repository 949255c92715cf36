package torture

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/store/prune"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// sentCopy returns the 201 sends so far.
func (t *run) sentCopy() []sentMsg {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sent)
}

// drained reports whether the drain is done (see drainState).
func (t *run) drained(ctx context.Context) bool { return t.drainState(ctx) == "" }

// drainState returns "" when every 201 send is in the receiver's inbox,
// every client has seen 1..N of both sides of its chat (N read from the
// senders' messages tables), both outboxes are empty and both streams'
// groups have nothing pending or undelivered; else what is missing.
func (t *run) drainState(ctx context.Context) string {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var missing []string
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for p := range max(t.e.Partitions, 1) {
			table := chat.OutboxTable(svc, p)
			var unsent int
			if err := t.e.Admin().QueryRow(qctx, `SELECT count(*) FROM `+table+` WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
				return "database: " + err.Error()
			}
			if unsent > 0 {
				missing = append(missing, fmt.Sprintf("%s: %d unsent", table, unsent))
			}
		}
		if s := probe.StreamDrained(qctx, t.e, svc); s != "" {
			missing = append(missing, s)
		}
	}
	inInbox, err := t.inboxed(qctx)
	if err != nil {
		return "database: " + err.Error()
	}
	notIn := 0
	for _, m := range t.sentCopy() {
		if _, ok := inInbox[m.ID]; !ok {
			notIn++
		}
	}
	if notIn > 0 {
		missing = append(missing, fmt.Sprintf("%d sends not in the receiver's inbox", notIn))
	}
	tops, err := t.tops(qctx)
	if err != nil {
		return "database: " + err.Error()
	}
	pruned, err := t.prunedSeqs(qctx)
	if err != nil {
		return "database: " + err.Error()
	}
	unseen := 0
	for _, ws := range t.clients {
		for _, w := range ws {
			for _, side := range []string{chat.Consumers, chat.Workers} {
				seen := w.Seen(side)
				for seq := int64(1); seq <= tops[side][t.chats[w]]; seq++ {
					if _, ok := seen[seq]; !ok && !pruned[seqKey{side, t.chats[w], seq}] {
						unseen++
					}
				}
			}
		}
	}
	if unseen > 0 {
		missing = append(missing, fmt.Sprintf("%d (client, side, seq) not shown yet", unseen))
	}
	if diff, err := t.versionDiffs(qctx); err != nil {
		return "database: " + err.Error()
	} else if len(diff) > 0 {
		missing = append(missing, fmt.Sprintf("%d message(s) whose latest version is not on the other side yet", len(diff)))
	}
	return strings.Join(missing, ", ")
}

// versionDiffs lists the messages whose version, body or deleted flag on
// the sender differs from the receiver's inbox row, and the changes still
// held on a receiver (waiting for a message that is there or lost).
func (t *run) versionDiffs(ctx context.Context) ([]string, error) {
	var out []string
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		peer := chat.Peer(svc)
		rows, err := t.e.Admin().Query(ctx, `SELECT m.id::text, m.version, i.version, m.deleted, i.deleted
			FROM `+svc+`.messages m JOIN `+peer+`.inbox i ON i.message_id = m.id
			WHERE (m.version, m.body, m.deleted) IS DISTINCT FROM (i.version, i.body, i.deleted)`)
		if err != nil {
			return nil, err
		}
		var id string
		var mv, iv int32
		var md, id2 bool
		if _, err := pgx.ForEachRow(rows, []any{&id, &mv, &iv, &md, &id2}, func() error {
			out = append(out, fmt.Sprintf("%s message %s: version %d (deleted %v) there, %d (deleted %v) on %s", svc, id, mv, md, iv, id2, peer))
			return nil
		}); err != nil {
			return nil, err
		}
		var held int
		if err := t.e.Admin().QueryRow(ctx, `SELECT count(*) FROM `+peer+`.inbox_held_changes`).Scan(&held); err != nil {
			return nil, err
		}
		if held > 0 {
			out = append(out, fmt.Sprintf("%d change(s) of %s still held on %s", held, svc, peer))
		}
	}
	return out, nil
}

// inboxed returns every inbox row of both services, with those a
// prune took (t.keep): message id → row.
func (t *run) inboxed(ctx context.Context) (map[string]sentMsg, error) {
	return t.withKept(t.rowsByID(ctx, t.e.Admin(), inboxQuery, chat.Peer))(t.keptInbox)
}

// stored returns every messages row of both services, with those a prune
// took: message id → row.
func (t *run) stored(ctx context.Context) (map[string]sentMsg, error) {
	return t.withKept(t.rowsByID(ctx, t.e.Admin(), messagesQuery, func(svc string) string { return svc }))(t.keptStored)
}

const (
	inboxQuery    = `SELECT message_id::text, chat_id, seq FROM %s.inbox`
	messagesQuery = `SELECT id::text, chat_id, seq FROM %s.messages`
)

// tableRows reads the inbox and messages rows of both services as they are
// now (without the kept ones): message id → row.
func (t *run) tableRows(ctx context.Context) (inbox, messages map[string]sentMsg, err error) {
	return t.tableRowsOn(ctx, t.e.Admin())
}

// tableRowsOn is tableRows read through db (a transaction, for keepAndPrune).
func (t *run) tableRowsOn(ctx context.Context, db querier) (inbox, messages map[string]sentMsg, err error) {
	if inbox, err = t.rowsByID(ctx, db, inboxQuery, chat.Peer); err != nil {
		return nil, nil, err
	}
	if messages, err = t.rowsByID(ctx, db, messagesQuery, func(svc string) string { return svc }); err != nil {
		return nil, nil, err
	}
	return inbox, messages, nil
}

// querier is what rowsByID reads through: the admin pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// keepAndPrune prunes cfg's history and keeps what it is about to delete:
// the inbox and messages rows of both services are added to what the
// checker keeps of them (keptInbox, keptStored), so that the rows the
// prune deletes still count as stored and received. Both read one
// snapshot (a REPEATABLE READ transaction): a row committed between a
// separate read and the prune (an inbox transaction that began before the
// prune's cutoff and committed after the read) would be deleted unseen
// and counted lost. It returns the rows deleted.
func (t *run) keepAndPrune(ctx context.Context, cfg prune.Config) (int64, error) {
	tx, err := t.e.Admin().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	in, st, err := t.tableRowsOn(ctx, tx)
	if err != nil {
		return 0, err
	}
	t.keep(in, st)
	n, err := prune.Run(ctx, tx, cfg)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return n.Total(), nil
}

// keep adds rows read from the inbox and messages tables to keptInbox and
// keptStored.
func (t *run) keep(in, st map[string]sentMsg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keptInbox == nil {
		t.keptInbox, t.keptStored = map[string]sentMsg{}, map[string]sentMsg{}
	}
	maps.Copy(t.keptInbox, in)
	maps.Copy(t.keptStored, st)
}

// wasInbox reports whether message id was in a receiver's inbox when the
// checker last kept the rows (before a prune).
func (t *run) wasInbox(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.keptInbox[id]
	return ok
}

// seqKey is one message by its origin, chat and seq.
type seqKey struct {
	side      string
	chat, seq int64
}

// prunedSeqs returns the messages a prune deleted: kept (before a prune)
// and no longer in the table they were kept from. A client that had not
// shown one of them by then never can: history older than the retention
// is gone, which is what retention is for (a socket frozen or away longer
// than it). They are counted apart (ScheduleResult.PrunedUnseen), not as
// lost: the receiver had each (its row was kept from the inbox or the
// sender had its receipt).
func (t *run) prunedSeqs(ctx context.Context) (map[seqKey]bool, error) {
	in, st, err := t.tableRows(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[seqKey]bool{}
	for kept, now := range map[*map[string]sentMsg]map[string]sentMsg{&t.keptInbox: in, &t.keptStored: st} {
		for id, m := range *kept {
			if _, ok := now[id]; !ok {
				out[seqKey{m.From, m.ChatID, m.Seq}] = true
			}
		}
	}
	return out, nil
}

// withKept returns a function that adds the kept rows it is given to
// rows (the rows read now win).
func (t *run) withKept(rows map[string]sentMsg, err error) func(kept map[string]sentMsg) (map[string]sentMsg, error) {
	return func(kept map[string]sentMsg) (map[string]sentMsg, error) {
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		for id, m := range kept {
			if _, ok := rows[id]; !ok {
				rows[id] = m
			}
		}
		return rows, nil
	}
}

// rowsByID runs query (%s = the service's schema; columns id, chat_id,
// seq) on both services and returns id → row, From set to from(svc).
func (t *run) rowsByID(ctx context.Context, db querier, query string, from func(svc string) string) (map[string]sentMsg, error) {
	out := map[string]sentMsg{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		rows, err := db.Query(ctx, fmt.Sprintf(query, svc))
		if err != nil {
			return nil, err
		}
		m := sentMsg{From: from(svc)}
		if _, err := pgx.ForEachRow(rows, []any{&m.ID, &m.ChatID, &m.Seq}, func() error {
			out[m.ID] = m
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// floors returns, per service whose messages they are and per chat, the
// newest floor a delete left: sent[origin], the origin's own seq floor
// (its messages up to it are taken); received[origin], the receiver's gap
// fill (the origin's messages up to it were all received; migration 008).
func (t *run) floors(ctx context.Context) (sent, received map[string]map[int64]int64, err error) {
	sent, received = map[string]map[int64]int64{}, map[string]map[int64]int64{}
	read := func(into map[int64]int64, query string) error {
		rows, err := t.e.Admin().Query(ctx, query)
		if err != nil {
			return err
		}
		var c, f int64
		_, err = pgx.ForEachRow(rows, []any{&c, &f}, func() error {
			into[c] = f
			return nil
		})
		return err
	}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		sent[svc], received[chat.Peer(svc)] = map[int64]int64{}, map[int64]int64{}
		if err := read(sent[svc], `SELECT chat_id, max(seq) FROM `+svc+`.seq_floors GROUP BY chat_id`); err != nil {
			return nil, nil, err
		}
		if err := read(received[chat.Peer(svc)], `SELECT chat_id, max(upto) FROM `+svc+`.inbox_gap_fills GROUP BY chat_id`); err != nil {
			return nil, nil, err
		}
	}
	return sent, received, nil
}

// tops returns, per side and chat, the highest seq the side stored.
func (t *run) tops(ctx context.Context) (map[string]map[int64]int64, error) {
	out := map[string]map[int64]int64{}
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		out[svc] = map[int64]int64{}
		rows, err := t.e.Admin().Query(ctx, `SELECT chat_id, max(seq) FROM `+svc+`.messages GROUP BY chat_id`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var c, s int64
			if err := rows.Scan(&c, &s); err != nil {
				rows.Close()
				return nil, err
			}
			out[svc][c] = s
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	// A chat whose newest rows a prune took still had them.
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.keptStored {
		out[m.From][m.ChatID] = max(out[m.From][m.ChatID], m.Seq)
	}
	return out, nil
}

// check runs the checker on the drained (or not) system and fills res.
func (t *run) check(ctx context.Context, res *ScheduleResult) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sent := t.sentCopy()
	res.Sent = len(sent)
	problem := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }

	// 1. Every 201 send is in the receiver's inbox once, with the
	// sender's (chat, seq), and in the sender's own messages table.
	inInbox, err := t.inboxed(qctx)
	if err != nil {
		problem("read inboxes: %v", err)
		return
	}
	stored, err := t.stored(qctx)
	if err != nil {
		problem("read messages: %v", err)
		return
	}
	sentFloor, receivedFloor, err := t.floors(qctx)
	if err != nil {
		problem("read floors: %v", err)
		return
	}
	var lost, wrong []string
	for _, m := range sent {
		got, ok := inInbox[m.ID]
		// A row a prune deleted after the checker last kept the rows (a
		// transaction that began long before it committed) is still
		// accounted for by the floor the delete left: received up to there.
		switch {
		case !ok && receivedFloor[m.From][m.ChatID] >= m.Seq:
		case !ok:
			lost = append(lost, fmt.Sprintf("%s chat %d seq %d", m.From, m.ChatID, m.Seq))
		case got.ChatID != m.ChatID || got.Seq != m.Seq || got.From != m.From:
			wrong = append(wrong, fmt.Sprintf("%s chat %d seq %d is in the inbox as chat %d seq %d", m.From, m.ChatID, m.Seq, got.ChatID, got.Seq))
		}
		if st, ok := stored[m.ID]; !ok && sentFloor[m.From][m.ChatID] >= m.Seq {
		} else if !ok || st.ChatID != m.ChatID || st.Seq != m.Seq {
			wrong = append(wrong, fmt.Sprintf("%s answered 201 for chat %d seq %d but did not store it so", m.From, m.ChatID, m.Seq))
		}
	}
	// An inbox row with no message behind it (a phantom) is as wrong.
	for id, m := range inInbox {
		if st, ok := stored[id]; !ok || st.ChatID != m.ChatID || st.Seq != m.Seq || st.From != m.From {
			wrong = append(wrong, fmt.Sprintf("inbox row %s (chat %d seq %d) matches no message of %s", id, m.ChatID, m.Seq, m.From))
		}
	}
	res.Lost += len(lost)
	if len(lost) > 0 {
		problem("%d send(s) answered 201 are not in the receiver's inbox: %s", len(lost), firstFew(lost))
	}
	if len(wrong) > 0 {
		problem("%d wrong row(s): %s", len(wrong), firstFew(wrong))
	}

	// 2. Each client: no frame twice on one connection; per side, seqs
	// rising on each connection; over all connections exactly 1..N.
	tops, err := t.tops(qctx)
	if err != nil {
		problem("read messages: %v", err)
		return
	}
	pruned, err := t.prunedSeqs(qctx)
	if err != nil {
		problem("read rows: %v", err)
		return
	}
	shown := map[string]bool{}
	ci := 0
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		for _, w := range t.clients[svc] {
			ci++
			v := checkView(w.Frames(), t.chats[w], tops, func(side string, seq int64) bool { return pruned[seqKey{side, t.chats[w], seq}] })
			res.PrunedUnseen += len(v.pruned)
			res.Reconnects += max(0, w.Connects()-1)
			res.DuplicatesShown += len(v.dups)
			res.OrderViolations += len(v.order)
			res.Lost += len(v.missing)
			for _, f := range w.Frames() {
				shown[f.Message.ID] = true
			}
			name := fmt.Sprintf("client %d (%s, chat %d)", ci, svc, t.chats[w])
			if len(v.dups) > 0 {
				problem("%s was shown %d message(s) twice on one connection: %s", name, len(v.dups), firstFew(v.dups))
			}
			if len(v.order) > 0 {
				problem("%s saw seqs out of order on one connection: %s", name, firstFew(v.order))
			}
			if len(v.missing) > 0 {
				problem("%s never saw %s", name, firstFew(v.missing))
			}
			if len(v.extra) > 0 {
				problem("%s saw messages that were never stored: %s", name, firstFew(v.extra))
			}
		}
	}
	res.Shown = len(shown)

	// 3. Edits and deletes: each message's latest version is the same on
	// both sides (body, deleted flag, version), and the sender's is at
	// least the newest one an API answered 200 for (versions only grow),
	// with that version's content when equal.
	diffs, err := t.versionDiffs(qctx)
	if err != nil {
		problem("read versions: %v", err)
	} else if len(diffs) > 0 {
		problem("%d message(s) differ between the sides after edits and deletes: %s", len(diffs), firstFew(diffs))
	}
	t.mu.Lock()
	changed := make(map[string]chat.Message, len(t.changed))
	for id, c := range t.changed {
		changed[id] = c
	}
	t.mu.Unlock()
	res.Changes = len(changed)
	var behind []string
	for id, c := range changed {
		var v int32
		var body string
		var deleted bool
		err := t.e.Admin().QueryRow(qctx, `SELECT version, body, deleted FROM `+pgx.Identifier{c.From}.Sanitize()+`.messages WHERE id = $1`, id).Scan(&v, &body, &deleted)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Pruned by the history retention (a prune fault): gone on
			// both sides, nothing to compare.
		case err != nil:
			behind = append(behind, fmt.Sprintf("%s message %s: %v", c.From, id, err))
		case int64(v) < c.Version:
			behind = append(behind, fmt.Sprintf("%s message %s at version %d, below the %d answered", c.From, id, v, c.Version))
		case int64(v) == c.Version && (body != c.Body || deleted != c.Deleted):
			behind = append(behind, fmt.Sprintf("%s message %s version %d holds other content than answered", c.From, id, v))
		}
	}
	res.OrderViolations += len(behind)
	if len(behind) > 0 {
		problem("%d change(s) answered 200 are not the message's state: %s", len(behind), firstFew(behind))
	}

	// 4. Each stream: entries of a chat added in seq order.
	order := t.tap.Violations()
	res.OrderViolations += len(order)
	if len(order) > 0 {
		problem("stream entries out of order: %s", firstFew(order))
	}

	// 5. No entry acknowledged before its message was in the inbox.
	t.tap.SampleAcks(qctx, t.e, t.wasInbox)
	if early := t.tap.EarlyAcks(); len(early) > 0 {
		problem("%d entr(ies) acknowledged before the inbox commit: %s", len(early), firstFew(early))
	}
	if read, confirmed := t.tap.Counts(); res.Sent > 0 && (read == 0 || confirmed == 0) {
		problem("the stream tap read %d entries and confirmed %d acknowledgements of %d sends: checks 4 and 5 saw nothing", read, confirmed, res.Sent)
	}

	// 6. Dead letters only for the entries the schedule injected.
	for _, svc := range []string{chat.Consumers, chat.Workers} {
		n, err := probe.DeadLetters(qctx, t.e, svc)
		if err != nil {
			problem("read dead letters: %v", err)
			continue
		}
		res.DeadLetters += int(n)
		if want := int64(t.tap.InjectedCount(svc)); n != want {
			problem("%d dead letter(s) on %s, want %d (the malformed entries injected)", n, chat.QueueName(svc), want)
		}
	}
}

// view is what checkView found wrong with one client's frames.
type view struct {
	dups, order, missing, extra []string
	// pruned are seqs never shown that a prune deleted first (excused).
	pruned []string
}

// checkView checks the frames one client received for chat chatID
// against tops (side → chat → highest stored seq): a frame twice on one
// connection (dups), a seq not above the last of its side on its
// connection (order), a seq 1..N of a side never shown (missing), a seq
// above N (extra). A seq never shown for which pruned (nil: none) is true
// was deleted by a prune before the client could show it: it goes into
// pruned, not missing.
func checkView(frames []probe.Shown, chatID int64, tops map[string]map[int64]int64, pruned func(side string, seq int64) bool) view {
	var v view
	type key struct {
		conn int
		side string
	}
	last := map[key]int64{}
	onConn := map[key]map[int64]bool{}
	seen := map[string]map[int64]bool{}
	for _, f := range frames {
		m := f.Message
		k := key{f.Conn, m.From}
		if onConn[k] == nil {
			onConn[k] = map[int64]bool{}
		}
		if seen[m.From] == nil {
			seen[m.From] = map[int64]bool{}
		}
		switch {
		case onConn[k][m.Seq]:
			v.dups = append(v.dups, fmt.Sprintf("%s seq %d (connection %d)", m.From, m.Seq, f.Conn))
		case m.Seq <= last[k]:
			v.order = append(v.order, fmt.Sprintf("%s seq %d after seq %d (connection %d)", m.From, m.Seq, last[k], f.Conn))
		}
		if m.ChatID != chatID {
			v.extra = append(v.extra, fmt.Sprintf("a frame of chat %d", m.ChatID))
		}
		onConn[k][m.Seq] = true
		seen[m.From][m.Seq] = true
		last[k] = max(last[k], m.Seq)
	}
	for _, side := range []string{chat.Consumers, chat.Workers} {
		top := tops[side][chatID]
		for seq := int64(1); seq <= top; seq++ {
			switch {
			case seen[side][seq]:
			case pruned != nil && pruned(side, seq):
				v.pruned = append(v.pruned, fmt.Sprintf("%s seq %d", side, seq))
			default:
				v.missing = append(v.missing, fmt.Sprintf("%s seq %d", side, seq))
			}
		}
		for seq := range seen[side] {
			if seq > top {
				v.extra = append(v.extra, fmt.Sprintf("%s seq %d (stored up to %d)", side, seq, top))
			}
		}
	}
	return v
}

// firstFew joins up to 5 items, noting how many more there are.
func firstFew(items []string) string {
	if len(items) <= 5 {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:5], "; ") + fmt.Sprintf("; … %d more", len(items)-5)
}

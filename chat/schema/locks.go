package schema

// ChatLockSQL returns the SQL expression of the advisory lock key of a chat
// of service, for the integer expression chat (e.g. "71" or "c"):
// hashtextextended('<service>.chat.' || chat, 0), a bigint. A session that
// runs SELECT pg_advisory_xact_lock(<it>) holds back that chat's sends (a
// hash collision between two chats only makes them share a lock).
func ChatLockSQL(service, chat string) string { return lockKeySQL(service+".chat.", chat) }

// InboxLockSQL is ChatLockSQL's counterpart on the receiving side: the
// advisory lock key of chat (an integer SQL expression) in service's inbox,
// hashtextextended('<service>.inbox.' || chat, 0). An inbox transaction
// takes it for each chat of its batch, in chat order.
func InboxLockSQL(service, chat string) string { return lockKeySQL(service+".inbox.", chat) }

// lockKeySQL is hashtextextended('<prefix>' || chat, 0) for the integer SQL
// expression chat.
func lockKeySQL(prefix, chat string) string {
	return "hashtextextended(" + quoteLiteral(prefix) + " || (" + chat + ")::text, 0)"
}

// quoteLiteral quotes s as an SQL string literal (s holds no backslash in
// the uses here; standard_conforming_strings is on by default).
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

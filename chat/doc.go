// Package chat is the vocabulary of the outboxchat application: the names
// of its two services (Consumers, Workers) and of their queues and NOTIFY
// channels, the message and receipt as they travel (Message, Receipt,
// ReceiptFrame) with their decoders and validators, the send path's errors,
// the WebSocket protocol's names and close codes, and the event log lines
// the lab reads (LogEvent). It has no I/O; everything else of the app is
// built on it:
//
//	chat/schema   migrations, bootstrap, pool and pooler checks, Redis ACLs, lock keys
//	chat/auth     JWT and JWKS, tokens, principals, event signing
//	chat/store    the send path: group commit, slow lanes, idempotency, history
//	chat/receive  the inbox handler, receipts, re-drive
//	chat/gateway  the WebSocket hub: rooms, cursors, the Postgres feed
//	chat/httpapi  the HTTP API and WebSocket, the connection guard, OpenAPI, the page
//	chat/status   the operator's snapshot (`outboxchat status`)
//	chat/server   Serve: a process of one service from its Config, role by role
//
// The invariants of the whole (docs/DESIGN.md): a message and its event
// commit together (chat/store); only the relay writes to Redis and it holds
// nothing in memory, and publish is idempotent by message id (package
// outbox, redisq); the inbox gives exactly-once effect and a job is acked
// only after its inbox commit (package inbox, chat/receive); each side's
// messages of a chat carry seq 1, 2, 3 … in commit order (chat/store) and
// every subscriber sees them in that order, each once (chat/gateway).
package chat

// Package httpapi is the HTTP face of one service: the messages API, the
// WebSocket, GET /openapi.json and the chat page (API), behind the
// connection guard (host and origin allow-lists, body size and deadline,
// per-IP and per-user rate limits, the WebSocket cap) and the bearer
// token check of package auth. It depends on small interfaces (Sender,
// Reader, Rooms), not on the store or the gateway.
//
// Bad input gets 400 with a JSON error naming the field (ErrorBody) and
// stores nothing; a database that cannot be reached answers 503 with a
// short generic error, never the driver's text.
package httpapi

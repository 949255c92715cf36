// Package chattest is the chat packages' shared test harness: a Harness on
// the private servers of package internal/testenv (a fresh database with
// both services' schemas, a Redis key prefix, a JWT secret), a token for
// every chat, and HTTP and WebSocket clients of a running service (Send,
// Post, Watch). Tests only.
package chattest

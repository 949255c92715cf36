package main

import (
	"context"
	"fmt"
	"log/slog"
)

// redisLogger takes go-redis's own messages (its pool's failed dials, a
// sentinel's switch of primary), which the library would print to stderr
// as "redis: <date> pool.go:NNN: …" lines between ours: serve logs each
// as a line of its own log (msg "redis client", the text as detail); the
// operator commands, which report what they could not read themselves,
// drop them (a nil log).
type redisLogger struct {
	log   *slog.Logger
	level slog.Level
}

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.log != nil {
		l.log.Log(ctx, l.level, "redis client", "detail", fmt.Sprintf(format, v...))
	}
}

package pgproc

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"
)

func TestZZTiming(t *testing.T) {
	ctx := context.Background()
	t0 := time.Now()
	s, err := Start(ctx, &Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("start", time.Since(t0)); t0 = time.Now()
	s.Kill(); t.Log("kill", time.Since(t0)); t0 = time.Now()
	s.Restart(ctx); t.Log("restart", time.Since(t0)); t0 = time.Now()
	s.Stop(ctx); t.Log("stop", time.Since(t0)); t0 = time.Now()
	s.Close(); t.Log("close", time.Since(t0))
}

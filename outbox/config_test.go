package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/outbox"
)

func TestTableDDL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		table     string
		wantTable string
		wantIndex string
		panics    bool
	}{
		{table: "outbox", wantTable: `CREATE TABLE "outbox" (`, wantIndex: `CREATE INDEX "outbox_unsent" ON "outbox" (id) WHERE sent_at IS NULL;`},
		{table: "consumers.outbox", wantTable: `CREATE TABLE "consumers"."outbox" (`, wantIndex: `CREATE INDEX "consumers_outbox_unsent" ON "consumers"."outbox" (id)`},
		{table: "_a1.b_2", wantTable: `CREATE TABLE "_a1"."b_2" (`, wantIndex: `"_a1_b_2_unsent"`},
		{table: "", panics: true},
		{table: "Outbox", panics: true},
		{table: "a.b.c", panics: true},
		{table: "a.", panics: true},
		{table: ".a", panics: true},
		{table: "1abc", panics: true},
		{table: `a"; DROP TABLE x; --`, panics: true},
		{table: "a-b", panics: true},
		{table: strings.Repeat("a", 64), panics: true},
		{table: strings.Repeat("a", 63), wantTable: `CREATE TABLE "` + strings.Repeat("a", 63) + `" (`},
	}
	for _, tt := range tests {
		t.Run(tt.table, func(t *testing.T) {
			t.Parallel()
			defer func() {
				if r := recover(); (r != nil) != tt.panics {
					t.Fatalf("TableDDL(%q) panic = %v, want panic %v", tt.table, r, tt.panics)
				}
			}()
			ddl := outbox.TableDDL(tt.table)
			for _, want := range []string{tt.wantTable, tt.wantIndex,
				"idempotency_key text        NOT NULL", "attempts        integer     NOT NULL DEFAULT 0"} {
				if !strings.Contains(ddl, want) {
					t.Errorf("TableDDL(%q) = %s\nwant it to contain %q", tt.table, ddl, want)
				}
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := setup(t) // a real pool; none of these cases touches the database
	pub := outbox.PublisherFunc(func(context.Context, []outbox.Message) error { return nil })
	writers := []struct {
		name string
		pool bool
		cfg  *outbox.WriterConfig
		ok   bool
	}{
		{"nil config", true, nil, false},
		{"defaults", true, &outbox.WriterConfig{Table: "ob.outbox"}, true},
		{"bad table", true, &outbox.WriterConfig{Table: "OB.outbox"}, false},
		{"after commit needs pool", false, &outbox.WriterConfig{Table: "ob.outbox"}, false},
		{"in tx without pool", false, &outbox.WriterConfig{Table: "ob.outbox", Mode: outbox.WakeInTx}, true},
		{"none without pool", false, &outbox.WriterConfig{Table: "ob.outbox", Mode: outbox.WakeNone}, true},
		{"unknown mode", true, &outbox.WriterConfig{Table: "ob.outbox", Mode: 7}, false},
		{"long channel", true, &outbox.WriterConfig{Table: "ob.outbox", Channel: strings.Repeat("c", 64)}, false},
		{"negative notify timeout", true, &outbox.WriterConfig{Table: "ob.outbox", NotifyTimeout: -1}, false},
		{"negative notify interval", true, &outbox.WriterConfig{Table: "ob.outbox", NotifyInterval: -1}, false},
	}
	for _, tt := range writers {
		p := pool
		if !tt.pool {
			p = nil
		}
		_, err := outbox.NewWriter(p, tt.cfg)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, outbox.ErrInvalidConfig)) {
			t.Errorf("NewWriter %s: err = %v, want ok %v (or ErrInvalidConfig)", tt.name, err, tt.ok)
		}
	}
	relays := []struct {
		name string
		cfg  *outbox.RelayConfig
		ok   bool
	}{
		{"nil config", nil, false},
		{"defaults", &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub}, true},
		{"no publisher", &outbox.RelayConfig{Table: "ob.outbox"}, false},
		{"bad table", &outbox.RelayConfig{Table: "ob.out.box", Publisher: pub}, false},
		{"negative batch", &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub, BatchSize: -1}, false},
		{"negative poll", &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub, PollInterval: -time.Second}, false},
		{"negative lock timeout", &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub, LockTimeout: -1}, false},
		{"negative linger", &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub, Linger: -time.Millisecond}, false},
		{"sub-ms timeouts", &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub, LockTimeout: time.Microsecond}, true},
	}
	for _, tt := range relays {
		_, err := outbox.NewRelay(pool, tt.cfg)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, outbox.ErrInvalidConfig)) {
			t.Errorf("NewRelay %s: err = %v, want ok %v (or ErrInvalidConfig)", tt.name, err, tt.ok)
		}
	}
	if _, err := outbox.NewRelay(nil, &outbox.RelayConfig{Table: "ob.outbox", Publisher: pub}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("NewRelay(nil pool): err = %v, want ErrInvalidConfig", err)
	}
}

func TestWakeModeString(t *testing.T) {
	t.Parallel()
	for m, want := range map[outbox.WakeMode]string{
		outbox.WakeAfterCommit: "after_commit", outbox.WakeInTx: "in_tx", outbox.WakeNone: "none", 9: "WakeMode(9)",
	} {
		if got := m.String(); got != want {
			t.Errorf("WakeMode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}

func TestParseWakeMode(t *testing.T) {
	t.Parallel()
	for _, m := range []outbox.WakeMode{outbox.WakeAfterCommit, outbox.WakeInTx, outbox.WakeNone} {
		got, err := outbox.ParseWakeMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseWakeMode(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
	}
	for in, want := range map[string]outbox.WakeMode{"after-commit": outbox.WakeAfterCommit, "in-tx": outbox.WakeInTx} {
		if got, err := outbox.ParseWakeMode(in); err != nil || got != want {
			t.Errorf("ParseWakeMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "WakeMode(9)", "aftercommit", "AFTER_COMMIT"} {
		if _, err := outbox.ParseWakeMode(in); err == nil {
			t.Errorf("ParseWakeMode(%q): no error", in)
		}
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	r := (&outbox.RelayConfig{Table: "ob.outbox", BatchSize: 7, LockTimeout: -1}).WithDefaults()
	if r.Channel != "ob_outbox" || r.BatchSize != 7 || r.PollInterval != outbox.DefaultPollInterval ||
		r.PublishTimeout != outbox.DefaultPublishTimeout || r.LockTimeout != -1 ||
		r.StatementTimeout != outbox.DefaultStatementTimeout || r.IdleInTxTimeout != outbox.DefaultIdleInTxTimeout || r.Logger == nil {
		t.Errorf("RelayConfig.WithDefaults() = %+v", r)
	}
	w := (*outbox.WriterConfig)(nil).WithDefaults()
	if w.Channel != "" || w.NotifyTimeout != outbox.DefaultNotifyTimeout || w.Mode != outbox.WakeAfterCommit || w.Logger == nil {
		t.Errorf("nil WriterConfig.WithDefaults() = %+v", w)
	}
	in := &outbox.WriterConfig{Table: "t"}
	if in.WithDefaults(); in.Channel != "" || in.NotifyTimeout != 0 {
		t.Errorf("WithDefaults changed its receiver: %+v", in)
	}
}

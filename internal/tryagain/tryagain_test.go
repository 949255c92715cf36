package tryagain_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/tryagain"
)

// reply is a Redis error reply, as go-redis returns one.
type reply string

func (e reply) Error() string { return string(e) }
func (reply) RedisError()     {}

var _ redis.Error = reply("")

func TestIs(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		nil:                                false,
		reply("TRYAGAIN Multiple keys"):    true,
		reply("ASK 3999 127.0.0.1:7001"):   true,
		reply("MOVED 3999 127.0.0.1:7001"): true,
		reply("ERR unknown command"):       false,
		errors.New("dial tcp: refused"):    false,
	} {
		if got := tryagain.Is(err); got != want {
			t.Errorf("Is(%v) = %v, want %v", err, got, want)
		}
	}
}

// Retry repeats a call refused by a migration until it gets through,
// returns any other result at once, and gives up when the budget or the
// context's deadline would be passed.
func TestRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := 0
	err := tryagain.Retry(ctx, time.Minute, func() error {
		if calls++; calls < 3 {
			return reply("TRYAGAIN")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Retry = %v after %d calls, want nil after 3", err, calls)
	}
	calls = 0
	other := reply("ERR wrong")
	if err := tryagain.Retry(ctx, time.Minute, func() error { calls++; return other }); err != other || calls != 1 {
		t.Fatalf("Retry = %v after %d calls, want %v after 1", err, calls, other)
	}
	calls = 0
	if err := tryagain.Retry(ctx, 0, func() error { calls++; return reply("TRYAGAIN") }); !tryagain.Is(err) || calls != 1 {
		t.Fatalf("no budget: Retry = %v after %d calls, want TRYAGAIN after 1", err, calls)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	calls = 0
	if err := tryagain.Retry(dctx, time.Minute, func() error { calls++; return reply("ASK 1 x:1") }); !tryagain.Is(err) || calls > 2 {
		t.Fatalf("short deadline: Retry = %v after %d calls, want ASK after at most 2", err, calls)
	}
}

// Package lab runs the outboxchat experiments on real processes: private
// Postgres and Redis servers, both services as OS processes of this binary,
// faults injected by signals and restarts, and an invariant checker that
// reads the database and a WebSocket client.
package lab

import (
	"context"
	"fmt"
	"io"
)

// Run runs `outboxchat lab <args>`: up, chaos, latency, bench or demo.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return fmt.Errorf("lab: not built yet")
}

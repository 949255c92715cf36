package lab

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// runUp runs `lab up`: a private environment until ctx ends (Ctrl-C).
func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	variant := fs.String("variant", VariantV2, "v1, v2, v2-poll or v2-intx")
	if err := fs.Parse(args); err != nil {
		return err
	}
	env, err := StartEnv(ctx, EnvOptions{Variant: *variant, Progress: stderr})
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(stdout, "consumers: %s\n", env.ConsumersURL)
	fmt.Fprintf(stdout, "workers: %s\n", env.WorkersURL)
	fmt.Fprintf(stdout, "database: %s\n", env.DatabaseURL)
	fmt.Fprintf(stdout, "redis: %s\n", env.RedisURL)
	// A development token for every chat on both services; the pages take
	// it from the URL fragment, which browsers never send to a server.
	fmt.Fprintf(stdout, "token: %s\n", env.Token)
	fmt.Fprintf(stdout, "consumers page: %s/?chat_id=1#token=%s\n", env.ConsumersURL, env.Token)
	fmt.Fprintf(stdout, "workers page: %s/?chat_id=1#token=%s\n", env.WorkersURL, env.Token)
	fmt.Fprintf(stderr, "lab: logs in %s; Ctrl-C stops everything\n", env.Dir)
	<-ctx.Done()
	fmt.Fprintln(stderr, "lab: stopping")
	return nil
}

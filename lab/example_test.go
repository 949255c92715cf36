package lab_test

import (
	"context"
	"fmt"
	"os"

	"github.com/outboxchat/outboxchat/lab"
)

// Example runs the write-up's experiment with the transactional outbox and
// prints its summary (it needs postgres and redis-server installed).
func Example() {
	f, err := lab.Chaos(context.Background(), lab.ChaosOptions{Variant: lab.VariantV2, Log: os.Stdout})
	if err != nil {
		fmt.Println(err)
		return
	}
	f.WriteSummary(os.Stdout)
}

// ExampleStartEnv starts a private environment, prints the URLs people use
// to look inside, and removes everything.
func ExampleStartEnv() {
	env, err := lab.StartEnv(context.Background(), lab.EnvOptions{Variant: lab.VariantV2})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer env.Close()
	fmt.Println("consumers:", env.ConsumersURL)
	fmt.Println("database:", env.DatabaseURL)
}

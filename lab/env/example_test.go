package env_test

import (
	"context"
	"fmt"

	"github.com/outboxchat/outboxchat/lab/env"
)

// ExampleStart starts a private environment, prints the URLs people use
// to look inside, and removes everything.
func ExampleStart() {
	e, err := env.Start(context.Background(), env.Options{Variant: env.VariantV2})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	fmt.Println("consumers:", e.ConsumersURL)
	fmt.Println("database:", e.DatabaseURL)
}

package lab

import (
	"context"
	"fmt"
	"io"
)

// scenario is a named fault scenario of `lab chaos --scenario`.
type scenario struct {
	name, doc string
	run       func(ctx context.Context, log, progress io.Writer) (*Figures, error)
}

// scenarios are listed by `lab chaos --list` in this order.
var scenarios []scenario

func runScenarioCmd(ctx context.Context, name string, asJSON bool, stdout, stderr io.Writer) error {
	return fmt.Errorf("lab chaos: unknown scenario %q (see --list)", name)
}

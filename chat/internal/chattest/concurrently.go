package chattest

import (
	"sync"
	"testing"
)

// Concurrently runs f(0) … f(n-1), each on a goroutine of its own, waits
// for all of them, then fails t (Fatal, on the test's goroutine) with the
// first error one returned.
func Concurrently(t testing.TB, n int, f func(i int) error) {
	t.Helper()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

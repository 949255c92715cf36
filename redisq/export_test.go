package redisq

import "time"

// SetTryAgainBudget sets the TRYAGAIN retry budget of every call of the
// package for the test binary (see tryAgainBudget). Call it before any
// test runs (TestMain).
func SetTryAgainBudget(d time.Duration) { tryAgainBudget = d }

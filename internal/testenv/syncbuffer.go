package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that a logger (or any writer in another
// goroutine) and a test can share: Write and String are safe for concurrent
// use. The zero value is an empty buffer ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

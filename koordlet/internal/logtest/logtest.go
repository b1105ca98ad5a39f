// Package logtest holds test helpers for the agent's packages that log from
// goroutines of their own (the evictor, the Node writer).
package logtest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is an io.Writer for a slog handler that the logging goroutine and
// the test may use at once (bytes.Buffer alone is not safe for that).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines counts the lines written so far that contain substr.
func (s *Buffer) Lines(substr string) int {
	n := 0
	for l := range strings.SplitSeq(s.String(), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

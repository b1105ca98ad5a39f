package colo

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// lsServer is the latency-sensitive service of the scenario: every request does a
// fixed amount of CPU work (rounds of SHA-256 over a small buffer), so interference
// shows up as latency rather than being hidden by a time-based busy wait.
type lsServer struct {
	rounds int
	srv    *http.Server
}

func newLSServer(rounds int) *lsServer {
	s := &lsServer{rounds: rounds}
	mux := http.NewServeMux()
	mux.HandleFunc("/work", s.work)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s
}

func (s *lsServer) work(w http.ResponseWriter, _ *http.Request) {
	var buf [1024]byte
	sum := sha256.Sum256(buf[:])
	for range s.rounds {
		copy(buf[:], sum[:])
		sum = sha256.Sum256(buf[:])
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(strconv.Itoa(int(sum[0]))))
}

// serve runs until ctx ends.
func (s *lsServer) serve(ctx context.Context, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(shutdownCtx); err != nil {
			return fmt.Errorf("ls server shutdown: %w", err)
		}
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("ls server: %w", err)
	}
}

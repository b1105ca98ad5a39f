package extender

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// unreachableRetry is how often an informer's list or watch is retried while
// the API server cannot be reached (retryUnreachable).
const unreachableRetry = time.Second

// unreachable reports whether err means the API server could not be reached
// or could not answer for now (refused, reset, EOF, a network timeout, 503,
// 500, 504), as opposed to an answer that retrying would not change
// (forbidden, not found, gone, invalid). 429 is left to client-go, which
// retries it itself after the server's Retry-After.
func unreachable(err error) bool {
	var ne net.Error
	switch {
	case err == nil:
		return false
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	return apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err)
}

// retryUnreachable calls f until it returns something other than an
// unreachable error, or ctx ends (its error), every `every`. Informers list
// and watch through it. client-go's reflector backs off exponentially after
// each failed list or watch (800 ms doubling to 30 s, with up to as much
// again of jitter), so after a 30 s API outage it would try again only
// 20–50 s after the API server came back; retried here, the informer resumes
// within `every`. failing is called once when the first call fails (a
// streak of failures is reported once).
func retryUnreachable[T any](ctx context.Context, every time.Duration, f func(context.Context) (T, error),
	failing func(error)) (T, error) {
	for first := true; ; first = false {
		v, err := f(ctx)
		if !unreachable(err) || ctx.Err() != nil {
			return v, err
		}
		if first && failing != nil {
			failing(err)
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

package extender

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestUnreachable(t *testing.T) {
	t.Parallel()
	gr := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", &net.OpError{Op: "dial", Err: &osSyscallErr{syscall.ECONNREFUSED}}, true},
		{"connection reset", fmt.Errorf("list: %w", syscall.ECONNRESET), true},
		{"EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), true},
		{"network timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, true},
		{"503", apierrors.NewServiceUnavailable("starting"), true},
		{"500", apierrors.NewInternalError(errors.New("etcd")), true},
		{"504", apierrors.NewServerTimeout(gr, "list", 1), true},
		{"429 (client-go retries it)", apierrors.NewTooManyRequests("slow down", 1), false},
		{"403", apierrors.NewForbidden(gr, "", errors.New("rbac")), false},
		{"404 (no CRD)", apierrors.NewNotFound(gr, ""), false},
		{"410", apierrors.NewResourceExpired("too old"), false},
		{"other", errors.New("decoding"), false},
	}
	for _, tc := range tests {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("%s: unreachable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

type osSyscallErr struct{ errno syscall.Errno }

func (e *osSyscallErr) Error() string { return e.errno.Error() }
func (e *osSyscallErr) Unwrap() error { return e.errno }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestRetryUnreachable: unreachable errors are retried (reported once), any
// other result returned at once, and a cancelled context ends the retries.
func TestRetryUnreachable(t *testing.T) {
	t.Parallel()
	down := apierrors.NewServiceUnavailable("down")
	tests := []struct {
		name     string
		results  []error // the calls' errors in turn; past the end: success
		cancel   bool
		wantErr  error
		calls    int
		reported int
	}{
		{name: "at once", calls: 1},
		{name: "after an outage", results: []error{down, down, down}, calls: 4, reported: 1},
		{name: "forbidden at once", results: []error{apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("x"))},
			calls: 1, wantErr: errors.New("forbidden")},
		{name: "down, then forbidden", results: []error{down, apierrors.NewForbidden(schema.GroupResource{}, "",
			errors.New("x"))}, calls: 2, reported: 1, wantErr: errors.New("forbidden")},
		{name: "cancelled while down", results: []error{down, down, down, down, down, down, down, down}, cancel: true,
			wantErr: down, reported: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			calls, reported := 0, 0
			_, err := retryUnreachable(ctx, time.Millisecond, func(context.Context) (int, error) {
				calls++
				if tc.cancel && calls == 3 {
					cancel()
				}
				if calls <= len(tc.results) {
					return 0, tc.results[calls-1]
				}
				return 1, nil
			}, func(error) { reported++ })
			if (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if tc.cancel {
				if calls != 3 {
					t.Fatalf("%d calls after the cancel at the third", calls)
				}
			} else if calls != tc.calls {
				t.Fatalf("%d calls, want %d", calls, tc.calls)
			}
			if reported != tc.reported {
				t.Fatalf("reported %d times, want %d", reported, tc.reported)
			}
		})
	}
}

// TestInformerListRetriesOutage: against an API server that answers 503 for
// a while, the informer's list (touchingListWatch) keeps trying every
// unreachableRetry and returns the list as soon as the server answers,
// instead of failing into the reflector's backoff.
func TestInformerListRetriesOutage(t *testing.T) {
	t.Parallel()
	var calls, downFor atomic.Int32
	downFor.Store(1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) <= downFor.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`)
			return
		}
		fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`)
	}))
	t.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL,
		ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	contact := newAPIContact(time.Now)
	lw := touchingListWatch(contact.informer(InformerPods), slog.New(slog.DiscardHandler),
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		}, nil)
	start := time.Now()
	obj, err := lw.ListWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list through a 503: %v", err)
	}
	if l, ok := obj.(*corev1.PodList); !ok || l.ResourceVersion != "7" {
		t.Fatalf("listed %#v", obj)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2 (one 503, one answer)", n)
	}
	if took := time.Since(start); took < unreachableRetry {
		t.Fatalf("answered after %v: retried before %v", took, unreachableRetry)
	}
	if last := contact.informer(InformerPods).LastContact(); last.Before(start) {
		t.Fatalf("the list's contact not recorded (last %v)", last)
	}
}

package podsource

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// evictionRequest is what the fake API server saw.
type evictionRequest struct {
	method, path, contentType string
	eviction                  *policyv1.Eviction
	decodeErr                 error
}

func TestCoreClientEvictV1(t *testing.T) {
	t.Parallel()
	status := func(code int32, reason metav1.StatusReason, details *metav1.StatusDetails) metav1.Status {
		return metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: code, Reason: reason, Details: details, Message: string(reason)}
	}
	tests := []struct {
		name     string
		code     int
		body     metav1.Status
		check    func(error) bool
		checkMsg string
	}{
		{name: "accepted", code: http.StatusCreated,
			body:  metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess},
			check: func(err error) bool { return err == nil }, checkMsg: "nil"},
		{name: "blocked by a PDB", code: http.StatusTooManyRequests,
			body: status(429, metav1.StatusReasonTooManyRequests, &metav1.StatusDetails{
				Causes: []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause, Message: "pdb web needs 2"}}}),
			check: apierrors.IsTooManyRequests, checkMsg: "IsTooManyRequests"},
		{name: "pod gone", code: http.StatusNotFound,
			body:  status(404, metav1.StatusReasonNotFound, &metav1.StatusDetails{Kind: "pods", Name: "train-0"}),
			check: apierrors.IsNotFound, checkMsg: "IsNotFound"},
		{name: "forbidden", code: http.StatusForbidden,
			body:  status(403, metav1.StatusReasonForbidden, &metav1.StatusDetails{Kind: "pods", Name: "train-0"}),
			check: apierrors.IsForbidden, checkMsg: "IsForbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var seen []evictionRequest
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				req := evictionRequest{method: r.Method, path: r.URL.Path, contentType: r.Header.Get("Content-Type")}
				data, err := io.ReadAll(r.Body)
				if err == nil {
					req.eviction, req.decodeErr = decodeEviction(data)
				} else {
					req.decodeErr = err
				}
				mu.Lock()
				seen = append(seen, req)
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				if tt.code == http.StatusTooManyRequests {
					// As the API server answers a PDB refusal: client-go would retry it
					// by itself (a refusal then surfaced as a deadline error).
					w.Header().Set("Retry-After", "1")
				}
				w.WriteHeader(tt.code)
				_ = json.NewEncoder(w).Encode(tt.body)
			}))
			t.Cleanup(srv.Close)
			c, err := NewCoreClient(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			uid := types.UID("3f9e-uid")
			ev := &policyv1.Eviction{
				ObjectMeta:    metav1.ObjectMeta{Namespace: "ml", Name: "train-0"},
				DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
			}
			err = c.EvictV1(context.Background(), ev)
			if !tt.check(err) {
				t.Fatalf("EvictV1() = %v, want %s", err, tt.checkMsg)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 1 {
				t.Fatalf("server saw %d requests, want 1", len(seen))
			}
			got := seen[0]
			if got.method != http.MethodPost || got.path != "/api/v1/namespaces/ml/pods/train-0/eviction" {
				t.Errorf("request %s %s, want POST /api/v1/namespaces/ml/pods/train-0/eviction", got.method, got.path)
			}
			if got.decodeErr != nil {
				t.Fatalf("body (%s) does not decode: %v", got.contentType, got.decodeErr)
			}
			e := got.eviction
			if e.APIVersion != "policy/v1" || e.Kind != "Eviction" {
				t.Errorf("body is %s %s, want policy/v1 Eviction", e.APIVersion, e.Kind)
			}
			if e.Namespace != "ml" || e.Name != "train-0" {
				t.Errorf("body names %s/%s, want ml/train-0", e.Namespace, e.Name)
			}
			if e.DeleteOptions == nil || e.DeleteOptions.Preconditions == nil ||
				e.DeleteOptions.Preconditions.UID == nil || *e.DeleteOptions.Preconditions.UID != uid {
				t.Errorf("body lost the UID precondition: %+v", e.DeleteOptions)
			}
		})
	}
}

// decodeEviction decodes a request body in whatever format the client chose
// (protobuf or JSON) and keeps its apiVersion and kind.
func decodeEviction(data []byte) (*policyv1.Eviction, error) {
	s := runtime.NewScheme()
	if err := policyv1.AddToScheme(s); err != nil {
		return nil, err
	}
	obj, gvk, err := serializer.NewCodecFactory(s).UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	ev, ok := obj.(*policyv1.Eviction)
	if !ok {
		return nil, errors.New("not an Eviction: " + gvk.String())
	}
	ev.APIVersion, ev.Kind = gvk.GroupVersion().String(), gvk.Kind
	return ev, nil
}

func TestCoreClientEvictV1RejectsIncompleteEviction(t *testing.T) {
	t.Parallel()
	var calls int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, err := NewCoreClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []*policyv1.Eviction{
		nil,
		{ObjectMeta: metav1.ObjectMeta{Name: "p"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}},
	} {
		if err := c.EvictV1(context.Background(), ev); !errors.Is(err, ErrInvalidEviction) {
			t.Errorf("EvictV1(%+v) = %v, want ErrInvalidEviction", ev, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 0 {
		t.Errorf("%d requests reached the server", calls)
	}
}

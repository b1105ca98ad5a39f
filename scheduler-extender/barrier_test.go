package extender

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestReached(t *testing.T) {
	t.Parallel()
	tests := []struct {
		seen, want string
		ok         bool
	}{
		{"", "5", false},
		{"4", "5", false},
		{"5", "5", true},
		{"10", "9", true}, // numeric, not lexical
		{"9", "10", false},
		{"abc", "abc", true}, // opaque: equal only
		{"abd", "abc", false},
		{"7", "x", false},
	}
	for _, tc := range tests {
		if got := reached(tc.seen, tc.want); got != tc.ok {
			t.Errorf("reached(%q, %q) = %v, want %v", tc.seen, tc.want, got, tc.ok)
		}
	}
}

// TestPodBarrierWait: wait returns once the informer delivered the barrier's
// pod at the written resourceVersion or later, whenever that came; other pods
// and older versions do not release it.
func TestPodBarrierWait(t *testing.T) {
	t.Parallel()
	own := types.NamespacedName{Namespace: "understory-system", Name: "ext-b"}
	rec := func(ns, name, rv string) *podRecord {
		return &podRecord{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
	}
	tests := []struct {
		name   string
		before []*podRecord // delivered before wait starts
		during []*podRecord // delivered while it waits
		ok     bool
	}{
		{name: "delivered while waiting", during: []*podRecord{rec(own.Namespace, own.Name, "100")}, ok: true},
		{name: "delivered before the wait", before: []*podRecord{rec(own.Namespace, own.Name, "100")}, ok: true},
		{name: "a later version (relist)", during: []*podRecord{rec(own.Namespace, own.Name, "250")}, ok: true},
		{name: "an older version", before: []*podRecord{rec(own.Namespace, own.Name, "99")}},
		{name: "another pod of that version", during: []*podRecord{rec(own.Namespace, "ext-a", "100"),
			rec("other", own.Name, "100")}},
		{name: "older, then the write", during: []*podRecord{rec(own.Namespace, own.Name, "60"),
			rec(own.Namespace, own.Name, "100")}, ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newPodBarrier(own)
			for _, r := range tc.before {
				b.observe(r)
			}
			timeout := 5 * time.Second
			if !tc.ok {
				timeout = 100 * time.Millisecond // how long "not released" is watched
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- b.wait(ctx, "100") }()
			for _, r := range tc.during {
				b.observe(r)
			}
			err := <-errc
			if tc.ok && err != nil {
				t.Fatalf("wait = %v, want released", err)
			}
			if !tc.ok && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("wait = %v, want the deadline", err)
			}
		})
	}
}

// TestPodBarrierCross: cross writes the annotation on its own pod and waits
// for that write's resourceVersion; a refused write is errNoBarrier (the
// caller lists instead), and the nil barrier observes nothing.
func TestPodBarrierCross(t *testing.T) {
	t.Parallel()
	own := types.NamespacedName{Namespace: "understory-system", Name: "ext-b"}
	t.Run("written and delivered", func(t *testing.T) {
		t.Parallel()
		client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: own.Name}})
		b := newPodBarrier(own)
		client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			pa := a.(k8stesting.PatchAction)
			var patch struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(pa.GetPatch(), &patch); err != nil || pa.GetPatchType() != types.MergePatchType {
				t.Errorf("patch %s (%s): %v", pa.GetPatch(), pa.GetPatchType(), err)
			}
			if v := patch.Metadata.Annotations[AnnotationCatchUp]; v != "ext-b 2026-11-28T04:00:00Z" {
				t.Errorf("barrier annotation %q", v)
			}
			out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: own.Name, ResourceVersion: "42"}}
			// The informer delivers the write after the API answered.
			go b.observe(&podRecord{ObjectMeta: out.ObjectMeta})
			return true, out, nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := b.cross(ctx, client, "ext-b", time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		client := fake.NewClientset()
		client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, own.Name, errors.New("policy"))
		})
		err := newPodBarrier(own).cross(context.Background(), client, "ext-b", time.Now())
		if !errors.Is(err, errNoBarrier) || !apierrors.IsForbidden(err) {
			t.Fatalf("cross = %v, want errNoBarrier wrapping Forbidden", err)
		}
	})
	t.Run("nil", func(t *testing.T) {
		t.Parallel()
		var b *podBarrier
		b.observe(&podRecord{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: own.Name}})
		if (*informers)(nil).barrierOrNil() != nil {
			t.Fatal("nil informers have a barrier")
		}
	})
}

package election

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{Namespace: "ns", Name: "lease", Identity: "pod-a",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
	tests := []struct {
		name string
		mut  func(*Config)
		ok   bool
	}{
		{name: "valid", mut: func(*Config) {}, ok: true},
		{name: "no namespace", mut: func(c *Config) { c.Namespace = "" }},
		{name: "no name", mut: func(c *Config) { c.Name = "" }},
		{name: "no identity", mut: func(c *Config) { c.Identity = "" }},
		{name: "no retry period", mut: func(c *Config) { c.RetryPeriod = 0 }},
		{name: "renew deadline within the jitter of the retry period", mut: func(c *Config) { c.RenewDeadline = 2400 * time.Millisecond }},
		{name: "lease not whole seconds", mut: func(c *Config) { c.LeaseDuration = 15500 * time.Millisecond }},
		{name: "lease under a second", mut: func(c *Config) { c.LeaseDuration = 0 }},
		{name: "lease not above the renew deadline", mut: func(c *Config) { c.LeaseDuration = c.RenewDeadline }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := ok
			tc.mut(&c)
			err := c.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrConfig)) {
				t.Errorf("Validate() = %v, want ok %v (errors wrapping ErrConfig)", err, tc.ok)
			}
			_, err = NewElector(fake.NewClientset(), c, leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}})
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrConfig)) {
				t.Errorf("NewElector() = %v, want ok %v (errors wrapping ErrConfig)", err, tc.ok)
			}
		})
	}
}

// TestNewElectorLeadsAndReleases: a lone replica takes the Lease, leads, and
// releases it when its context ends.
func TestNewElectorLeadsAndReleases(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	c := Config{Namespace: "ns", Name: "lease", Identity: "pod-a",
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	led := make(chan struct{})
	le, err := NewElector(client, c, leaderelection.LeaderCallbacks{
		OnStartedLeading: func(context.Context) { close(led) },
		OnStoppedLeading: func() {},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	select {
	case <-led:
	case <-time.After(30 * time.Second):
		t.Fatal("never led")
	}
	cancel()
	<-done
	l, err := client.CoordinationV1().Leases("ns").Get(context.Background(), "lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after the context ended", *h)
	}
}

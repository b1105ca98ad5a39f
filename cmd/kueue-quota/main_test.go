package main

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/understory/understory/kueuequota"
)

// errAny: the case wants some error, of no particular kind.
var errAny = errors.New("any error")

func TestParseFlags(t *testing.T) {
	t.Parallel()
	pod := map[string]string{"POD_NAMESPACE": "ops", "POD_NAME": "kueue-quota-7d9f-abcde"}
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		hostname string
		wantErr  error
		check    func(t *testing.T, o options)
	}{
		{name: "defaults", env: pod, check: func(t *testing.T, o options) {
			if len(o.cfg.Resources) != 4 || o.cfg.Flavor != kueuequota.DefaultFlavor || !o.cfg.EvictOverQuota ||
				o.cfg.Params.EvictTolerance != 0.05 {
				t.Errorf("defaults: %+v", o.cfg)
			}
			want := kueuequota.DefaultLeaderConfig("ops", "kueue-quota-7d9f-abcde")
			if !o.leaderElect || o.leader != want {
				t.Errorf("leader election %v %+v, want on with %+v", o.leaderElect, o.leader, want)
			}
			if o.leader.Name != "understory-kueue-quota" || o.leader.LeaseDuration != 15*time.Second ||
				o.leader.RenewDeadline != 10*time.Second || o.leader.RetryPeriod != 2*time.Second {
				t.Errorf("lease %+v, want understory-kueue-quota, 15s/10s/2s", o.leader)
			}
		}},
		{name: "no downward API: the install's namespace and the host name", hostname: "host-1",
			check: func(t *testing.T, o options) {
				if o.leader.Namespace != defaultLeaseNamespace || o.leader.Identity != "host-1" {
					t.Errorf("lease %s, identity %s", o.leader.Namespace, o.leader.Identity)
				}
			}},
		{name: "lease flags", env: pod, args: []string{"-leader-elect-namespace", "x", "-leader-elect-name", "y",
			"-leader-elect-identity", "z", "-leader-elect-lease-duration", "4s", "-leader-elect-renew-deadline", "3s",
			"-leader-elect-retry-period", "500ms"},
			check: func(t *testing.T, o options) {
				want := kueuequota.LeaderConfig{Namespace: "x", Name: "y", Identity: "z", LeaseDuration: 4 * time.Second,
					RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}
				if o.leader != want {
					t.Errorf("lease %+v, want %+v", o.leader, want)
				}
			}},
		{name: "no identity anywhere", wantErr: kueuequota.ErrLeaderConfig},
		{name: "renew deadline not below the lease", env: pod, args: []string{"-leader-elect-renew-deadline", "20s"},
			wantErr: kueuequota.ErrLeaderConfig},
		{name: "lease of a fraction of a second", env: pod, args: []string{"-leader-elect-lease-duration", "15500ms"},
			wantErr: kueuequota.ErrLeaderConfig},
		{name: "no election needs no identity", args: []string{"-leader-elect=false"}, check: func(t *testing.T, o options) {
			if o.leaderElect {
				t.Error("leader election on")
			}
		}},
		{name: "resources list", env: pod, args: []string{"-resources", " a, b ,", "-interval", "1m"}, check: func(t *testing.T, o options) {
			if len(o.cfg.Resources) != 2 || o.cfg.Resources[1] != "b" {
				t.Errorf("resources %q", o.cfg.Resources)
			}
		}},
		{name: "no resources", env: pod, args: []string{"-resources", ""}, wantErr: kueuequota.ErrConfig},
		{name: "bad rise fraction", env: pod, args: []string{"-rise-fraction", "2"}, wantErr: kueuequota.ErrConfig},
		{name: "evict tolerance", env: pod, args: []string{"-evict-tolerance", "0.1"}, check: func(t *testing.T, o options) {
			if o.cfg.Params.EvictTolerance != 0.1 {
				t.Errorf("evict tolerance %v, want 0.1", o.cfg.Params.EvictTolerance)
			}
		}},
		{name: "bad evict tolerance", env: pod, args: []string{"-evict-tolerance", "1"}, wantErr: kueuequota.ErrConfig},
		{name: "evict after and metrics bounds", env: pod, args: []string{"-evict-after", "0", "-metrics-max-age", "1m", "-metrics-max-skew", "2s"},
			check: func(t *testing.T, o options) {
				if o.cfg.EvictAfter != 0 || o.cfg.MetricsMaxAge != time.Minute || o.cfg.MetricsMaxSkew != 2*time.Second {
					t.Errorf("evict-after %v, metrics max age %v, skew %v", o.cfg.EvictAfter, o.cfg.MetricsMaxAge, o.cfg.MetricsMaxSkew)
				}
			}},
		{name: "negative evict after", env: pod, args: []string{"-evict-after", "-1s"}, wantErr: kueuequota.ErrConfig},
		{name: "stray argument", env: pod, args: []string{"x"}, wantErr: errAny},
		{name: "unknown flag", env: pod, args: []string{"-leader-elect-lease-name", "x"}, wantErr: errAny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			getenv := func(k string) string { return tc.env[k] }
			hostname := func() (string, error) {
				if tc.hostname == "" {
					return "", errors.New("no host name")
				}
				return tc.hostname, nil
			}
			o, err := parseFlags(tc.args, io.Discard, getenv, hostname)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatal(err)
			case tc.wantErr != nil && err == nil:
				t.Fatal("no error")
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

package gpureal

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAgentProfile: the profile is asked for the phase's seconds and saved as served; an
// agent without -pprof (404) is an error naming the status, and no file is left.
func TestAgentProfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int
		body    string
		wantErr string
	}{
		{name: "saved", status: http.StatusOK, body: "pprof-bytes"},
		{name: "agent without -pprof", status: http.StatusNotFound, body: "404 page not found", wantErr: "404"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var asked string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked = r.URL.Path + "?" + r.URL.RawQuery
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			a := &agentProc{addr: strings.TrimPrefix(srv.URL, "http://"), client: srv.Client()}
			path := filepath.Join(t.TempDir(), "agent.pprof")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := a.profile(ctx, 7, path)
			if asked != "/debug/pprof/profile?seconds=7" {
				t.Fatalf("asked %q", asked)
			}
			b, rerr := os.ReadFile(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || rerr == nil {
					t.Fatalf("err %v (file: %v), want %q and no file", err, rerr, tc.wantErr)
				}
				return
			}
			if err != nil || !bytes.Equal(b, []byte(tc.body)) {
				t.Fatalf("profile: %v, file %q", err, b)
			}
		})
	}
}

// TestParseFlagsProfile: the agent serves pprof unless -agent-pprof=false.
func TestParseFlagsProfile(t *testing.T) {
	t.Parallel()
	agent := filepath.Join(t.TempDir(), "koordlet")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-agent", agent, "-fake"}, true},
		{[]string{"-agent", agent, "-fake", "-agent-pprof=false"}, false},
	} {
		o, err := parseFlags(tc.args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.ProfileAgent != tc.want || slices.Contains(o.AgentCmd, "-pprof") != tc.want {
			t.Fatalf("%v: ProfileAgent %v, argv %v", tc.args, o.ProfileAgent, o.AgentCmd)
		}
	}
}

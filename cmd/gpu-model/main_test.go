package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: bad flags are refused before anything runs; a short run without the search
// prints the fit and writes the JSON.
func TestRun(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "gpu-model.json")
	tests := []struct {
		name    string
		args    []string
		wantErr string
		wantOut string
	}{
		{name: "no window", args: []string{"-window", "0s"}, wantErr: "window 0s"},
		{name: "no seeds", args: []string{"-seeds", "0"}, wantErr: "seeds 0"},
		{name: "extra argument", args: []string{"extra"}, wantErr: `unexpected arguments ["extra"]`},
		{name: "unknown flag", args: []string{"-nope"}, wantErr: "flag provided but not defined"},
		{name: "short run", args: []string{"-search=false", "-window", "1s", "-seeds", "1", "-out", out}, wantOut: "model, not a measurement"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout bytes.Buffer
			err := run(context.Background(), tc.args, &stdout, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("run(%q) = %v", tc.args, err)
			}
			if !strings.Contains(stdout.String(), tc.wantOut) {
				t.Errorf("output lacks %q:\n%s", tc.wantOut, stdout.String())
			}
			if _, err := os.Stat(out); err != nil {
				t.Errorf("no JSON: %v", err)
			}
		})
	}
}

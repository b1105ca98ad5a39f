package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestFlags: a bad flag or value is refused before anything runs.
func TestFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-duties", "0.5,1"}, `-duties: "1" is not a fraction in (0, 1)`},
		{[]string{"-duties", "x"}, `-duties: "x"`},
		{[]string{"-duties", " , "}, "-duties: no duty given"},
		{[]string{"-period", "1ms"}, "-period 1ms not in [10ms, 1s]"},
		{[]string{"-window", "150ms"}, "-window 150ms must be a whole number of periods (100ms)"},
		{[]string{"-point", "100ms"}, "-point 100ms must be at least one window (500ms)"},
		{[]string{"-freezers", "v3"}, `-freezers: "v3" is neither v1 nor v2`},
		{[]string{"-freezers", "v1,v1"}, "-freezers: v1 given twice"},
		{[]string{"-freezers", ","}, "-freezers: none given"},
		{[]string{"-cgroup-root", ""}, "-cgroup-root: empty"},
		{[]string{"-parts", "duty,gpu"}, `-parts: "gpu" is not one of duty, reaction, collect, agent_cpu`},
		{[]string{"-parts", ","}, "-parts: no part given"},
		{[]string{"-trials", "0"}, "-trials 0 not in [1, 10000]"},
		{[]string{"-loop-period", "0s"}, "-loop-period 0s not in [1ms, 1s]"},
		{[]string{"-collect-scrapes", "0"}, "-collect-scrapes 0 not in [1, 1000000]"},
		{[]string{"-collect-procs", "-1"}, "-collect-procs -1 not in [0, 64]"},
		{[]string{"-agent-duration", "500ms"}, "-agent-duration 500ms not in [1s, 1h0m0s]"},
		{[]string{"-agent-warmup", "-1s"}, "-agent-warmup -1s not in [0s, 1h0m0s]"},
		{[]string{"-agent-procs", "0"}, "-agent-procs 0 not in [1, 16]"},
		{[]string{"-agent-gpus", "ls,ls"}, "-agent-gpus: 2 roles, want one for each of the mock's 8 GPUs"},
		{[]string{"-agent-gpus", "ls,ls,ls,ls,ls,ls,ls,train"}, `-agent-gpus: "train" is not one of shared`},
		{[]string{"-agent-full-scrape-period", "10ms"}, "-agent-full-scrape-period 10ms not in [-loop-period (50ms), 10s]"},
		{[]string{"agent-node"}, "usage: gpu-bench agent-node -spec FILE"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-nope"}, "flag provided but not defined"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

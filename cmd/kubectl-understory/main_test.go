package main

import (
	"errors"
	"io"
	"testing"

	"github.com/understory/understory/internal/kubectlunderstory"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want options
		err  error
	}{
		{"node", []string{"node", "n1"}, options{command: "node", arg: "n1", output: "table",
			agentNamespace: kubectlunderstory.DefaultAgentNamespace}, nil},
		{"flags after and between", []string{"--context", "c", "why", "p", "-n", "jobs", "-o", "json"},
			options{command: "why", arg: "p", context: "c", namespace: "jobs", output: "json",
				agentNamespace: kubectlunderstory.DefaultAgentNamespace}, nil},
		{"kubeconfig with =", []string{"why", "--kubeconfig=/k", "p"}, options{command: "why", arg: "p", kubeconfig: "/k",
			output: "table", agentNamespace: kubectlunderstory.DefaultAgentNamespace}, nil},
		{"no argument", []string{"node"}, options{}, kubectlunderstory.ErrUsage},
		{"unknown command", []string{"top", "x"}, options{}, kubectlunderstory.ErrUsage},
		{"too many", []string{"why", "a", "b"}, options{}, kubectlunderstory.ErrUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parse(tc.args, io.Discard)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parse(%q) = %+v, %v; want %+v", tc.args, got, err, tc.want)
			}
		})
	}
}

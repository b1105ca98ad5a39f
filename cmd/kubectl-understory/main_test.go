package main

import (
	"errors"
	"io"
	"testing"

	"github.com/understory/understory/cmd/kubectl-understory/kubectlunderstory"
)

// The plugin takes kubectl's own connection flags (cli-runtime) anywhere on the line.
func TestParse(t *testing.T) {
	t.Parallel()
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	tests := []struct {
		name                                          string
		args                                          []string
		command, arg, output, via, agentNS            string
		kubeconfig, context, namespace, server, token string
		as, timeout                                   string
		err                                           error
	}{
		{name: "node", args: []string{"node", "n1"}, command: "node", arg: "n1", output: "table", via: "auto",
			agentNS: kubectlunderstory.DefaultAgentNamespace},
		{name: "flags after and between", args: []string{"--context", "c", "why", "p", "-n", "jobs", "-o", "yaml"},
			command: "why", arg: "p", context: "c", namespace: "jobs", output: "yaml", via: "auto",
			agentNS: kubectlunderstory.DefaultAgentNamespace},
		{name: "kubeconfig with =", args: []string{"why", "--kubeconfig=/k", "p"}, command: "why", arg: "p", kubeconfig: "/k",
			output: "table", via: "auto", agentNS: kubectlunderstory.DefaultAgentNamespace},
		{name: "kubectl's connection flags", args: []string{"node", "n1", "--server=https://api:6443", "--token=t",
			"--as=alice", "--request-timeout=5s", "--namespace=x", "--via=port-forward", "--agent-namespace=u"},
			command: "node", arg: "n1", server: "https://api:6443", token: "t", as: "alice", timeout: "5s", namespace: "x",
			output: "table", via: "port-forward", agentNS: "u"},
		{name: "no argument", args: []string{"node"}, err: kubectlunderstory.ErrUsage},
		{name: "unknown command", args: []string{"top", "x"}, err: kubectlunderstory.ErrUsage},
		{name: "too many", args: []string{"why", "a", "b"}, err: kubectlunderstory.ErrUsage},
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
			if err != nil {
				t.Fatal(err)
			}
			c := got.config
			have := []string{got.command, got.arg, got.output, got.via, got.agentNamespace, str(c.KubeConfig), str(c.Context),
				str(c.Namespace), str(c.APIServer), str(c.BearerToken), str(c.Impersonate), str(c.Timeout)}
			want := []string{tc.command, tc.arg, tc.output, tc.via, tc.agentNS, tc.kubeconfig, tc.context, tc.namespace,
				tc.server, tc.token, tc.as, tc.timeout}
			for i := range want {
				if have[i] != want[i] && !(i == 11 && want[i] == "" && have[i] == "0") {
					t.Errorf("parse(%q): field %d = %q, want %q", tc.args, i, have[i], want[i])
				}
			}
		})
	}
}

func TestBadValues(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"node", "n", "-o", "xml"}, {"node", "n", "--via", "ssh"}} {
		if err := run(t.Context(), args, io.Discard, io.Discard); !errors.Is(err, kubectlunderstory.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

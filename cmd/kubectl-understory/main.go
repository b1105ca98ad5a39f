// Command kubectl-understory is the kubectl plugin `kubectl understory` (package
// cmd/kubectl-understory/kubectlunderstory): put it on PATH and run
//
//	kubectl understory node NAME [-o table|json|yaml]
//	kubectl understory why POD [-n NAMESPACE] [-o table|json|yaml]
//
// with kubectl's own connection flags (k8s.io/cli-runtime: --kubeconfig, --context,
// --namespace, --server, --token, --as, --request-timeout, ...). It only parses the
// command line.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/understory/understory/cmd/kubectl-understory/kubectlunderstory"
)

const usage = `kubectl understory: day-2 answers from Understory

  kubectl understory node NAME [-o table|json|yaml]
      the node agent's batch budget, each term, what it publishes, each batch pod's state
  kubectl understory why POD [-n NAMESPACE] [-o table|json|yaml]
      why a batch or GPU pod is Pending, or slowed

Flags (anywhere after the command):
`

// options are the parsed command line.
type options struct {
	command, arg   string
	output         string
	agentNamespace string
	via            string
	// config is kubectl's connection flags.
	config *genericclioptions.ConfigFlags
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, pflag.ErrHelp):
	case errors.Is(err, kubectlunderstory.ErrUsage):
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	format, err := kubectlunderstory.ParseFormat(o.output)
	if err != nil {
		return err
	}
	via, err := kubectlunderstory.ParseVia(o.via)
	if err != nil {
		return err
	}
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace() // --namespace, else the context's
	if err != nil {
		return fmt.Errorf("reading the kubeconfig's namespace: %w", err)
	}
	c, err := kubectlunderstory.New(cfg, kubectlunderstory.Options{AgentNamespace: o.agentNamespace, Via: via})
	if err != nil {
		return err
	}
	if o.command == "node" {
		return c.Node(ctx, o.arg, stdout, format)
	}
	return c.Why(ctx, ns, o.arg, stdout, format)
}

// parse reads COMMAND ARG with the flags before, between or after them.
func parse(args []string, stderr io.Writer) (options, error) {
	o := options{config: genericclioptions.NewConfigFlags(true)}
	fs := pflag.NewFlagSet("kubectl understory", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	o.config.AddFlags(fs)
	fs.StringVarP(&o.output, "output", "o", "table", "output: table, json or yaml")
	fs.StringVar(&o.agentNamespace, "agent-namespace", kubectlunderstory.DefaultAgentNamespace,
		"the namespace the node agent runs in")
	fs.StringVar(&o.via, "via", string(kubectlunderstory.ViaAuto),
		"how to reach the node agent: auto (the API server's pod proxy, else port-forward), proxy or port-forward")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	pos := fs.Args()
	if len(pos) != 2 || pos[0] != "node" && pos[0] != "why" {
		fs.Usage()
		return o, fmt.Errorf("%w: want `node NAME` or `why POD`, got %q", kubectlunderstory.ErrUsage, pos)
	}
	o.command, o.arg = pos[0], pos[1]
	return o, nil
}

// Command kubectl-understory is the kubectl plugin `kubectl understory` (package
// internal/kubectlunderstory): put it on PATH and run
//
//	kubectl understory node NAME [-o json]
//	kubectl understory why POD [-n NAMESPACE] [-o json]
//
// with the user's kubeconfig (KUBECONFIG, --kubeconfig, --context). It only parses the
// command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/understory/understory/internal/kubectlunderstory"
)

const usage = `kubectl understory: day-2 answers from Understory

  kubectl understory node NAME [-o table|json]
      the node agent's batch budget, each term, what it publishes, each batch pod's state
  kubectl understory why POD [-n NAMESPACE] [-o table|json]
      why a batch or GPU pod is Pending, or slowed

Flags (anywhere after the command):
`

// options are the parsed command line.
type options struct {
	command, arg   string
	kubeconfig     string
	context        string
	namespace      string
	output         string
	agentNamespace string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
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
	rules := clientcmd.NewDefaultClientConfigLoadingRules() // KUBECONFIG, else ~/.kube/config
	rules.ExplicitPath = o.kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: o.context})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns := o.namespace
	if ns == "" {
		if ns, _, err = loader.Namespace(); err != nil {
			return fmt.Errorf("reading the kubeconfig's namespace: %w", err)
		}
	}
	c, err := kubectlunderstory.New(cfg, kubectlunderstory.Options{AgentNamespace: o.agentNamespace})
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
	var o options
	fs := flag.NewFlagSet("kubectl understory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "the kubeconfig context to use")
	fs.StringVar(&o.namespace, "n", "", "the pod's namespace (why; default: the context's)")
	fs.StringVar(&o.namespace, "namespace", "", "the pod's namespace (why; default: the context's)")
	fs.StringVar(&o.output, "o", "table", "output: table or json")
	fs.StringVar(&o.output, "output", "table", "output: table or json")
	fs.StringVar(&o.agentNamespace, "agent-namespace", kubectlunderstory.DefaultAgentNamespace,
		"the namespace the node agent runs in")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return o, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 2 || pos[0] != "node" && pos[0] != "why" {
		fs.Usage()
		return o, fmt.Errorf("%w: want `node NAME` or `why POD`, got %q", kubectlunderstory.ErrUsage, pos)
	}
	o.command, o.arg = pos[0], pos[1]
	return o, nil
}

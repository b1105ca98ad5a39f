package schedbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

var errBadArgs = errors.New("bad extender arguments")

// maxBody bounds an extender request: ExtenderArgs with a full NodeList of
// 5 000 nodes (nodeCacheCapable false) is a few MiB.
const maxBody = 64 << 20

// NoopExtender is a kube-scheduler HTTP extender that decodes every request
// and changes nothing: /filter keeps every node, /prioritize scores every
// node 0. It measures the cost of the extender round trip itself.
type NoopExtender struct {
	filter, prioritize atomic.Int64
}

var _ http.Handler = (*NoopExtender)(nil)

// Calls returns how many filter and prioritize requests were answered.
func (e *NoopExtender) Calls() (filter, prioritize int64) {
	return e.filter.Load(), e.prioritize.Load()
}

func (e *NoopExtender) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	var handle func(*extenderv1.ExtenderArgs) any
	switch r.URL.Path {
	case "/filter":
		handle = e.handleFilter
	case "/prioritize":
		handle = e.handlePrioritize
	default:
		http.NotFound(w, r)
		return
	}
	args, err := decodeArgs(w, r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body, err := json.Marshal(handle(args))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func (e *NoopExtender) handleFilter(args *extenderv1.ExtenderArgs) any {
	e.filter.Add(1)
	return &extenderv1.ExtenderFilterResult{
		Nodes:       args.Nodes,
		NodeNames:   args.NodeNames,
		FailedNodes: extenderv1.FailedNodesMap{},
	}
}

func (e *NoopExtender) handlePrioritize(args *extenderv1.ExtenderArgs) any {
	e.prioritize.Add(1)
	names := nodeNames(args)
	out := make(extenderv1.HostPriorityList, len(names))
	for i, n := range names {
		out[i] = extenderv1.HostPriority{Host: n}
	}
	return &out
}

// decodeArgs reads and validates an ExtenderArgs body.
func decodeArgs(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderArgs, error) {
	var args extenderv1.ExtenderArgs
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&args); err != nil {
		return nil, fmt.Errorf("decoding ExtenderArgs: %w", err)
	}
	if err := validateArgs(&args); err != nil {
		return nil, err
	}
	return &args, nil
}

func validateArgs(args *extenderv1.ExtenderArgs) error {
	if args.Pod == nil {
		return fmt.Errorf("ExtenderArgs without pod: %w", errBadArgs)
	}
	if args.NodeNames == nil && args.Nodes == nil {
		return fmt.Errorf("ExtenderArgs without nodes or nodeNames: %w", errBadArgs)
	}
	return nil
}

func nodeNames(args *extenderv1.ExtenderArgs) []string {
	if args.NodeNames != nil {
		return *args.NodeNames
	}
	names := make([]string, len(args.Nodes.Items))
	for i := range args.Nodes.Items {
		names[i] = args.Nodes.Items[i].Name
	}
	return names
}

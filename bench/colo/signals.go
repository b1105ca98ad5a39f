package colo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// The agent's signal paths (koordlet config signals.mode): how it learns that LS wants
// CPU. auto tries eBPF, then PSI, then sampling; the benchmark asks for each path by
// name and reads back which one the agent actually ran.
const (
	pathEBPF     = "ebpf"
	pathPSI      = "psi"
	pathSampling = "sampling"
	pathAuto     = "auto"
	// pathDefault leaves signals.mode out of the agent's configuration: the agent's own
	// default, and the only path an agent from before the signals section accepts.
	pathDefault = "default"
)

// knownPaths are the values -signal-paths takes.
func knownPaths() []string { return []string{pathEBPF, pathPSI, pathSampling, pathAuto, pathDefault} }

// modeFor is the signals.mode the agent is configured with for a path ("" for none).
func modeFor(path string) string {
	if path == pathDefault {
		return ""
	}
	return path
}

// errSignalsRejected: the agent's configuration refused signals.mode (an agent built
// before the signals section, or a mode it does not know).
var errSignalsRejected = errors.New("the agent's configuration rejects this signals.mode")

// Metrics the benchmark reads from the agent.
const (
	signalSourceMetric = "understory_signal_source"
	unavailableMetric  = "understory_signal_source_unavailable"
	cutReactionMetric  = "understory_batch_cut_reaction_seconds"
	cutsMetric         = "understory_batch_cuts_total"
	harmMetric         = "understory_ls_harm_signals_total"
	actionsMetric      = "understory_batch_actions_total" // action="cut": an agent before cutsMetric
	signalLabel        = "signal"
	sourceLabel        = "source"
	reasonLabel        = "reason"
)

// selectPaths parses -signal-paths.
func selectPaths(list string) ([]string, error) {
	var out []string
	for _, p := range splitList(list) {
		if !slices.Contains(knownPaths(), p) {
			return nil, fmt.Errorf("-signal-paths: unknown path %q (known: %s)", p, strings.Join(knownPaths(), ", "))
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("-signal-paths: %q named twice", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// withSignalsMode sets signals.mode in an agent configuration (YAML), keeping every
// other field and any other key of a signals section. It edits the document rather
// than config.Config so that this code builds against an agent without the section.
func withSignalsMode(cfg []byte, mode string) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(cfg, &doc); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	sig, _ := doc["signals"].(map[string]any)
	if sig == nil {
		if v, ok := doc["signals"]; ok && v != nil {
			return nil, fmt.Errorf("agent config: signals is a %T, not a section", v)
		}
		sig = map[string]any{}
	}
	sig["mode"] = mode
	doc["signals"] = sig
	return yaml.Marshal(doc)
}

// histSummary is a histogram of the agent's own, by quantiles of its buckets: each
// quantile is the upper bound of the bucket it falls in (+Inf past the last bucket).
type histSummary struct {
	Count float64 `json:"count"`
	P50Ms float64 `json:"p50_ms_bucket_bound"`
	P99Ms float64 `json:"p99_ms_bucket_bound"`
}

// agentSignals is what the agent's /metrics says about its signal paths.
type agentSignals struct {
	// Source is the active source: the label of understory_signal_source with the
	// largest positive value; empty when the gauge is absent or all zero.
	Source string `json:"active_source"`
	// Sources is the gauge as read, by source label.
	Sources map[string]float64 `json:"signal_source_gauge,omitempty"`
	// Unavailable is, per better source the agent could not use, why
	// (understory_signal_source_unavailable).
	Unavailable map[string]string `json:"unavailable,omitempty"`
	// CutsBySignal counts the batch CPU cuts by the signal that caused them
	// (runqueue_delay, psi_cpu, psi_memory, utilisation: understory_batch_cuts_total;
	// an agent without it: its action="cut" count, as "unlabelled").
	CutsBySignal map[string]float64 `json:"cuts_by_signal,omitempty"`
	// HarmBySignal counts the LS harm each signal saw, whether it cut or not.
	HarmBySignal map[string]float64 `json:"harm_by_signal,omitempty"`
	// CutReaction is understory_batch_cut_reaction_seconds by signal label: the
	// agent's own measure of its reaction, beside the benchmark's.
	CutReaction map[string]histSummary `json:"agent_cut_reaction,omitempty"`
}

// unlabelled is the key for series without a signal label (an agent before the label).
const unlabelled = "unlabelled"

// parseAgentSignals reads the signal metrics from the agent's text exposition.
// Families that are absent leave their fields empty; malformed text is an error.
func parseAgentSignals(r io.Reader) (agentSignals, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return agentSignals{}, fmt.Errorf("parsing the agent's metrics: %w", err)
	}
	var out agentSignals
	if f, ok := fams[signalSourceMetric]; ok {
		best := 0.0
		out.Sources = map[string]float64{}
		for _, m := range f.GetMetric() {
			src, v := label(m, sourceLabel), m.GetGauge().GetValue()
			if !finite(v) {
				continue // JSON holds no NaN; an agent never sets one
			}
			out.Sources[src] = v
			// Ties go to the first name in order, so the result does not depend on
			// the exposition's order.
			if v > best || (v == best && v > 0 && src < out.Source) {
				best, out.Source = v, src
			}
		}
	}
	if f, ok := fams[unavailableMetric]; ok {
		for _, m := range f.GetMetric() {
			if m.GetGauge().GetValue() > 0 {
				if out.Unavailable == nil {
					out.Unavailable = map[string]string{}
				}
				out.Unavailable[label(m, sourceLabel)] = label(m, reasonLabel)
			}
		}
	}
	counts := func(name string, keep func(m string) bool) map[string]float64 {
		f, ok := fams[name]
		if !ok {
			return nil
		}
		out := map[string]float64{}
		for _, m := range f.GetMetric() {
			if v := m.GetCounter().GetValue(); keep(label(m, "action")) && finite(v) {
				out[signalOf(m)] += v
			}
		}
		return out
	}
	all := func(string) bool { return true }
	out.CutsBySignal = counts(cutsMetric, all)
	if out.CutsBySignal == nil {
		out.CutsBySignal = counts(actionsMetric, func(action string) bool { return action == "cut" })
	}
	out.HarmBySignal = counts(harmMetric, all)
	if f, ok := fams[cutReactionMetric]; ok {
		// Merge series per signal label (the agent may add labels besides signal).
		type acc struct {
			count   float64
			buckets map[float64]float64
		}
		bySig := map[string]*acc{}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			a := bySig[signalOf(m)]
			if a == nil {
				a = &acc{buckets: map[float64]float64{}}
				bySig[signalOf(m)] = a
			}
			a.count += float64(h.GetSampleCount())
			for _, b := range h.GetBucket() {
				if ub := b.GetUpperBound(); !math.IsNaN(ub) && !math.IsInf(ub, -1) {
					a.buckets[ub] += float64(b.GetCumulativeCount())
				}
			}
		}
		out.CutReaction = map[string]histSummary{}
		for sig, a := range bySig {
			if a.count == 0 {
				continue // the agent starts every signal's series at zero
			}
			bounds := make([]float64, 0, len(a.buckets))
			for ub := range a.buckets {
				bounds = append(bounds, ub)
			}
			sort.Float64s(bounds)
			cum := make([]float64, len(bounds))
			for i, ub := range bounds {
				cum[i] = a.buckets[ub]
			}
			out.CutReaction[sig] = histSummary{Count: a.count,
				P50Ms: boundMs(bucketQuantile(bounds, cum, a.count, 0.5)),
				P99Ms: boundMs(bucketQuantile(bounds, cum, a.count, 0.99))}
		}
	}
	return out, nil
}

// bucketQuantile is the upper bound (seconds) of the bucket the q-quantile of count
// observations falls in (cumulative counts per ascending bound); +Inf when it falls
// past the last finite bound, 0 for no observations.
func bucketQuantile(bounds, cum []float64, count, q float64) float64 {
	if count <= 0 {
		return 0
	}
	rank := q * count
	for i, ub := range bounds {
		if cum[i] >= rank {
			return ub
		}
	}
	return math.Inf(1)
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// boundMs converts a bucket bound to milliseconds; JSON holds no +Inf, so a quantile
// past every bucket is -1.
func boundMs(ub float64) float64 {
	if math.IsInf(ub, 1) {
		return -1
	}
	return 1000 * ub
}

// labelPair and labelled are the parts of client_model's types used here, so that this
// package needs no import of its own of a module that go.mod lists as indirect.
type labelPair interface {
	GetName() string
	GetValue() string
}

type labelled[L labelPair] interface{ GetLabel() []L }

func label[L labelPair, M labelled[L]](m M, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func signalOf[L labelPair, M labelled[L]](m M) string {
	if s := label(m, signalLabel); s != "" {
		return s
	}
	return unlabelled
}

// statusSignalSource reads the active source from the agent's /status, for an agent
// that reports it there but not (yet) as a gauge: signals.active, signals.source or
// signals.activeSource, whichever is a non-empty string.
func statusSignalSource(body []byte) (string, error) {
	var st map[string]json.RawMessage
	if err := json.Unmarshal(body, &st); err != nil {
		return "", fmt.Errorf("parsing the agent's /status: %w", err)
	}
	raw, ok := st["signals"]
	if !ok {
		return "", nil
	}
	var sig map[string]any
	if err := json.Unmarshal(raw, &sig); err != nil {
		return "", nil // not a section: nothing to read
	}
	for _, k := range []string{"active", "source", "activeSource"} {
		if v, ok := sig[k].(string); ok && v != "" {
			return v, nil
		}
	}
	return "", nil
}

// readAgentSignals fetches the agent's /metrics (and, when the gauge says nothing,
// its /status) and returns what they say about the signal paths.
func readAgentSignals(a *agentProc) (agentSignals, error) {
	resp, err := http.Get("http://" + a.addr + "/metrics")
	if err != nil {
		return agentSignals{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return agentSignals{}, fmt.Errorf("agent /metrics: status %d", resp.StatusCode)
	}
	sig, err := parseAgentSignals(resp.Body)
	if err != nil || sig.Source != "" {
		return sig, err
	}
	sresp, err := http.Get("http://" + a.addr + "/status")
	if err != nil {
		return sig, err
	}
	defer sresp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(sresp.Body, 16<<20))
	if err != nil {
		return sig, err
	}
	sig.Source, err = statusSignalSource(body)
	return sig, err
}

// sourceVerdict compares the requested path with the source the agent ran. auto and
// default match whatever source is active; an unknown source (an agent without the gauge)
// matches nothing, so that no figure is filed under a path that was not shown to run.
func sourceVerdict(requested, active string) (bool, string) {
	switch {
	case requested == pathDefault:
		return true, "" // nothing was asked for, so nothing can be filed wrongly
	case active == "":
		return false, fmt.Sprintf("requested %s; the agent did not report its active source", requested)
	case requested == pathAuto || requested == active:
		return true, ""
	}
	return false, fmt.Sprintf("requested %s, but the agent ran %s", requested, active)
}

package config

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/metrics"
)

// ReasonRejected is the reason of the Warning event on the Node for a changed
// configuration file the agent refused.
const ReasonRejected = "ConfigRejected"

// DefaultReloadInterval is how often the Reloader reads the configuration file. Kubelet
// takes up to a minute or so to update a mounted ConfigMap; a few seconds more are
// nothing, and reading a small file costs nothing.
const DefaultReloadInterval = 5 * time.Second

// Results of a reload (ReloadResult.Result), as the result label of
// understory_koordlet_config_reloads_total.
const (
	ReloadApplied  = metrics.ReloadApplied
	ReloadRejected = metrics.ReloadRejected
)

// LiveFields returns the YAML paths of the fields a running agent takes from a reloaded
// file; every other field needs a restart. CopyLive is the one place that copies them
// (TestLiveFieldsAreCopied keeps the two alike).
func LiveFields() []string {
	return []string{
		"policy.threshold", "policy.minBatchCPU", "policy.maxBatchCPU", "policy.restoreStepPercent",
		"signals.cutPercent", "signals.restoreHold", "signals.restorePercentPerSecond",
		"minPodCPU", "shutdownBudgetCPU",
	}
}

// CopyLive copies the fields of LiveFields from src into dst.
func CopyLive(dst *Config, src Config) {
	dst.Policy = src.Policy
	dst.Signals.GuardConfig = src.Signals.GuardConfig
	dst.MinPodCPU = src.MinPodCPU
	dst.ShutdownBudgetCPU = nil
	if src.ShutdownBudgetCPU != nil {
		v := *src.ShutdownBudgetCPU
		dst.ShutdownBudgetCPU = &v
	}
}

// Status is the configuration part of /status: the file and configuration in
// force, and what the last reload did.
type Status struct {
	// Path is the configuration file (empty: the defaults, nothing to reload).
	Path string `json:"path,omitempty"`
	// Hash is the sha256 of the file in force (its bytes, hex), the hash label of
	// understory_koordlet_config_info.
	Hash string `json:"hash,omitempty"`
	// NeedsRestart are the fields whose value in the file in force differs from the
	// value the agent runs with: they take effect when it restarts.
	NeedsRestart []string `json:"needsRestart,omitempty"`
	// LastReload is the last change of the file and what came of it; nil while the
	// file has not changed since the start.
	LastReload *ReloadResult `json:"lastReload,omitempty"`
	// InForce is the configuration the agent runs with (the file's, command-line flags
	// applied, the fields that need a restart as they were at the start).
	InForce Config `json:"inForce"`
}

// ReloadResult is one change of the configuration file.
type ReloadResult struct {
	Time time.Time `json:"time"`
	// Result is applied or rejected.
	Result string `json:"result"`
	// Hash is the sha256 of the file read.
	Hash string `json:"hash,omitempty"`
	// Error is why it was rejected (the configuration in force stays).
	Error string `json:"error,omitempty"`
	// Changed are the live fields it changed (applied).
	Changed []string `json:"changed,omitempty"`
}

// Applier is the agent as the Reloader sees it: it takes a configuration in force
// and the status that goes with it.
type Applier interface {
	ApplyConfig(cfg Config, st Status)
}

// Warner records a Warning event on the agent's Node (nodestatus.NodeEvents) or only logs it.
type Warner interface {
	Warn(reason, message string)
}

// ReloaderOptions configure a Reloader.
type ReloaderOptions struct {
	// Path is the configuration file; empty: the agent runs on the defaults and the
	// Reloader only publishes them.
	Path string
	// Interval is how often the file is read (DefaultReloadInterval when 0).
	Interval time.Duration
	// Override applies what outranks the file (command-line flags) to a configuration
	// read from it; nil: nothing does.
	Override func(Config) Config
	// Events records ConfigRejected on the Node; nil: the log only.
	Events Warner
	// Registry takes the reload metrics (metrics.ConfigReload); nil: a private one.
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// Now is the clock of ReloadResult.Time (time.Now when nil).
	Now func() time.Time
}

// Reloader watches the agent's configuration file by its content: every Interval it
// reads the file, and when its sha256 differs from the last one read it parses and
// validates it. A valid change is handed to the agent, which applies its live fields
// (LiveFields) at the start of its next period; fields that need a restart keep their
// value and are reported. An invalid one is refused: the configuration in force stays,
// a Warning event ConfigRejected goes to the Node, and the metrics say so.
//
// Reading the file's content, not watching it, is what makes a mounted ConfigMap work:
// kubelet updates one by swapping a symlink (..data) to a new directory, which an
// inotify watch on the file never sees. A change is acted on only when two reads an
// Interval apart agree, so a file edited in place (not swapped) is never taken while
// half-written: an empty file is a valid configuration (every default).
type Reloader struct {
	path     string
	interval time.Duration
	override func(Config) Config
	agent    Applier
	events   Warner
	metrics  *metrics.ConfigReload
	log      *slog.Logger
	now      func() time.Time

	// Owned by Run's goroutine (or the caller of poll).
	inForce Config
	status  Status
	// seen is the hash of the last file acted on (or why it could not be read): a
	// file that did not change since is not parsed again, applied or not. candidate is
	// a different one read once: it is acted on when the next read agrees.
	seen, candidate string
}

// NewReloader returns a Reloader for an agent that started with inForce, read from data
// (the file's bytes at the start; nil without a file).
func NewReloader(inForce Config, data []byte, agent Applier, o ReloaderOptions) (*Reloader, error) {
	if agent == nil {
		return nil, errors.New("config: a reloader needs the agent")
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := metrics.NewConfigReload(reg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	r := &Reloader{path: o.Path, interval: o.Interval, override: o.Override, agent: agent, events: o.Events,
		metrics: m, log: o.Logger, now: o.Now, inForce: inForce}
	if r.interval <= 0 {
		r.interval = DefaultReloadInterval
	}
	if r.override == nil {
		r.override = func(c Config) Config { return c }
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.status = Status{Path: o.Path, InForce: inForce}
	if o.Path != "" {
		r.status.Hash = Hash(data)
		r.seen = r.status.Hash
		m.SetInForce(r.status.Hash)
	}
	return r, nil
}

// Hash is the sha256 of a configuration file's bytes, hex.
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Run publishes the configuration in force, then reads the file every Interval until
// ctx ends. It returns nil when ctx ends.
func (r *Reloader) Run(ctx context.Context) error {
	r.agent.ApplyConfig(r.inForce, r.status)
	if r.path == "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.poll()
		}
	}
}

// poll reads the file once. A file that changed and read the same at the previous
// poll is applied or refused; poll returns the result, nil when nothing was decided.
func (r *Reloader) poll() *ReloadResult {
	data, err := os.ReadFile(r.path)
	hash := ""
	if err != nil {
		// A file that cannot be read is a change too (once per error): the
		// configuration in force stays.
		hash = "unreadable: " + err.Error()
		err = fmt.Errorf("reading %s: %w", r.path, err)
	} else {
		hash = Hash(data)
	}
	if hash == r.seen {
		r.candidate = ""
		return nil
	}
	if hash != r.candidate {
		// Seen once: wait for the next read to agree (a file written in place, not
		// swapped, may be read half-written).
		r.candidate = hash
		return nil
	}
	r.seen, r.candidate = hash, ""
	res := &ReloadResult{Time: r.now(), Result: ReloadApplied}
	if err == nil {
		res.Hash = hash
	}
	var next Config
	if err == nil {
		next, err = r.next(data)
	}
	if err != nil {
		res.Result, res.Error = ReloadRejected, err.Error()
		r.reject(res)
		return res
	}
	res.Changed = changedFields(r.inForce, next)
	r.inForce = next
	r.status.Hash = hash
	r.status.NeedsRestart = changedFields(next, r.fileConfig(data))
	r.status.InForce = next
	r.status.LastReload = res
	r.metrics.Reloads.WithLabelValues(ReloadApplied).Inc()
	r.metrics.LastSuccess.Set(1)
	r.metrics.SetInForce(hash)
	r.metrics.RestartPending.Set(float64(len(r.status.NeedsRestart)))
	r.log.Info("configuration reloaded", "path", r.path, "hash", short(hash), "changed", res.Changed)
	if len(r.status.NeedsRestart) > 0 {
		r.log.Warn("configuration fields changed that take effect only when the agent restarts",
			"fields", r.status.NeedsRestart)
	}
	r.agent.ApplyConfig(next, r.status)
	return res
}

// next parses data and returns the configuration it puts in force: the file's live
// fields over the configuration in force.
func (r *Reloader) next(data []byte) (Config, error) {
	file, err := Load(data)
	if err != nil {
		return Config{}, err
	}
	file = r.override(file)
	if err := file.Validate(); err != nil {
		return Config{}, err
	}
	next := r.inForce
	CopyLive(&next, file)
	// Live fields are checked against fields that stay (minPodCPU against cfsPeriod).
	if err := next.Validate(); err != nil {
		return Config{}, fmt.Errorf("with the fields that need a restart as they are: %w", err)
	}
	return next, nil
}

// fileConfig is what data asks for, flags applied (data parsed and valid).
func (r *Reloader) fileConfig(data []byte) Config {
	file, err := Load(data)
	if err != nil {
		return r.inForce
	}
	return r.override(file)
}

// reject keeps the configuration in force and says why everywhere.
func (r *Reloader) reject(res *ReloadResult) {
	r.status.LastReload = res
	r.metrics.Reloads.WithLabelValues(ReloadRejected).Inc()
	r.metrics.LastSuccess.Set(0)
	msg := fmt.Sprintf("configuration %s refused, keeping %s: %s", orUnreadable(res.Hash), short(r.status.Hash), res.Error)
	r.log.Error("configuration refused; the configuration in force stays", "path", r.path,
		"hash", short(res.Hash), "inForce", short(r.status.Hash), "err", res.Error)
	if r.events != nil {
		r.events.Warn(ReasonRejected, msg)
	}
	r.agent.ApplyConfig(r.inForce, r.status)
}

// short is a hash's first 12 digits, for messages.
func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

func orUnreadable(hash string) string {
	if hash == "" {
		return "(unreadable)"
	}
	return short(hash)
}

// changedFields returns the YAML paths (a.b.c) of the leaves where a and b differ,
// sorted.
func changedFields(a, b Config) []string {
	var out []string
	diffJSON("", toJSONValue(a), toJSONValue(b), &out)
	sort.Strings(out)
	return out
}

// toJSONValue is cfg as encoding/json sees it (maps, slices, numbers, strings).
func toJSONValue(cfg Config) any {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil // a validated Config always encodes; nil differs from everything
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil
	}
	return v
}

func diffJSON(path string, a, b any, out *[]string) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if !reflect.DeepEqual(a, b) {
			*out = append(*out, path)
		}
		return
	}
	keys := map[string]bool{}
	for k := range am {
		keys[k] = true
	}
	for k := range bm {
		keys[k] = true
	}
	for k := range keys {
		p := k
		if path != "" {
			p = path + "." + k
		}
		diffJSON(p, am[k], bm[k], out)
	}
}

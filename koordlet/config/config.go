package config

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	yamlv2 "go.yaml.in/yaml/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/qos"
)

// ErrInvalid is wrapped by every configuration error; the message names the field.
var ErrInvalid = errors.New("invalid config")

// NRI controls the agent's NRI plugin, which places the containers of batch pods
// below the tier as the runtime creates them. Batch pods the plugin did not place (NRI
// off, or pods started before the agent) are held in place: in kubelet's pod cgroups,
// with SCHED_IDLE, the minimum weight and their own quotas. Both kinds share one budget.
type NRI struct {
	Enabled bool   `json:"enabled"`
	Socket  string `json:"socket,omitempty"`
	// TrustedVisibilityNamespaces are the namespaces whose pods keep an
	// NVIDIA_VISIBLE_DEVICES their own spec sets (the node's GPU agents and exporters
	// ask for "all" that way); every other container is pinned to its devices or "void".
	// Default: the agent's own namespace and kube-system.
	TrustedVisibilityNamespaces []string `json:"trustedVisibilityNamespaces"`
}

// Config is the agent's configuration file. Durations are Go duration strings ("100ms").
type Config struct {
	// NodeName is the node the agent runs on (Kubernetes mode: its pods and its Node object).
	NodeName string `json:"nodeName,omitempty"`
	// CgroupRoot is where the cgroup filesystem is mounted (a host mount in a DaemonSet).
	CgroupRoot string `json:"cgroupRoot,omitempty"`
	// ProcRoot is the host's /proc.
	ProcRoot string `json:"procRoot,omitempty"`
	// CgroupDriver is kubelet's cgroup driver: cgroupfs or systemd.
	CgroupDriver string `json:"cgroupDriver,omitempty"`
	// KubeletCgroupRoot is kubelet's --cgroup-root (its cgroupRoot setting), as kubelet
	// takes it: the parent of "kubepods" ("/" by default; kind's is "/kubelet"). Under
	// the systemd driver its components lead every slice name (kubelet.slice,
	// kubelet-kubepods.slice, ...).
	KubeletCgroupRoot string `json:"kubeletCgroupRoot,omitempty"`
	// TierName names the agent-owned batch tier cgroup.
	TierName string `json:"tierName,omitempty"`
	// TierParent is the kubelet cgroup the tier is created in: "kubepods" (default; the
	// tier is then a sibling of kubelet's QoS cgroups, the level at which the kernel
	// compares it with LS pods, so its SCHED_IDLE takes effect against them) or
	// "besteffort" (the tier competes with LS only through kubelet's BestEffort
	// weight). See docs/design.md.
	TierParent string `json:"tierParent,omitempty"`
	// NRI places batch containers below the tier (needs containerd ≥ 1.7 or CRI-O with NRI on).
	NRI NRI `json:"nri"`
	// Period is the sampling and control period.
	Period metav1.Duration `json:"period,omitempty"`
	// CFSPeriod is the CFS bandwidth period written with every quota. Long by default
	// (1s): batch runs at SCHED_IDLE, so a burst within a period costs LS nothing, while
	// every throttle/unthrottle transition does; measured in docs/benchmarks.md (LS p99
	// 1.80x solo at 10ms, 1.25-1.45x at 100ms, 1.13-1.23x at 400ms, 1.03x at 1s). A cut is
	// still immediate: writing a quota restarts the period.
	CFSPeriod metav1.Duration `json:"cfsPeriod,omitempty"`
	// MinPodCPU is the smallest quota (cores) one batch pod gets in in-place mode.
	MinPodCPU float64 `json:"minPodCPU,omitempty"`
	// StaticPodDir is a directory of pod manifests (static mode, no API server).
	StaticPodDir string `json:"staticPodDir,omitempty"`
	// ListenAddress serves /metrics, /healthz and /status.
	ListenAddress string `json:"listenAddress,omitempty"`
	// NodeMetricsPeriod is the node-metrics window (Kubernetes mode): the agent averages
	// over it and decides at its end whether to patch the node-metrics annotation.
	NodeMetricsPeriod metav1.Duration `json:"nodeMetricsPeriod,omitempty"`
	// NodeMetricsReport says when a window's node metrics are written: on a material
	// change, else every maxInterval (qos.ReportPolicy).
	NodeMetricsReport qos.ReportPolicy `json:"nodeMetricsReport"`
	// ShutdownBudgetCPU is the batch budget (cores) left in place on graceful shutdown.
	ShutdownBudgetCPU *float64 `json:"shutdownBudgetCPU,omitempty"`
	// Policy is the batch CPU budget policy.
	Policy qos.Policy `json:"policy"`
	// BatchResources is how the batch resources published on the Node
	// (understory.io/batch-cpu, understory.io/batch-memory) are computed; its memory
	// threshold also sets the tier's memory limit.
	BatchResources qos.ReclaimConfig `json:"batchResources"`
	// Escalation is when batch is frozen and when batch pods are evicted (through the
	// Eviction API, so PodDisruptionBudgets hold; reported only in static mode).
	Escalation qos.EscalationConfig `json:"escalation"`
	// GPU is GPU telemetry, GPU-aware batch throttling and shared-GPU devices.
	GPU GPU `json:"gpu"`
	// Signals is the fast LS harm signals (eBPF run-queue delay, PSI) and how the budget
	// answers them; with one, only harm cuts batch (see Signals).
	Signals Signals `json:"signals"`
}

// Where the tier may be created.
const (
	TierParentKubepods   = "kubepods"
	TierParentBestEffort = "besteffort"
)

// tierParentQOS is the kubelet QoS cgroup the tier's parent names: kubepods is where
// kubelet's Guaranteed pods live. ok is false for any other parent.
func tierParentQOS(parent string) (q cgroups.KubeQOS, ok bool) {
	switch parent {
	case TierParentKubepods:
		return cgroups.QOSGuaranteed, true
	case TierParentBestEffort:
		return cgroups.QOSBestEffort, true
	}
	return 0, false
}

// Cgroups returns kubelet's cgroup naming (its driver and --cgroup-root) and the batch
// tier's cgroup, relative to the hierarchy root.
func (c Config) Cgroups() (cgroups.Naming, string, error) {
	d, err := cgroups.ParseDriver(c.CgroupDriver)
	if err != nil {
		return cgroups.Naming{}, "", fmt.Errorf("cgroupDriver: %w: %w", err, ErrInvalid)
	}
	n := cgroups.Naming{Driver: d, Root: c.KubeletCgroupRoot}
	tier, err := tierCgroup(n, c.TierParent, c.TierName)
	if err != nil {
		return cgroups.Naming{}, "", err
	}
	return n, tier, nil
}

// TierCgroup is the batch tier's cgroup for kubelet's --cgroup-root and driver, in
// parent (TierParentKubepods or TierParentBestEffort), named as kubelet names a child
// of that cgroup (cgroups.Naming.TierPathIn).
func TierCgroup(d cgroups.Driver, kubeletRoot, parent, name string) (string, error) {
	return tierCgroup(cgroups.Naming{Driver: d, Root: kubeletRoot}, parent, name)
}

func tierCgroup(n cgroups.Naming, parent, name string) (string, error) {
	q, ok := tierParentQOS(parent)
	if !ok {
		return "", fmt.Errorf("tier parent %q: %w", parent, ErrInvalid)
	}
	return n.TierPathIn(q, name)
}

// Defaults of the configuration.
const (
	DefaultCgroupRoot        = "/sys/fs/cgroup"
	DefaultProcRoot          = "/proc"
	DefaultTierName          = "understory-batch"
	DefaultPeriod            = 100 * time.Millisecond
	DefaultCFSPeriod         = time.Second
	DefaultMinPodCPU         = 0.01
	DefaultListenAddress     = ":9316"
	DefaultNodeMetricsPeriod = 10 * time.Second
	DefaultNRISocket         = "/var/run/nri/nri.sock"
)

// Default returns the configuration used when the file leaves a field out.
func Default() Config {
	return Config{
		CgroupRoot:        DefaultCgroupRoot,
		ProcRoot:          DefaultProcRoot,
		CgroupDriver:      string(cgroups.DriverCgroupfs),
		KubeletCgroupRoot: "/",
		TierName:          DefaultTierName,
		TierParent:        TierParentKubepods,
		NRI: NRI{Socket: DefaultNRISocket,
			TrustedVisibilityNamespaces: []string{"understory-system", "kube-system"}},
		Period:            metav1.Duration{Duration: DefaultPeriod},
		CFSPeriod:         metav1.Duration{Duration: DefaultCFSPeriod},
		MinPodCPU:         DefaultMinPodCPU,
		ListenAddress:     DefaultListenAddress,
		NodeMetricsPeriod: metav1.Duration{Duration: DefaultNodeMetricsPeriod},
		NodeMetricsReport: qos.DefaultReportPolicy(),
		Policy:            qos.DefaultPolicy(),
		BatchResources:    qos.DefaultReclaimConfig(),
		Escalation:        qos.DefaultEscalationConfig(),
		GPU:               DefaultGPU(),
		Signals:           DefaultSignals(),
	}
}

// Load parses a YAML configuration over the defaults and validates it.
// Unknown fields are errors, so a typo never silently falls back to a default.
func Load(data []byte) (Config, error) {
	cfg := Default()
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("%s: %w", fieldOfError(data, err), ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Lenient is what can be read of a configuration that may not load, for the
// start-up thaw (ThawAtStart), which must run before the configuration is validated:
// the defaults with the file's cgroupRoot and kubeletCgroupRoot, whatever else the file
// holds (a field of the wrong type, an unknown one, an invalid value), and nothing
// validated; the defaults alone when those two cannot be read.
func Lenient(data []byte) Config {
	cfg := Default()
	var where struct {
		CgroupRoot        string `json:"cgroupRoot"`
		KubeletCgroupRoot string `json:"kubeletCgroupRoot"`
	}
	if err := yaml.Unmarshal(data, &where); err != nil {
		return cfg
	}
	if where.CgroupRoot != "" {
		cfg.CgroupRoot = where.CgroupRoot
	}
	if where.KubeletCgroupRoot != "" {
		cfg.KubeletCgroupRoot = where.KubeletCgroupRoot
	}
	return cfg
}

// fieldOfError names the top-level field a decoding error comes from, by decoding the
// fields one at a time: the YAML library's type errors do not always name it. A .nan or
// .inf anywhere is named by its whole path: the YAML-to-JSON step fails on it without
// naming anything.
func fieldOfError(data []byte, err error) string {
	if path := nonFinitePath(data); path != "" {
		return path + ": not a finite number"
	}
	var fields map[string]any
	if yaml.Unmarshal(data, &fields) != nil {
		return fmt.Sprintf("parsing: %v", err)
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		one, mErr := yaml.Marshal(map[string]any{k: fields[k]})
		if mErr != nil {
			continue
		}
		cfg := Default()
		if fErr := yaml.UnmarshalStrict(one, &cfg); fErr != nil {
			return fmt.Sprintf("%s: %v", k, fErr)
		}
	}
	return fmt.Sprintf("parsing: %v", err)
}

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalid)
	}
	if c.CgroupRoot == "" {
		return bad("cgroupRoot", "must not be empty")
	}
	if c.ProcRoot == "" {
		return bad("procRoot", "must not be empty")
	}
	d, err := cgroups.ParseDriver(c.CgroupDriver)
	if err != nil {
		return bad("cgroupDriver", "%q must be cgroupfs or systemd", c.CgroupDriver)
	}
	if c.KubeletCgroupRoot == "" {
		return bad("kubeletCgroupRoot", "must not be empty (kubelet's default is \"/\")")
	}
	naming := cgroups.Naming{Driver: d, Root: c.KubeletCgroupRoot}
	if err := naming.Validate(); err != nil {
		what := "is not a safe cgroup path"
		if (cgroups.Naming{Driver: cgroups.DriverCgroupfs, Root: c.KubeletCgroupRoot}).Validate() == nil {
			what = "makes no valid slice names with cgroupDriver systemd"
		}
		return bad("kubeletCgroupRoot", "%q %s: %v", c.KubeletCgroupRoot, what, err)
	}
	q, ok := tierParentQOS(c.TierParent)
	if !ok {
		return bad("tierParent", "%q must be %q or %q", c.TierParent, TierParentKubepods, TierParentBestEffort)
	}
	if _, err := naming.TierPathIn(q, c.TierName); err != nil {
		return bad("tierName", "%q: %v", c.TierName, err)
	}
	if c.NRI.Enabled && !strings.HasPrefix(c.NRI.Socket, "/") {
		return bad("nri.socket", "%q must be an absolute path when nri.enabled", c.NRI.Socket)
	}
	for _, ns := range c.NRI.TrustedVisibilityNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return bad("nri.trustedVisibilityNamespaces", "%q is no namespace name: %s", ns, strings.Join(errs, "; "))
		}
	}
	if p := c.Period.Duration; p < 10*time.Millisecond || p > 10*time.Second {
		return bad("period", "%v must be within [10ms, 10s]", p)
	}
	if p := c.CFSPeriod.Duration; p < time.Millisecond || p > time.Second {
		return bad("cfsPeriod", "%v must be within [1ms, 1s]", p)
	}
	// The kernel's smallest CFS quota is 1 ms per period.
	if floor := float64(time.Millisecond) / float64(c.CFSPeriod.Duration); math.IsNaN(c.MinPodCPU) || c.MinPodCPU < floor || c.MinPodCPU > 1024 {
		return bad("minPodCPU", "%v must be within [%g, 1024] cores (1ms of quota per cfsPeriod)", c.MinPodCPU, floor)
	}
	if c.ListenAddress == "" {
		return bad("listenAddress", "must not be empty (use 127.0.0.1:0 for an ephemeral port)")
	}
	if p := c.NodeMetricsPeriod.Duration; p < time.Second || p > 10*time.Minute {
		return bad("nodeMetricsPeriod", "%v must be within [1s, 10m]", p)
	}
	if err := c.NodeMetricsReport.Validate(); err != nil {
		return fmt.Errorf("nodeMetricsReport.%w", err)
	}
	if c.NodeMetricsReport.MaxInterval.Duration < c.NodeMetricsPeriod.Duration {
		return bad("nodeMetricsReport.maxInterval", "%v must be at least nodeMetricsPeriod (%v)",
			c.NodeMetricsReport.MaxInterval.Duration, c.NodeMetricsPeriod.Duration)
	}
	if s := c.ShutdownBudgetCPU; s != nil && (math.IsNaN(*s) || *s < 0) {
		return bad("shutdownBudgetCPU", "%v must be ≥ 0 cores", *s)
	}
	if err := c.Policy.Validate(); err != nil {
		return fmt.Errorf("policy.%w", err)
	}
	if err := c.BatchResources.Validate(); err != nil {
		return fmt.Errorf("batchResources.%w", err)
	}
	if err := c.Escalation.Validate(); err != nil {
		return fmt.Errorf("escalation.%w", err)
	}
	if err := c.GPU.Validate(); err != nil {
		return err
	}
	return c.Signals.Validate()
}

// nonFinitePath is the path (a.b.c) of the first number in data, in document order,
// that is a YAML .nan or .inf; "" when there is none or data does not parse.
func nonFinitePath(data []byte) string {
	var doc yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &doc) != nil {
		return ""
	}
	var walk func(prefix string, v any) string
	walk = func(prefix string, v any) string {
		switch v := v.(type) {
		case float64:
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return prefix
			}
		case yamlv2.MapSlice:
			for _, kv := range v {
				p := fmt.Sprint(kv.Key)
				if prefix != "" {
					p = prefix + "." + p
				}
				if found := walk(p, kv.Value); found != "" {
					return found
				}
			}
		case []any:
			for i, e := range v {
				if found := walk(fmt.Sprintf("%s[%d]", prefix, i), e); found != "" {
					return found
				}
			}
		}
		return ""
	}
	return walk("", doc)
}

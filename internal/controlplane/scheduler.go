package controlplane

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	schedulerAPIVersion = "kubescheduler.config.k8s.io/v1"
	schedulerKind       = "KubeSchedulerConfiguration"
)

// ErrSchedulerConfig marks a KubeSchedulerConfiguration the harness cannot use.
var ErrSchedulerConfig = errors.New("invalid scheduler configuration")

// SchedulerOption tunes StartScheduler.
type SchedulerOption func(*schedulerOptions)

type schedulerOptions struct {
	qps            float32
	burst          int32
	args           []string
	kubeconfig     string
	leaderElection bool
}

// WithKubeconfig runs the scheduler as another identity: path is its
// clientConnection.kubeconfig and its --authentication-kubeconfig and
// --authorization-kubeconfig (e.g. a service account's token, to test the RBAC
// a deployed scheduler gets).
func WithKubeconfig(path string) SchedulerOption {
	return func(o *schedulerOptions) { o.kubeconfig = path }
}

// WithLeaderElection keeps the configuration's leaderElection section and
// turns leaderElect on, instead of turning leader election off.
func WithLeaderElection() SchedulerOption {
	return func(o *schedulerOptions) { o.leaderElection = true }
}

// WithClientRate sets clientConnection.qps and .burst (kube-scheduler's
// defaults, 50 and 100, cap binding throughput at about 50 pods/s).
func WithClientRate(qps float32, burst int32) SchedulerOption {
	return func(o *schedulerOptions) { o.qps, o.burst = qps, burst }
}

// WithSchedulerArgs appends flags to kube-scheduler's command line.
func WithSchedulerArgs(args ...string) SchedulerOption {
	return func(o *schedulerOptions) { o.args = append(o.args, args...) }
}

// Scheduler is a running kube-scheduler.
type Scheduler struct {
	proc       *process
	configPath string
	url        string
}

// Stop stops the scheduler before the test ends (the test's cleanup also
// does). Safe to call more than once.
func (s *Scheduler) Stop() { s.proc.stop() }

// ConfigPath is the KubeSchedulerConfiguration file the scheduler runs with.
func (s *Scheduler) ConfigPath() string { return s.configPath }

// LogPath is the scheduler's log file.
func (s *Scheduler) LogPath() string { return s.proc.logPath }

// URL is the scheduler's https serving URL (/readyz, /metrics).
func (s *Scheduler) URL() string { return s.url }

// StartScheduler runs kube-scheduler against the control plane with the
// given KubeSchedulerConfiguration (YAML, kubescheduler.config.k8s.io/v1;
// "" for the default profile) and waits for its /readyz, which includes
// informer sync. The harness sets clientConnection.kubeconfig (a
// system:kube-scheduler identity, or WithKubeconfig's) and turns leader
// election off (unless WithLeaderElection); everything else in configYAML is
// passed through.
func (cp *ControlPlane) StartScheduler(t testing.TB, configYAML string, opts ...SchedulerOption) *Scheduler {
	t.Helper()
	var o schedulerOptions
	for _, f := range opts {
		f(&o)
	}
	n := strconv.Itoa(cp.nextSchedulerSeq())
	kubeconfig := cp.schedulerKubeconfig
	if o.kubeconfig != "" {
		kubeconfig = o.kubeconfig
	}
	cfg, err := completeSchedulerConfig(configYAML, kubeconfig, o)
	if err != nil {
		t.Fatalf("kube-scheduler: %v", err)
	}
	s := &Scheduler{configPath: cp.path("scheduler-" + n + ".yaml")}
	if err := os.WriteFile(s.configPath, cfg, 0o600); err != nil {
		t.Fatalf("kube-scheduler: writing config: %v", err)
	}
	s.proc, s.url = cp.startServed(t, servedComponent{
		label: "kube-scheduler", procName: "kube-scheduler-" + n, bin: cp.bin.scheduler,
		logFile: "kube-scheduler-" + n + ".log", certStem: "scheduler-" + n, readyPath: "/readyz",
		args: func(port int, certFile, keyFile string) []string {
			args := []string{
				"--config=" + s.configPath,
				"--bind-address=127.0.0.1",
				"--secure-port=" + strconv.Itoa(port),
				"--tls-cert-file=" + certFile,
				"--tls-private-key-file=" + keyFile,
				"--authentication-kubeconfig=" + kubeconfig,
				"--authorization-kubeconfig=" + kubeconfig,
				"--v=" + strconv.Itoa(cp.opts.Verbosity),
			}
			if v := cp.opts.EmulatedVersion; v != "" {
				args = append(args, "--emulated-version=kube="+v)
			}
			return append(args, o.args...)
		},
	})
	return s
}

// completeSchedulerConfig validates configYAML's type and fills in the
// fields the harness owns.
func completeSchedulerConfig(configYAML, kubeconfig string, o schedulerOptions) ([]byte, error) {
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(configYAML), &cfg); err != nil {
		return nil, fmt.Errorf("parsing configuration: %w: %w", err, ErrSchedulerConfig)
	}
	if cfg == nil {
		cfg = map[string]any{}
	}
	if v, ok := cfg["apiVersion"]; !ok {
		cfg["apiVersion"] = schedulerAPIVersion
	} else if v != schedulerAPIVersion {
		return nil, fmt.Errorf("apiVersion %v, want %s: %w", v, schedulerAPIVersion, ErrSchedulerConfig)
	}
	if v, ok := cfg["kind"]; !ok {
		cfg["kind"] = schedulerKind
	} else if v != schedulerKind {
		return nil, fmt.Errorf("kind %v, want %s: %w", v, schedulerKind, ErrSchedulerConfig)
	}
	conn, err := subMap(cfg, "clientConnection")
	if err != nil {
		return nil, err
	}
	conn["kubeconfig"] = kubeconfig
	if o.qps > 0 {
		conn["qps"] = o.qps
		conn["burst"] = o.burst
	}
	le, err := subMap(cfg, "leaderElection")
	if err != nil {
		return nil, err
	}
	le["leaderElect"] = o.leaderElection
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding configuration: %w", err)
	}
	return out, nil
}

func subMap(cfg map[string]any, key string) (map[string]any, error) {
	v, ok := cfg[key]
	if !ok || v == nil {
		m := map[string]any{}
		cfg[key] = m
		return m, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s is a %T, want a mapping: %w", key, v, ErrSchedulerConfig)
	}
	return m, nil
}

// Extender is one entry of KubeSchedulerConfiguration.extenders
// (kubescheduler.config.k8s.io/v1), for SchedulerConfig.
type Extender struct {
	URLPrefix        string                    `json:"urlPrefix"`
	FilterVerb       string                    `json:"filterVerb,omitempty"`
	PrioritizeVerb   string                    `json:"prioritizeVerb,omitempty"`
	BindVerb         string                    `json:"bindVerb,omitempty"`
	Weight           int64                     `json:"weight,omitempty"` // required > 0 with PrioritizeVerb
	NodeCacheCapable bool                      `json:"nodeCacheCapable"`
	Ignorable        bool                      `json:"ignorable"`
	HTTPTimeout      string                    `json:"httpTimeout,omitempty"` // e.g. "5s"; kube-scheduler's default is 5s
	ManagedResources []ExtenderManagedResource `json:"managedResources,omitempty"`
}

// ExtenderManagedResource is an extended resource an Extender manages.
type ExtenderManagedResource struct {
	Name               string `json:"name"`
	IgnoredByScheduler bool   `json:"ignoredByScheduler"`
}

// SchedulerConfig returns a KubeSchedulerConfiguration with the default
// profile and the given extenders, for StartScheduler.
func SchedulerConfig(extenders ...Extender) (string, error) {
	cfg := map[string]any{"apiVersion": schedulerAPIVersion, "kind": schedulerKind}
	if len(extenders) > 0 {
		cfg["extenders"] = extenders
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("encoding scheduler configuration: %w", err)
	}
	return string(out), nil
}

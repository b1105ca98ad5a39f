package config

import (
	"errors"
	"github.com/understory/understory/qos"
	"strings"
	"testing"
	"time"
)

// TestTimesliceConfig: gpu.timeslice is off by default, takes the policy's fields under
// it, and every bad value is refused naming its key.
func TestTimesliceConfig(t *testing.T) {
	t.Parallel()
	def := Default().GPU.Timeslice
	if def.Enabled || def.Directory != DefaultTimesliceDirectory || def.Library != DefaultTimesliceLibrary ||
		def.GPUTimeslicePolicy != qos.DefaultGPUTimeslicePolicy() {
		t.Fatalf("defaults %+v", def)
	}
	cfg, err := Load([]byte("gpu:\n  timeslice:\n    enabled: true\n    batchSlice: 150us\n    lsSlice: 20ms\n" +
		"    directory: /srv/tsg\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.GPU.Timeslice; !c.Enabled || c.BatchSlice.Duration != 150*time.Microsecond ||
		c.LSSlice.Duration != 20*time.Millisecond || c.Directory != "/srv/tsg" || c.Library != DefaultTimesliceLibrary ||
		c.SwitchCost != qos.DefaultGPUTimeslicePolicy().SwitchCost {
		t.Fatalf("loaded %+v", c)
	}
	for yaml, want := range map[string]string{
		"batchSlice: 5us":           "gpu.timeslice.batchSlice: 5µs must be in [10µs, lsMaxWait − switchCost]",
		"lsSlice: 1ms":              "gpu.timeslice.lsSlice: 1ms must be in [2.048ms, 100ms]",
		"batchSlice: 100500ns":      "gpu.timeslice.batchSlice: 100.5µs must be whole microseconds",
		"freezeAbovePercent: 0":     "gpu.timeslice.freezeAbovePercent: 0 must be in (0, 100]",
		"lsMaxWait: 300us":          "gpu.timeslice.lsMaxWait: 300µs must be at least batchSlice + switchCost",
		"directory: relative/dir":   `gpu.timeslice.directory: "relative/dir" must be a clean absolute path`,
		"library: /usr/lib/../x.so": `gpu.timeslice.library: "/usr/lib/../x.so" must be a clean absolute path`,
		"enabled: maybe":            "gpu.timeslice.enabled",
		"slices: 3":                 "slices",
	} {
		_, err := Load([]byte("gpu:\n  timeslice:\n    " + yaml + "\n"))
		if !errors.Is(err, ErrInvalid) && !errors.Is(err, qos.ErrInvalidConfig) {
			t.Errorf("%s: %v; want an invalid-config error", yaml, err)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q; want it to say %q", yaml, err, want)
		}
	}
}

func TestGPUConfigValidate(t *testing.T) {
	t.Parallel()
	for name, mutate := range map[string]func(*GPU){
		"mode":       func(c *GPU) { c.Mode = "on" },
		"loopPeriod": func(c *GPU) { c.LoopPeriod.Duration = 0 },
		"fullScrapePeriod below loopPeriod": func(c *GPU) {
			c.LoopPeriod.Duration, c.FullScrapePeriod.Duration = 100*time.Millisecond, 50*time.Millisecond
		},
		"fullScrapePeriod zero":     func(c *GPU) { c.FullScrapePeriod.Duration = 0 },
		"fullScrapePeriod too long": func(c *GPU) { c.FullScrapePeriod.Duration = 11 * time.Second },
		"throttle":                  func(c *GPU) { c.Throttle.LSUtilOnPercent = 200 },
		"throttle mps":              func(c *GPU) { c.Throttle.MPS.MaxBatchPercent = 100 },
		"suspend":                   func(c *GPU) { c.Suspend.Path = "" },
		"devices":                   func(c *GPU) { c.Devices.Mode = "magic" },
		"socket":                    func(c *GPU) { c.PodResourcesSocket = "relative.sock" },
	} {
		c := DefaultGPU()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: bad config accepted", name)
		}
	}
	if err := DefaultGPU().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg, err := Load([]byte("gpu:\n  mode: disabled\n  throttle:\n    hold: 2s\n    lsUtilOnPercent: 5\n" +
		"    mps:\n      maxBatchPercent: 20\n"))
	if err != nil || cfg.GPU.Throttle.Hold.Duration != 2*time.Second || cfg.GPU.Throttle.MPS.MaxBatchPercent != 20 {
		t.Fatalf("loading a GPU config: %+v, %v", cfg.GPU.Throttle, err)
	}
	// The fractional duty cycle's keys are refused, naming the key and what replaces it.
	for _, key := range []string{"maxDuty: 0.5", "activeDuty: 0.2", "restorePerSecond: 0.1"} {
		_, err := Load([]byte("gpu:\n  throttle:\n    " + key + "\n"))
		name := strings.SplitN(key, ":", 2)[0]
		if !errors.Is(err, qos.ErrInvalidConfig) || !errors.Is(err, qos.ErrGPUThrottleKeyRemoved) ||
			!strings.Contains(err.Error(), "gpu.throttle: gpu throttle "+name) || !strings.Contains(err.Error(), "frozen solid") {
			t.Errorf("%s: %v", key, err)
		}
	}
	for yaml, want := range map[string]time.Duration{
		"gpu:\n  fullScrapePeriod: 2s\n":                         2 * time.Second,
		"gpu:\n  loopPeriod: 100ms\n  fullScrapePeriod: 100ms\n": 100 * time.Millisecond,
	} {
		cfg, err := Load([]byte(yaml))
		if err != nil || cfg.GPU.FullScrapePeriod.Duration != want {
			t.Errorf("%q: full-scrape period %v, %v; want %v", yaml, cfg.GPU.FullScrapePeriod.Duration, err, want)
		}
	}
	if _, err := Load([]byte("gpu:\n  loopPeriod: 2s\n")); err == nil {
		t.Error("a loop period above the default full-scrape period (1s) was accepted")
	}
}

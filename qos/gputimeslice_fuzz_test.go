package qos

import (
	"errors"
	"testing"

	"sigs.k8s.io/yaml"
)

// FuzzGPUTimeslicePolicy parses the timeslice part of the agent's config as the agent
// does (defaults first, then YAML over them): Validate fails only with ErrInvalidConfig,
// forcing into range always gives a valid policy that keeps a valid one as it is, and the
// chosen batch slice keeps LS's worst wait within the bound in force.
func FuzzGPUTimeslicePolicy(f *testing.F) {
	for _, s := range []string{
		"", "lsSlice: 20ms\n", "batchSlice: 5us\n", "batchSlice: 100.5us\n", "switchCost: -1us\n",
		"lsMaxWait: 2049us\n", "lsMaxWait: 300us\n", "freezeAbovePercent: .nan\n", "freezeAbovePercent: 0\n",
		"batchSlice: 10us\nswitchCost: 0s\nlsMaxWait: 10us\n", "lsSlice: 9223372036854775807ns\n",
		"{\"lsSlice\": \"1h\"}", "lsSlice: [", "- 1",
	} {
		f.Add([]byte(s), 32.0, int64(250))
	}
	f.Fuzz(func(t *testing.T, data []byte, demand float64, batchReq int64) {
		p := DefaultGPUTimeslicePolicy()
		if err := yaml.Unmarshal(data, &p); err != nil {
			return
		}
		err := p.Validate()
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Validate(%+v) = %v, not wrapping ErrInvalidConfig", p, err)
		}
		forced := forceGPUTimesliceRange(p)
		if ferr := forced.Validate(); ferr != nil {
			t.Fatalf("forced %+v (from %+v) does not validate: %v", forced, p, ferr)
		}
		if err == nil && forced != p {
			t.Fatalf("a valid policy %+v was forced to %+v", p, forced)
		}
		d := ChooseGPUTimeslice(p, GPUTimesliceInput{DriverSupported: true, LSDemandPercent: demand,
			BatchRequestMilli: []int64{batchReq}, BatchPods: 1,
			Contexts: []GPUTimesliceContext{{Pod: "ls", Class: ClassLS}}})
		if !d.LSPresent || d.LSWorstWaitUs > usOf(forced.LSMaxWait.Duration) ||
			d.BatchSliceUs < usOf(forced.BatchSlice.Duration) || d.LSSliceUs != usOf(forced.LSSlice.Duration) {
			t.Fatalf("policy %+v (in force %+v), demand %v, batch %d: %+v", p, forced, demand, batchReq, d)
		}
	})
}

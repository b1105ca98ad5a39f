// Package gpubench measures the node agent's GPU throttling path and writes
// bench/out/gpu.json. It is benchmark code: cmd/gpu-bench is its command line
// (`make bench-gpu`), and no production package imports it.
//
// Its parts (Config.Parts, all by default):
//
//   - duty (duty.go): a CPU burner in a real cgroup, duty-cycled by koordlet/gpu/duty at
//     the agent's period, gets a share of the CPU it gets unfrozen; duty_error_pct is how
//     far the frozen share is from the target, in percentage points, at 25, 50 and 75 %.
//   - reaction (reaction.go): reaction_ms, the time from an LS load step on an NVML mock
//     GPU until the batch pod's real cgroup is frozen, through the agent's whole GPU
//     pipeline (collector, attribution, throttle, duty cycler, freezer); p50/p99/max
//     over the trials.
//   - collect (collect.go): collect_us_per_device, the collector's own cost per GPU per
//     full scrape on an 8-GPU mock, and the cost of a probe (process list only) of every
//     GPU.
//   - agent_cpu (agentcpu.go): agent_cpu_pct_of_core, the CPU of the whole koordlet agent
//     (its own process: the binary re-executed as "agent-node", see Child) with 8 mock
//     GPUs and 110 pods on real cgroups; then the same with GPU features off, for the GPU
//     loop's share.
//
// result.go is the JSON and run.go the entry points: DefaultConfig, Run, Child.
//
// Traps:
//   - duty, reaction and agent_cpu need root and a cgroup filesystem with a freezer (v1
//     freezer or cgroup2 cgroup.freeze); reaction, collect and agent_cpu need a cgo build
//     (NVML): without cgo they fail with a clear error (nocgo.go).
//   - The agent_cpu part re-executes its own binary (os.Executable) as "agent-node":
//     cmd/gpu-bench and this package's test binary (TestMain) must both hand such
//     arguments to Child before anything else.
//   - Run takes the reaction and agent_cpu parts' cgroup root and period from the duty
//     part's settings: set Config.Duty, not the copies.
package gpubench

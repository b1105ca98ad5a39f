// Package colo is Understory's co-location benchmark and demo: one latency-sensitive
// (LS) web service and several CPU-hungry batch pods on this machine's real cgroups,
// under a private kubelet --cgroup-root, measured alone, under kubelet's plain
// BestEffort settings and under the real agent (cmd/koordlet, started as a separate
// process). It is research code: cmd/colo is its command line (`make demo`,
// `make bench-colo`, bench/out/colo.json), and no production package imports it.
//
//   - run.go: Options (what cmd/colo's flags set), Demo, Bench, Stability.
//   - child.go: the pods are this binary re-executed (ls-server, burner, mem-ls,
//     mem-batch); Child runs one.
//   - scenario.go, phases.go, demo.go, bench.go: the fake node, its phases, the paired
//     rounds of the four CPU phases (`make demo` rotates their order), `make demo`, and
//     `make bench-colo`'s rounds, sweep, reaction steps and overhead.
//   - rounds.go: the rounds summed up per phase (median p99/solo and its band) and
//     printed.
//   - variants.go, runvariants.go, signals.go, report.go: the scenario variants, run under
//     each of the agent's signal paths (ebpf, psi, sampling), and their targets.
//   - memory.go, memalloc.go, memcg.go: the memory-pressure scenario.
//   - stability.go: `colo stability` replays a day of LS CPU usage
//     (bench/traces/ls-cpu-trace.csv) through qos.Reclaimer.
//   - loadgen.go, slice.go, lsserver.go, burner.go, onset.go, agentproc.go: the open-loop
//     load generator, the LS server, the batch workers, the agent process.
//
// Traps:
//   - Demo and Bench need root, a cgroup filesystem and a built koordlet (`make build`);
//     they remove everything they created, also after an error or Ctrl-C.
//   - The pods' arguments are this package's own protocol (child.go): they are written
//     by scenario.go and memory.go and parsed by Child, not by cmd/colo's flags. A test
//     binary plays the pods too (TestMain), so a new pod subcommand goes in Child.
//   - The load generator runs with a short EEVDF slice, which fork would pass on:
//     children are started from a thread with the default slice (slice.go).
//   - The committed trace must equal what GenerateTrace writes from its seed
//     (TestStabilityGenerateReproducible), header line included.
//   - The tests that run the scenarios build cmd/koordlet and need root; -short skips them.
//   - A restarted agent continues from the tier limit it finds (qos.Guard.StartFrom):
//     startAgent lifts the limit the previous phase's agent left, so every agent phase
//     starts as on a fresh node.
//   - On a machine that runs DAMON (kdamond), its memory sampling stalls LS more the
//     more memory is in use, agent or not: the memory table prints its CPU per phase.
package colo

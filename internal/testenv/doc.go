// Package testenv is test support, imported only by tests and test helpers (never by
// production code): the one home of four rules of the house style.
//
//   - A test that cannot run here skips and says why, but in CI (the environment
//     variable CI=true) every test must run, so there it fails instead:
//     SkipOrFailInCI. InCI is the same check for a test helper that must decide
//     more than skip-or-fail (build what is missing, say).
//   - A test waits for the state it checks, never a fixed sleep followed by an
//     assert: WaitFor polls a condition until a deadline and fails with what it
//     waited for; Poll reports instead of failing, PollEvery at a chosen interval
//     (a condition that reads the API server); Hold checks a "nothing happens"
//     window.
//   - The pure layers (qos, the placement core, the wire contract) import only what
//     their tests allow and read no clock: CheckPure.
//   - A package whose code holds many descriptors (cgroup files, PSI triggers, BPF
//     maps) checks that its tests leave none open: its TestMain exits with
//     RunCheckingFDs(m), which fails the run and names each descriptor the tests
//     opened and did not close.
//
// ModuleRoot is where the tests and benchmarks find the module's manifests, scripts
// and outputs (go test runs in the package's directory).
//
// The package keeps no state: the CI check reads the environment on every call. That
// read is a test-only exception to the rule that only cmd/*/main.go reads the
// environment or flags; production code must not import this package (test/arch
// checks it: test harnesses).
package testenv

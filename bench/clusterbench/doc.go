// Package clusterbench is the cluster benchmark of issue 23 (`make bench-cluster`,
// bench/out/cluster.json, docs/img/cluster-bench.png, docs/cluster-bench.md): what
// co-location adds to a cluster's utilisation and what it costs the control plane,
// at hundreds to thousands of nodes on one machine. It is benchmark code: no
// production package imports it; cmd/cluster-bench prints and plots its reports
// and checks LS traces.
//
// What is real: etcd, kube-apiserver and kube-scheduler (the harness's release, test/e2e/controlplane),
// the scheduler extender (the real cmd/scheduler-extender binary, built from this
// tree and run as a child process, so its CPU and RSS are its own), kube-scheduler's
// configuration (manifests/scheduler/kube-scheduler-config.yaml through
// extenderharness.SchedulerConfig), and kwok's controller (scripts/kwok.sh) playing
// the kubelets of N fake nodes: node leases, pods Running once bound, batch pods
// Succeeded after the duration in their annotation understory.io/bench-duration
// (the Stages in kwokStages), deleted pods removed.
//
// What is simulated: the node agents. One stand-in (agent.go) acts for every node on
// a pool of goroutines: every tick (1 s) it reads the node's LS usage from the LS
// trace (lstrace.go: a file in the documented format, or the synthetic trace) and
// runs the agent's own pure code, one qos.Reclaimer and one qos.Budgeter per node
// for the whole run: the Reclaimer decides batch-cpu and batch-memory and when to
// write them (its deadband and rise damping), which the stand-in patches into the
// Node's status with nodestatus.PatchFor, as the agent's publisher does; every
// nodeMetricsPeriod (10 s) it writes the node-metrics annotations (window means,
// contract.NodeMetrics.EncodeAnnotations). The Budgeter gives the batch CPU the
// agent would let run: batch usage is min(what batch pods request, budget). Batch
// pods do nothing (kwok): they are taken to use what they request, up to the
// budget. The admission webhook is not run: batch pods are created in the form it
// gives them (understory.io/batch-cpu and batch-memory instead of cpu and memory).
//
// Workload (workload.go): CPU jobs and GPU jobs drawn from openb's tasks
// (../shared/traces/openb, openb.ParsePodRow for the requests, the trace's own
// durations divided by Compression), each stream a Poisson process offering a set
// load; a share of the CPU jobs are gangs (Koordinator's annotations). Node shapes
// are openb's node lists.
//
// Traps:
//   - Run needs a testing.TB (the control-plane harness is test support), so the
//     benchmark runs under `go test -bench Cluster`; cmd/cluster-bench does not run it.
//   - The stand-in's Budgeter runs once per tick, not per 100 ms control period:
//     its per-period restore step is scaled by tick/100ms to grow as fast per second.
//   - The LS trace loops; bench nodes beyond the trace's node count reuse its nodes
//     shifted in time (LSTrace.At), so they do not move in step.
//   - Utilisation "without co-location" is the same LS on the same nodes and no
//     batch there (batch on dedicated nodes elsewhere); it is computed from the same
//     run, not a second run.
//   - The extender's filter p99 is interpolated within its histogram's buckets
//     (0.5, 1, 2, 5, 10, 25 ms ...), as histogram_quantile does: within a bucket it
//     is an estimate.
//   - apiserver_request_total counts every client: kwok (the kubelets' leases and
//     pod status), kube-scheduler, the extender, the stand-in and the benchmark's
//     own pod creates and deletes. The agents' writes are counted exactly on the
//     client side (agent_*_patches_per_s).
//   - kube-apiserver runs with --feature-gates=WatchList=false: with it, every watch
//     from resourceVersion "0" (kwok's informers always ask for that) becomes a
//     streaming list, which needs etcd's watch-progress requests; the harness's etcd
//     3.4 lacks them, each such watch failed at once, and kwok saw pods only at its
//     re-lists, seconds apart. A release that locks the gate on needs a newer etcd.
//   - The job arrival rate grows with the spare CPU, hence with nodes (about 0.04
//     jobs/s per node at the defaults), and all of it goes through one kube-scheduler
//     and one extender: at the largest sizes on 2 cores the scheduler may fall behind
//     (batch_pods_pending_at_end).
//   - Everything shares the machine: on 2 cores the control plane, kwok and the
//     extender compete, so latency figures are upper bounds of a real cluster's.
package clusterbench

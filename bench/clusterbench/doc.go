// Package clusterbench is the cluster benchmark (`make bench-cluster`,
// bench/out/cluster.json, docs/img/cluster-bench.png, docs/cluster-bench.md): what
// co-location adds to a cluster's utilisation and what it costs the control plane,
// at hundreds to thousands of nodes on one machine. It is benchmark code: no
// production package imports it; cmd/cluster-bench prints and plots its reports
// and checks LS traces.
//
// What is real: etcd, kube-apiserver and kube-scheduler (the harness's release, test/e2e/controlplane),
// the scheduler extender (the real cmd/scheduler-extender binary, built from this
// tree and run as a child process, so its CPU and RSS are its own), the admission
// webhook (the real cmd/admission binary, built in the same go build and run the
// same way, over TLS on loopback with controlplane.NewWebhookCerts, the shipped
// profiles and PriorityClass, behind the shipped MutatingWebhookConfiguration
// pointed at it; admission.go), kube-scheduler's
// configuration (manifests/scheduler/kube-scheduler-config.yaml through
// controlplane.ManifestSchedulerConfig), and kwok's controller (scripts/kwok.sh) playing
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
// nodeMetricsPeriod (10 s) it closes a node-metrics window and writes the
// node-metrics annotations (window means, contract.NodeMetrics.EncodeAnnotations)
// when the agent's qos.ReportPolicy finds it due. The Budgeter gives the batch CPU the
// agent would let run: batch usage is min(what batch pods request, budget). Batch
// pods do nothing (kwok): they are taken to use what they request, up to the
// budget.
//
// Batch pods are created as a user writes them (userBatchPod: plain cpu and
// memory requests, in the namespace nsBatch that carries the shipped profile's
// label; GPU jobs add nvidia.com/gpu or understory.io/gpu-milli) and the webhook
// converts them; the tracker counts every pod it first sees unconverted
// (batch_pods_unconverted). With Options.Admission false (-clusterbench.admission
// =false) no webhook runs and the pods are created in its output form (batchPod).
//
// Kueue (kueue.go; Options.Kueue, -clusterbench.kueue, off by default): Kueue
// v0.17.0's manager (test/e2e/kueueharness, the shipped Configuration),
// kube-controller-manager with the job controller only, the shipped component's
// ResourceFlavor, ClusterQueues, tenant Namespaces (given the profile label) and
// LocalQueues, and the quota follower (cmd/kueue-quota, built with the extender,
// a child process, -leader-elect=false) in front of the extender. Each trace job
// becomes a suspended batch/v1 Job (kueueJob) in tenant-a or tenant-b, dealt
// alternately, with the user's pod as its template; Kueue admits it, the Job
// controller creates the pods, and a watch on the Workloads and samples of the
// ClusterQueues give the Kueue figures (admission wait, tenants' shares,
// evictions); the tracker counts gangs left partially bound.
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
//   - batchPod must stay what the webhook makes of userBatchPod: TestPodForms runs
//     the webhook's own admission.Mutator with the shipped profiles on every kind
//     of job and compares.
//   - The ValidatingAdmissionPolicies are not installed: their gpu-devices-writer
//     rule admits only the extender's service account, and the benchmark's
//     extender runs as the harness's admin (its GPU-share Bindings would be refused).
//   - The webhook's /healthz and /metrics are HTTPS only: they are read through a
//     client trusting its throwaway CA (webhook.hc), not http.DefaultClient.
//   - kube-apiserver adopts a new webhook configuration asynchronously: Run waits
//     until a dry-run pod comes back converted before the agents and jobs start.
//   - Kueue's Job webhook is not registered (kueueharness): Jobs are created with
//     spec.suspend true.
//   - A Job's finished pods keep the Job controller's finalizer until it has
//     counted them: the tracker deletes them only after (kwok's delete Stage
//     empties finalizers, which would lose the count). Pods deleted unfinished (a
//     Kueue eviction) free their node in the tracker's use counts.
//   - With Kueue a pod exists only after admission: a Job's pods are counted from
//     the Job (tracker.jobSubmitted): all its members submitted at its creation,
//     pending until as many of its pods are bound, whether or not they exist yet.
//   - Kueue's reconcilers need workers: Options.KueueWorkers (20) for the Job and
//     Workload reconcilers; with one each (a Configuration without Kueue's
//     install's controller section) admitted Jobs waited ~40 s to be unsuspended.
//   - Everything shares the machine: on 2 cores the control plane, kwok and the
//     extender compete, so latency figures are upper bounds of a real cluster's.
package clusterbench

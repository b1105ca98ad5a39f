// Package schedbench measures kube-scheduler's binding throughput on the
// real control plane of package controlplane: 5 000 fake nodes with 8 GPUs
// each, 3 000 pending pods per scenario, one scheduler configuration at a
// time. The numbers live in docs/benchmarks-controlplane.md
// and bench/out/scheduler-throughput.json.
//
// Scenarios (the same cluster, the same kube-scheduler settings):
//
//	(a) kube-scheduler                 alone, CPU pods
//	(b) noop-extender                  a do-nothing extender (filter + prioritize), GPU pods
//	(c) understory-extender            the real extender (package extender), GPU pods
//	(d) understory-extender-unmanaged  the real extender registered, CPU pods: it must get no call
//
// Both extenders use the extender entry of
// manifests/scheduler/kube-scheduler-config.yaml (nodeCacheCapable,
// managedResources, weight, httpTimeout; the do-nothing one without
// bindVerb). GPU pods cycle through nvidia.com/gpu 1 and 2 and
// understory.io/gpu-milli 500 and 250. Targets: (c) ≥ 0.9 × (b) and
// (d) ≥ 0.95 × (a) pods/s; the report has the ratios of the medians.
//
// Run it (make bench-scheduler):
//
//	go test ./test/e2e/schedbench -run '^$' -bench SchedulerThroughput -benchtime 1x -timeout 40m
//
// Flags (after the package): -schedbench.nodes, -schedbench.gpus,
// -schedbench.pods, -schedbench.qps, -schedbench.percentage,
// -schedbench.rounds, -schedbench.extender-protobuf,
// -schedbench.cpuprofile-dir, -schedbench.timeout, -schedbench.out.
//
// Method: all pods are created first with no scheduler running (the pod
// creation rate is reported separately), then the extender (if any) starts
// and syncs, then kube-scheduler starts and a watch stamps each pod when
// spec.nodeName first appears. pods_per_sec is (pods-1) / (last bind -
// first bind): scheduler start-up and informer sync are left out and
// reported as wall_s. Every scenario run gets a fresh scheduler process, a
// fresh extender and a namespace; its pods are deleted afterwards. The CPU
// time of every process (this one, which hosts the extenders, and its child
// servers) from scheduler start to last bind is read from /proc.
//
// Traps:
//   - kube-scheduler's default clientConnection qps/burst (50/100) caps
//     binding at ~50 pods/s; the benchmark raises them (-schedbench.qps).
//     The real extender uses the unlimited admin client here. Its binary
//     writes one Binding per pod (the device annotation rides on the
//     Binding), and its default -kube-api-qps 500 / -kube-api-burst 1000
//     leave headroom above this benchmark's bind rate.
//   - etcd runs on tmpfs (Options.EtcdOnTmpfs): on this shared VM disk
//     fdatasync stalls of >1 s were seen, which would measure the disk.
//   - The machine has 2 shared cores: apiserver, etcd, scheduler, the
//     extender and the benchmark's watch all compete, and other people's
//     load drifts during a run. Use -schedbench.rounds N (interleaved
//     a b c d, a b c d, ...) rather than -benchtime Nx (a a a, b b b, ...)
//     to compare scenarios, and check the recorded load averages.
//   - With the real extender, filter passes exactly one node, so
//     kube-scheduler skips scoring: (c) makes no prioritize calls.
//   - Pods are deleted with GracePeriodSeconds=0: without a kubelet a normal
//     delete of a bound pod never finishes.
package schedbench

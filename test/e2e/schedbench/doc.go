// Package schedbench measures kube-scheduler's binding throughput on the
// real control plane of package controlplane: 5 000 fake nodes, 3 000
// pending pods, one scheduler configuration at a time (kube-scheduler alone,
// with a do-nothing HTTP extender, later with Understory's extender). It is
// the baseline of issue A2 §7; the numbers live in
// docs/benchmarks-controlplane.md and bench/out/scheduler-throughput.json.
//
// Run it (make bench-scheduler):
//
//	go test ./test/e2e/schedbench -run '^$' -bench SchedulerThroughput -benchtime 1x -timeout 40m
//
// Flags (after the package): -schedbench.nodes, -schedbench.pods,
// -schedbench.qps, -schedbench.timeout, -schedbench.out.
//
// Method: all pods are created first with no scheduler running (the pod
// creation rate is reported separately), then kube-scheduler starts and a
// watch stamps each pod when spec.nodeName first appears. pods_per_sec is
// (pods-1) / (last bind - first bind): scheduler start-up and informer sync
// are left out and reported as wall_s. Every scenario gets a fresh scheduler
// process and namespace; the pods of the previous one are deleted first.
//
// Traps:
//   - kube-scheduler's default clientConnection qps/burst (50/100) caps
//     binding at ~50 pods/s; the benchmark raises them (-schedbench.qps).
//   - etcd runs on tmpfs (Options.EtcdOnTmpfs): on this shared VM disk
//     fdatasync stalls of >1 s were seen, which would measure the disk.
//   - The machine has 2 shared cores: apiserver, etcd, scheduler, the
//     extender and the benchmark's watch all compete. Compare numbers taken
//     on the same machine only, and check the recorded load average.
//   - Pods are deleted with GracePeriodSeconds=0: without a kubelet a normal
//     delete of a bound pod never finishes.
package schedbench

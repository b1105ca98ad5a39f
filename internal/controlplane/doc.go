// Package controlplane runs a real, throwaway Kubernetes control plane
// (etcd + kube-apiserver, optionally kube-scheduler) on loopback for
// integration tests and benchmarks. Tests and benchmarks share it; production never
// links it (test/arch's rule on test harnesses).
//
// Usage:
//
//	cp := controlplane.Start(ctx, t, controlplane.Options{})
//	cp.StartScheduler(t, "") // default profile
//	_, err := cp.CreateNodes(ctx, "node", 3, capacity, nil)
//	err = cp.WaitForPodsBound(ctx, "default", metav1.ListOptions{}, 1)
//
// Binaries: kube-apiserver and kube-scheduler v1.37.2 come from
// scripts/k8s-binaries.sh (built from the Go module proxy into
// $UNDERSTORY_CACHE/k8s-v1.37.2/bin, or UNDERSTORY_K8S_BIN); etcd is Debian's
// etcd-server (3.4) from PATH or UNDERSTORY_ETCD. When they are missing, Start
// runs the script if CI=true or UNDERSTORY_BUILD_K8S=1, otherwise it skips the
// test with the command to run. Under CI=true it never skips: a missing or
// failing build fails the test. FindKubectl finds (or, on the same terms,
// builds with `--with kubectl`) kubectl from the same cache, for tests that
// apply manifests as users do.
//
// Every process runs in its own process group with its output in a log file
// under t.TempDir(); t.Cleanup kills the group and waits for it, and prints
// the tail of every log when the test failed. Processes also get
// PR_SET_PDEATHSIG=SIGKILL, so they die with the test binary even when it is
// killed by `go test -timeout` and no cleanup runs.
//
// Traps:
//   - Start runs no kube-controller-manager; StartControllerManager runs one
//     with the deployment, replicaset and disruption controllers only (PDB
//     status is then real). Hence, always: no ServiceAccount controller
//     (the ServiceAccount admission plugin rejects pods in a namespace without
//     a "default" ServiceAccount, so create namespaces with CreateNamespace,
//     which adds it; "default" gets one at Start), no garbage collection
//     (ownerReferences are not followed), no namespace controller (a deleted
//     namespace stays Terminating forever: delete pods with
//     GracePeriodSeconds=0 instead), no node lifecycle (nodes never become
//     NotReady and pods are never evicted); without StartControllerManager no
//     ReplicaSet/Deployment controllers either (create bare pods), and never
//     Job/DaemonSet ones.
//   - There is no kubelet: a bound pod stays Pending with spec.nodeName set.
//     Deleting a bound pod without GracePeriodSeconds=0 leaves it
//     terminating forever.
//   - The TaintNodesByCondition admission plugin is disabled; with it every new
//     node gets the node.kubernetes.io/not-ready:NoSchedule taint, which only
//     the node lifecycle controller removes. CreateNode writes a Ready
//     condition and allocatable = capacity itself.
//   - The apiserver runs with --endpoint-reconciler-type=none (the
//     "kubernetes" Service has no endpoints: a loopback advertise address is
//     invalid there) and a front-proxy CA (so delegated authentication of
//     kube-scheduler finds its requestheader CA).
//   - Debian's etcd is 3.4: no --unsafe-no-fsync, capnslog unless --logger=zap,
//     and it reads ETCD_* variables from the environment (they are dropped).
//     Options.EtcdOnTmpfs puts the data dir on /dev/shm when fsync latency
//     would dominate (benchmarks).
//   - Ports are picked by listening on 127.0.0.1:0 and closing; another
//     process may grab one before the server binds it, so a server that exits
//     during start-up is retried on fresh ports (3 attempts).
//   - StartScheduler runs kube-scheduler as system:kube-scheduler (a client
//     certificate) with leader election off; WithKubeconfig runs it as another
//     identity (a service account's token, to test the RBAC a deployed scheduler
//     gets) and WithLeaderElection keeps the configuration's lease.
//   - The admin client has no client-side rate limit (QPS < 0); the
//     scheduler keeps its configured clientConnection qps/burst (defaults
//     50/100) unless WithClientRate raises them.
//   - Share one control plane between tests with one parent test and
//     t.Run subtests: the parent's cleanups run after its parallel subtests.
//   - PR_SET_PDEATHSIG is tied to the OS thread that started the process;
//     tests must not start control planes from a goroutine that called
//     runtime.LockOSThread and then exits.
package controlplane

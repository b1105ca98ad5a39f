// Package mps finds or runs the node's one CUDA MPS control daemon
// (nvidia-cuda-mps-control) for the agent's MPS partitions (docs/gpu.md, "MPS: one
// control daemon per node"), and says whether it answers.
//
//   - config.go: Config (gpu.mps): mode disabled | find | run, the pipe, log and shm
//     directories, the control binary, the check period and the clients' UID, with
//     WithDefaults and Validate (errors wrap ErrInvalidConfig).
//   - daemon.go: Daemon. Mode find uses a daemon someone else runs at the pipe
//     directory; mode run starts `nvidia-cuda-mps-control -d` (with
//     CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY) when none answers, and on
//     shutdown quits only a daemon it started. Run re-checks every CheckPeriod and
//     flips Ready, logging each change; the NRI plugin makes MPS clients only while
//     Ready. While the daemon answers, each check also lists its servers, their
//     clients (get_client_list) and active thread percentage
//     (get_active_thread_percentage): Servers, for the GPU loop's cap check.
//
// A daemon answers when <pipeDirectory>/control is a socket (or FIFO) and the
// control binary, run with the same CUDA_MPS_PIPE_DIRECTORY and
// "get_server_list" on its standard input, exits 0. Tests replace the binary with a
// shell script (ControlBinary) that emulates -d, get_server_list, get_client_list,
// get_active_thread_percentage and quit.
//
// Traps:
//   - A daemon started in mode run lives where the agent lives: inside the agent's
//     container it is killed with the container (the runtime kills every process of
//     a host-PID container's cgroup when it stops), and every MPS client loses its
//     server, so an agent upgrade or crash fails their CUDA calls. Mode run is for a
//     host process agent (the no-cluster mode, the benchmark); in Kubernetes run the
//     daemon outside the agent and use mode find (docs/gpu.md).
//   - The daemon runs one server per user ID, one at a time: a client whose UID
//     differs from the running server's waits inside CUDA initialisation until that
//     server's clients have all exited. Hence ClientUID: the NRI plugin makes only
//     containers of that UID MPS clients.
//   - Servers and clients share memory through /dev/shm: a client must see the
//     server's /dev/shm (ShmDirectory, mounted into each client). So mode run starts
//     the daemon through the agent's own binary (shm_linux.go: /proc/self/exe with
//     ShmStartArg, handled in cmd/koordlet) in a new mount namespace, where
//     StartWithPrivateShm makes every mount private, binds ShmDirectory (made 0700,
//     the client UID's) over /dev/shm and executes `<binary> -d`; the daemon's servers
//     inherit the namespace. The agent image has no shell, unshare or mount binary.
//   - The control socket must fit a unix socket path: Validate bounds the pipe
//     directory to 92 bytes (a longer one makes the daemon exit silently).
//   - A daemon left by a killed run leaves its socket behind: the socket alone
//     never counts as ready; only an answer does.
//   - The child gets the agent's environment plus the two MPS variables; -d forks
//     the daemon, which inherits its descriptors, so its output is not read (its
//     standard error goes to an unlinked file, read when -d fails).
package mps

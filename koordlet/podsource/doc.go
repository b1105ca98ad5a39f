// Package podsource tells the node agent which pods run on its node.
//
// Two sources share one shape (the agent owns the interface: Run, HasSynced,
// List, Changed):
//
//   - Static reads a directory of pod manifests, like kubelet's
//     --pod-manifest-path, for nodes or tests without an API server.
//   - Kube runs a client-go pod informer restricted to spec.nodeName=<node>.
//
// It also provides the sinks through which the agent reports a pod problem
// (EventSink writes Kubernetes Warning events, LogSink only logs), each
// suppressing repeats of the same (pod UID, reason, message) for DedupWindow.
//
// # Contract
//
// List returns a shared snapshot: callers must not modify the pods or the
// slice. It is cheap (the agent calls it every control period). Changed is a
// buffered(1), coalescing signal: one receive may stand for many changes,
// so a receiver must re-List rather than count signals. Run returns nil
// when its context is cancelled and an error only for a setup failure.
//
// # Traps
//
//   - Static pods need metadata.uid. kubelet derives a static pod's UID from
//     a hash of the manifest (and node name) computed by kubelet-internal
//     code we cannot reproduce without importing kubelet, and the agent
//     needs the UID to find the pod's cgroup (kubepods/.../pod<uid>). So a
//     manifest without metadata.uid is rejected; when the same directory
//     is also read by kubelet, the operator must write kubelet's UID into
//     it (or run the agent in Kube mode). The UID must be a safe cgroup
//     path component: [A-Za-z0-9._-], at most 128 bytes, not "." or "..".
//   - A manifest that goes bad loses nothing: Static keeps the file's last
//     good pod and reports the error in Errors (keyed by file path) until
//     the file is fixed or deleted. Deleting the file removes the pod.
//     A directory that becomes unreadable or disappears also keeps the last
//     known set (an error is recorded under the directory path); a directory
//     that comes back empty empties the set.
//   - Duplicate UIDs across files: the file that sorts first by name wins,
//     later ones get ErrDuplicateUID (falling back to their own last good
//     pod when that UID is still free). Adding a file that sorts earlier
//     can therefore take a UID over from an existing file.
//   - Manifests are decoded leniently (unknown fields are ignored, so
//     manifests written for a newer Kubernetes still load); a misspelt
//     field such as "anotations" is therefore silently dropped. A file may
//     hold exactly one YAML document; more are rejected rather than ignored.
//   - inotify watches the directory inode. Changes behind symlinks (to
//     files, or a symlinked directory being re-pointed) and the Kubernetes
//     "..data" symlink-swap are only guaranteed to be seen by the poll,
//     which therefore always runs (default every second). If the directory
//     is deleted or renamed, the watch is re-added on the next poll tick.
//     Writers should write a temporary file and rename it into place;
//     a half-written file is reported as an error until it is complete.
//   - Special files (FIFOs, devices) are rejected with ErrNotRegular; files
//     are opened O_NONBLOCK and checked with fstat, so a FIFO named *.yaml
//     cannot hang the scan. Sub-directories, dotfiles and names without a
//     .yaml/.yml/.json extension are ignored.
//   - Kube: the fake clientset and any proxy that drops the field selector
//     would hand us every pod in the cluster, so List and the change
//     handlers also filter on spec.nodeName themselves. An empty node name
//     would select unscheduled pods; Run refuses it (ErrNoNodeName).
//   - Kube.List keeps returning the last known set while the API server is
//     unreachable (the informer cache is not cleared on watch failures);
//     pods deleted meanwhile stay listed until the informer re-lists.
//   - Kube keeps Succeeded/Failed pods (their cgroups may linger); Active
//     tells the agent which ones still run.
//   - EventSink needs RBAC to create and patch events in the pods'
//     namespaces. Events are sent asynchronously; client-go's correlator
//     may further aggregate or rate-limit them.
package podsource

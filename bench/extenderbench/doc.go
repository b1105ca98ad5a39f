// Package extenderbench measures the scheduler extender (`make bench-extender`,
// bench/out/extender.json). It is benchmark code: cmd/extender-bench is its command
// line, and no production package imports it.
//
//   - latency (bench.go): filter and prioritize over real HTTP on loopback: it starts the
//     server in-process, loads a synthetic openb-like cluster into the index, and fires
//     pre-encoded ExtenderArgs (NodeNames form, every node a candidate) from several
//     concurrent clients, bounded in calls and time (p50/p99 latency, calls/s);
//   - lockhold (lockhold.go): every hold of the index's write lock while a 1 000-member
//     gang waits on 5 000 nodes under filters and informer events;
//   - memory (memory.go): the RSS of the extender, a child process with its real
//     informers, at 5 000 nodes and 100 000 pods served by a fake API server.
//   - failover (failover.go, not in the default runs): two replicas with leader
//     election (the shipped 8 s / 5 s / 1 s lease) in this process on the memory
//     run's fake API server, which also serves the Lease; the leader is "killed"
//     (every lease call of its client fails from then on: it neither renews nor
//     releases) and the synced standby must serve within -target-failover (15 s).
//     Its catch-up lists every pod (the fake API ignores field selectors).
//
// Traps:
//   - The memory run re-executes its own binary with -rss-child-api (and -nodes,
//     -rss-pods, -memprofile): cmd/extender-bench parses those flags and calls
//     MemoryChild, so they must stay in step with runMemory's command line.
//   - The extender runs in this process for the latency and lockhold runs: the clients'
//     CPU counts too (cpu_ms_per_call is the whole process's), and another busy process
//     on the machine moves every figure.
//   - It drives the extender only through its exported API (NewServer, Deps, State's
//     index updates, Status), as the informers would.
package extenderbench

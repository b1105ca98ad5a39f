// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// Run-queue delay per watched cgroup (see ../doc.go). Two program sets share
// the maps; userspace loads one of them:
//
//   - tp_btf_*: BTF-typed raw tracepoints (Linux 5.5+, kernel BTF). The task
//     is a typed pointer: its cgroup is read directly (CO-RE offsets).
//   - tp_*: classic tracepoints through tracefs. They need no BTF and no CO-RE:
//     the context layout is the tracepoint format (stable since 4.x) and the
//     cgroup comes from bpf_get_current_cgroup_id() (4.18+) at the moments the
//     task itself is current (it is switched out, or it forks).
//
// Attribution: a slow delay (at or above cfg's slow_ns) that ends by taking the
// CPU from a batch task (SCHED_IDLE, or in a cgroup with cpu.idle set, which is
// how the agent runs batch) is counted as batch's in the histogram's batch
// field. Only the typed set can look at the task switched out; the classic set
// counts every slow delay as batch's (it cannot tell).
//
// sched_switch runs on every context switch of every CPU: for tasks outside
// watched cgroups each handler costs one or two hash lookups that miss, and
// nothing is written. Keep it so.

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#define NUM_BUCKETS 26 // keep in sync with NumBuckets in ../histogram.go
#define TASK_RUNNING 0
// Classic sched_switch reports a preempted task as TASK_REPORT_MAX (0x100
// since 4.14), whatever its state.
#define TASK_REPORT_MAX 0x100
#define SCHED_IDLE 5
// Cgroup levels looked at for cpu.idle, from the task's own up: kubepods, the
// tier or QoS class, the pod, the container, and some to spare.
#define MAX_TG_DEPTH 8

struct hist {
	__u64 buckets[NUM_BUCKETS]; // bucket i: [2^i, 2^(i+1)) µs, bucket 0 also 0-1 µs
	__u64 count;
	__u64 sum_ns;
	__u64 batch; // slow delays (cfg's slow_ns) that took the CPU from batch
};

struct start {
	__u64 ts;  // ktime ns when the task became runnable
	__u64 key; // histogram the delay goes to
};

// cgroup v2 id -> histogram key. Filled by userspace (Watch); a pod's
// container cgroups map to the pod's key. max_entries is set at load.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} watched SEC(".maps");

// histogram key -> histogram. Userspace creates each entry (Watch) and
// deletes it (Unwatch); the programs never insert, so an unwatched key
// cannot be resurrected by a delay still in flight.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct hist);
} hists SEC(".maps");

// tid -> when it became runnable (0: it is running or asleep). Only tasks of
// watched cgroups get in, and stay while they live: updated in place, which
// takes no lock. LRU, so that the entries of dead tasks make room; an
// evicted live task only loses one delay.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, __u32);
	__type(value, struct start);
} starts SEC(".maps");

// The slow-event gate. Userspace sets cfg's slow_ns (0: off); every delay of
// a watched task at or above it adds one to slow[0], after its histogram.
// Userspace reads slow[0] each poll (mmap'ed when the kernel can: no syscall)
// and reads the histograms only when it moved. Both are arrays: the verifier
// inlines their lookups, and unlike global variables they load on kernels
// before 5.2 (the classic set's floor is 4.18). BPF_F_MMAPABLE is added by
// userspace where the kernel has it (5.5+).
// batch_only (not 0): slow[0] and the wake-up count only the slow delays
// that are batch's (see Attribution above); the histograms count all.
struct config {
	__u64 slow_ns;
	__u64 batch_only;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} slow SEC(".maps");

#ifndef RUNQLAT_NO_RINGBUF
// The slow-event wake-up (Linux 5.8+: ring buffers). While armed holds its
// one key, the first slow delay deletes it and writes one record to events:
// the reader wakes at once instead of polling slow[0]. Only the delete that
// removed the key writes (a hash delete is atomic, and works on every kernel
// with ring buffers; BPF's xchg and cmpxchg need 5.12), so one arming gives
// one record; userspace re-arms (../probe.go, Arm). The lookup first keeps a
// disarmed gate lock-free. RUNQLAT_NO_RINGBUF builds the object for older
// kernels without either (see ../gen.go).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} armed SEC(".maps");

struct slow_event {
	__u64 key;     // the histogram (pod) the delay went to
	__u64 delay_ns;
};

// max_entries (bytes) is set at load to the page size, the smallest ring.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");
#endif

// Classic set only: tid -> its cgroup id when it was last switched out (or
// forked), because a classic sched_wakeup does not say which cgroup the woken
// task is in.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, __u32);
	__type(value, __u64);
} tidcg SEC(".maps");

// Branch-free floor(log2(v)), as in bcc's runqlat.
static __always_inline __u32 log2_u32(__u32 v)
{
	__u32 r, shift;

	r = (v > 0xFFFF) << 4;
	v >>= r;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 hi = v >> 32;

	if (hi)
		return log2_u32(hi) + 32;
	return log2_u32(v);
}

static __always_inline void enqueue_key(__u32 tid, __u64 key)
{
	__u64 now = bpf_ktime_get_ns();
	struct start *s = bpf_map_lookup_elem(&starts, &tid);
	struct start n = {.ts = now, .key = key};

	// A task keeps its entry while it lives (LRU evicts the dead): writing
	// in place takes no lock, a map update takes the bucket's and the LRU's
	// (it measured ~150 ns more per event).
	if (s) {
		s->ts = now;
		s->key = key;
		return;
	}
	bpf_map_update_elem(&starts, &tid, &n, BPF_ANY);
}

// forget clears the clock a new task's tid may have from a dead task: one
// woken while it was still running that exited without being switched in
// again. Forks are rare enough for the lookup.
static __always_inline void forget(__u32 tid)
{
	struct start *s = bpf_map_lookup_elem(&starts, &tid);

	if (s)
		s->ts = 0;
}

static __always_inline void enqueue(__u32 tid, __u64 cgid)
{
	__u64 *key;

	if (!tid) // the idle tasks
		return;
	key = bpf_map_lookup_elem(&watched, &cgid);
	if (key)
		enqueue_key(tid, *key);
}

// batch_task: p runs as batch, the agent's way (SCHED_IDLE, or below a
// cgroup with cpu.idle: Linux 5.15+). Walked only for slow delays.
static __always_inline bool batch_task(struct task_struct *p)
{
	struct task_group *tg;
	int i;

	if (p->policy == SCHED_IDLE)
		return true;
	if (!bpf_core_field_exists(struct task_struct, sched_task_group) ||
	    !bpf_core_field_exists(struct task_group, idle))
		return false;
	tg = p->sched_task_group;
#pragma unroll
	for (i = 0; i < MAX_TG_DEPTH; i++) {
		if (!tg)
			return false;
		if (tg->idle)
			return true;
		tg = tg->parent;
	}
	return false;
}

// dequeue ends tid's wait as it is switched in; prev is the task it takes the
// CPU from (NULL: unknown, the classic set).
static __always_inline void dequeue(__u32 tid, struct task_struct *prev)
{
	struct start *s;
	struct hist *h;
	struct config *c;
	__u64 delta, key, us, *n;
	__u32 slot, zero = 0;
	bool batch;

	s = bpf_map_lookup_elem(&starts, &tid);
	if (!s || !s->ts)
		return;
	delta = bpf_ktime_get_ns() - s->ts;
	key = s->key;
	s->ts = 0; // counted; the entry stays for the next wakeup
	if ((__s64)delta < 0)
		return;
	h = bpf_map_lookup_elem(&hists, &key);
	if (!h)
		return;
	us = delta / 1000;
	slot = us ? log2_u64(us) : 0;
	if (slot >= NUM_BUCKETS)
		slot = NUM_BUCKETS - 1;
	// Several CPUs may switch in tasks of the same pod at once.
	__sync_fetch_and_add(&h->buckets[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, delta);
	// After the histogram: a reader that sees the count move finds the
	// delay in the histogram (see ../probe.go, SlowEvents). Slow delays are
	// rare, so one shared counter's atomic add is cheap.
	c = bpf_map_lookup_elem(&cfg, &zero);
	if (c && c->slow_ns && delta >= c->slow_ns) {
		batch = !prev || batch_task(prev);
		if (batch)
			__sync_fetch_and_add(&h->batch, 1);
		else if (c->batch_only)
			return;
		n = bpf_map_lookup_elem(&slow, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
#ifndef RUNQLAT_NO_RINGBUF
		// After the count, so the woken reader sees it moved.
		if (bpf_map_lookup_elem(&armed, &zero) && !bpf_map_delete_elem(&armed, &zero)) {
			struct slow_event e = {.key = key, .delay_ns = delta};

			bpf_ringbuf_output(&events, &e, sizeof(e), 0);
		}
#endif
	}
}

// ---- BTF-typed raw tracepoints ----

struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

static __always_inline __u64 task_cgid(struct task_struct *p)
{
	// Direct loads (not bpf_probe_read): tp_btf arguments are typed, the
	// verifier turns these into fault-tolerant loads, cheaper than helpers.
	return p->cgroups->dfl_cgrp->kn->id;
}

static __always_inline long task_state(struct task_struct *p)
{
	if (bpf_core_field_exists(p->__state))
		return p->__state;
	return ((struct task_struct___pre514 *)p)->state;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(tp_btf_sched_wakeup, struct task_struct *p)
{
	enqueue(p->pid, task_cgid(p));
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(tp_btf_sched_wakeup_new, struct task_struct *p)
{
	forget(p->pid);
	enqueue(p->pid, task_cgid(p));
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(tp_btf_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	// A task switched out while still runnable waits in the run queue from
	// now on (bcc's runqlat does the same).
	if (preempt || task_state(prev) == TASK_RUNNING)
		enqueue(prev->pid, task_cgid(prev));
	dequeue(next->pid, prev);
	return 0;
}

// ---- classic tracepoints ----
// Contexts as in /sys/kernel/tracing/events/sched/*/format.

struct tp_sched_switch {
	__u64 common;
	char prev_comm[16];
	pid_t prev_pid;
	int prev_prio;
	long prev_state;
	char next_comm[16];
	pid_t next_pid;
	int next_prio;
};

struct tp_sched_wakeup {
	__u64 common;
	char comm[16];
	pid_t pid;
	int prio;
	int target_cpu;
};

SEC("tracepoint/sched/sched_wakeup")
int tp_sched_wakeup(struct tp_sched_wakeup *ctx)
{
	__u32 tid = ctx->pid;
	__u64 *cgid = bpf_map_lookup_elem(&tidcg, &tid);

	if (cgid)
		enqueue(tid, *cgid);
	return 0;
}

SEC("tracepoint/sched/sched_wakeup_new")
int tp_sched_wakeup_new(struct tp_sched_wakeup *ctx)
{
	// current is the parent here; the child starts in its cgroup (unless
	// created with CLONE_INTO_CGROUP, which this misses for its first run).
	__u64 cgid = bpf_get_current_cgroup_id();
	__u32 tid = ctx->pid;
	__u64 *key = bpf_map_lookup_elem(&watched, &cgid);

	forget(tid);
	if (!key || !tid)
		return 0;
	bpf_map_update_elem(&tidcg, &tid, &cgid, BPF_ANY);
	enqueue_key(tid, *key);
	return 0;
}

SEC("tracepoint/sched/sched_switch")
int tp_sched_switch(struct tp_sched_switch *ctx)
{
	// The tracepoint fires before the switch: current is still prev.
	__u64 cgid = bpf_get_current_cgroup_id();
	__u32 prev = ctx->prev_pid;
	long state = ctx->prev_state;
	__u64 *known, *key;

	if (prev) {
		key = bpf_map_lookup_elem(&watched, &cgid);
		known = bpf_map_lookup_elem(&tidcg, &prev);
		if (key) {
			if (!known || *known != cgid)
				bpf_map_update_elem(&tidcg, &prev, &cgid, BPF_ANY);
			if (state == TASK_RUNNING || state == TASK_REPORT_MAX)
				enqueue_key(prev, *key);
		} else if (known) {
			// Moved out of a watched cgroup (or a reused tid).
			bpf_map_delete_elem(&tidcg, &prev);
		}
	}
	dequeue(ctx->next_pid, NULL);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

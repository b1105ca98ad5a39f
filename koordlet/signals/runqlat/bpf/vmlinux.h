/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Trimmed vmlinux.h: only the kernel types runqlat.c touches, copied from
 *
 *     bpftool btf dump file /sys/kernel/btf/vmlinux format c
 *
 * on Linux 6.18 (see ../gen.go). The full dump is 2.8 MB and depends on the
 * kernel it was taken from; these few types are all CO-RE relocated
 * (preserve_access_index), so their offsets here are only defaults: at load
 * time they are rewritten from the running kernel's BTF. Fields are listed by
 * name, never by position, so nothing else of the structs is needed. Add a
 * type here (from a fresh dump) before using it in runqlat.c.
 */
#ifndef __VMLINUX_H__
#define __VMLINUX_H__

typedef signed char __s8;
typedef unsigned char __u8;
typedef short int __s16;
typedef short unsigned int __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long int __s64;
typedef long long unsigned int __u64;
typedef __s8 s8;
typedef __u8 u8;
typedef __s16 s16;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
typedef int pid_t;

enum {
	false = 0,
	true = 1,
};

/* include/uapi/linux/bpf.h: stable ABI values. */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#ifndef BPF_NO_PRESERVE_ACCESS_INDEX
#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)
#endif

struct kernfs_node {
	u64 id;
};

struct cgroup {
	struct kernfs_node *kn;
};

struct css_set {
	struct cgroup *dfl_cgrp;
};

struct task_group {
	int idle;
	struct task_group *parent;
};

struct task_struct {
	unsigned int __state;
	pid_t pid;
	unsigned int policy;
	struct task_group *sched_task_group;
	struct css_set *cgroups;
};

#ifndef BPF_NO_PRESERVE_ACCESS_INDEX
#pragma clang attribute pop
#endif

#endif /* __VMLINUX_H__ */

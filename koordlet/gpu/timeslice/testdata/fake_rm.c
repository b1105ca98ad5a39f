/*
 * A fake of the NVIDIA kernel module's resource-manager ioctls, for the time-slice
 * shim's tests: preloaded after the shim (LD_PRELOAD=shim:fake), so that the shim's
 * next ioctl is this one. It answers type 'F' ioctls of the numbers the shim knows,
 * on any descriptor, and hands every other ioctl to the C library.
 *
 *   - NV_ESC_CHECK_VERSION_STR: QUERY answers FAKE_RM_VERSION (default 580.142);
 *     "!fail": the ioctl fails with EINVAL; "" (set, empty): recognised with an empty
 *     string, as a driver older than 530.30.02 answers.
 *   - RM alloc (both layouts): a handle is given where none was asked; a channel group
 *     (class 0xa06c) is recorded with the default slice, 1024 us, and its status is
 *     FAKE_RM_ALLOC_STATUS (hex, default 0).
 *   - RM control SET_TIMESLICE on a recorded group: status FAKE_RM_SET_STATUS (hex,
 *     default 0); the value is kept unless FAKE_RM_FIRMWARE says otherwise:
 *     "ignore" (accepted, not kept), "clamp:<us>" (kept, but read back no lower than
 *     <us>). On an unknown group: NV_ERR_INVALID_OBJECT_HANDLE.
 *   - RM control GET_TIMESLICE: the kept value; FAKE_RM_GET_ERRNO (decimal) makes the
 *     ioctl fail with that errno instead (a sandbox that refuses the control).
 *   - every other RM control, and RM free: status 0.
 * Each of these is logged as one line to FAKE_RM_LOG: what the fake saw (the request
 * word, the block's fields and, for the time-slice controls, the value).
 *
 * FAKE_RM_ALLOC_AT_LOAD=1: when loaded, allocate one channel group through the
 * process's ioctl (the shim's, when it is preloaded first), as a CUDA context would:
 * for dry runs of scripts whose programs never reach a GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../shim/nvrm_abi.h"

#define NV_ERR_INVALID_OBJECT_HANDLE 0x33u
#define DEFAULT_SLICE_US 1024u
#define MAX_GROUPS 4096

typedef int (*ioctl_fn)(int, unsigned long, ...);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct group {
	uint32_t client, object;
	uint64_t slice;
} groups[MAX_GROUPS];
static int ngroups;
static uint32_t next_handle = 0xcaf00000u;

static uint32_t env_hex(const char *name)
{
	const char *s = getenv(name);
	return s ? (uint32_t)strtoul(s, NULL, 16) : 0;
}

static void logf_(const char *fmt, ...)
{
	const char *path = getenv("FAKE_RM_LOG");
	if (!path)
		return;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	ssize_t w = write(fd, buf, (size_t)n);
	(void)w;
	close(fd);
}

static struct group *find(uint32_t client, uint32_t object)
{
	for (int i = 0; i < ngroups; i++)
		if (groups[i].client == client && groups[i].object == object)
			return &groups[i];
	return NULL;
}

static int version(unsigned long req, struct tsg_rm_api_version *v, const char *via)
{
	const char *want = getenv("FAKE_RM_VERSION");
	if (!want)
		want = "580.142";
	logf_("req=0x%lx via=%s nr=0x%x size=%u vcmd=0x%x", req, via, TSG_NV_ESC_CHECK_VERSION_STR,
	      (unsigned)sizeof *v, v->cmd);
	if (strcmp(want, "!fail") == 0) {
		errno = EINVAL;
		return -1;
	}
	v->reply = TSG_RM_API_VERSION_REPLY_RECOGNIZED;
	if (v->cmd == TSG_RM_API_VERSION_CMD_QUERY) {
		memset(v->version, 0, sizeof v->version);
		strncpy(v->version, want, sizeof v->version - 1);
	}
	return 0;
}

static int alloc(unsigned long req, void *block, unsigned size, const char *via)
{
	struct tsg_rm_alloc21 *a = block;
	uint32_t *status = size == sizeof(struct tsg_rm_alloc21) ? &a->status
								  : &((struct tsg_rm_alloc64 *)block)->status;
	pthread_mutex_lock(&mu);
	if (a->h_new == 0)
		a->h_new = next_handle++;
	*status = 0;
	if (a->h_class == TSG_CLASS_KEPLER_CHANNEL_GROUP_A) {
		*status = env_hex("FAKE_RM_ALLOC_STATUS");
		if (*status == 0 && ngroups < MAX_GROUPS)
			groups[ngroups++] = (struct group){a->h_root, a->h_new, DEFAULT_SLICE_US};
	}
	pthread_mutex_unlock(&mu);
	logf_("req=0x%lx via=%s nr=0x%x size=%u class=0x%x client=0x%08x object=0x%08x status=0x%x", req, via,
	      TSG_NV_ESC_RM_ALLOC, size, a->h_class, a->h_root, a->h_new, *status);
	return 0;
}

static int control(unsigned long req, struct tsg_rm_control *c, const char *via)
{
	int timeslice = c->cmd == TSG_CTRL_CMD_SET_TIMESLICE || c->cmd == TSG_CTRL_CMD_GET_TIMESLICE;
	int plain = c->params_size == sizeof(struct tsg_timeslice_params) && c->params != 0 &&
		    (c->flags & TSG_NVOS54_FLAGS_FINN_SERIALIZED) == 0;
	struct tsg_timeslice_params *p = (struct tsg_timeslice_params *)(uintptr_t)c->params;
	unsigned long long seen = timeslice && plain ? (unsigned long long)p->timeslice_us : 0;
	const char *fw = getenv("FAKE_RM_FIRMWARE");
	int rc = 0;
	c->status = 0;
	if (timeslice && plain) {
		pthread_mutex_lock(&mu);
		struct group *g = find(c->h_client, c->h_object);
		if (g == NULL) {
			c->status = NV_ERR_INVALID_OBJECT_HANDLE;
		} else if (c->cmd == TSG_CTRL_CMD_SET_TIMESLICE) {
			c->status = env_hex("FAKE_RM_SET_STATUS");
			if (c->status == 0 && !(fw && strcmp(fw, "ignore") == 0))
				g->slice = p->timeslice_us;
		} else if (getenv("FAKE_RM_GET_ERRNO")) {
			rc = -1;
		} else {
			uint64_t v = g->slice;
			if (fw && strncmp(fw, "clamp:", 6) == 0) {
				uint64_t floor = strtoull(fw + 6, NULL, 10);
				if (v < floor)
					v = floor;
			}
			p->timeslice_us = v;
		}
		pthread_mutex_unlock(&mu);
	}
	logf_("req=0x%lx via=%s nr=0x%x size=%u cmd=0x%x client=0x%08x object=0x%08x flags=0x%x psize=%u "
	      "value=%llu status=0x%x rc=%d",
	      req, via, TSG_NV_ESC_RM_CONTROL, (unsigned)sizeof *c, c->cmd, c->h_client, c->h_object, c->flags,
	      c->params_size, seen, c->status, rc);
	if (rc != 0) {
		errno = atoi(getenv("FAKE_RM_GET_ERRNO"));
		return -1;
	}
	return 0;
}

static int fake_rm(unsigned long req, void *arg, int *handled)
{
	unsigned nr = TSG_IOC_NR(req), size = TSG_IOC_SIZE(req);
	void *block = arg;
	const char *via = "direct";
	*handled = 1;
	if (nr == TSG_NV_ESC_IOCTL_XFER_CMD && size == sizeof(struct tsg_xfer)) {
		struct tsg_xfer *x = arg;
		nr = x->cmd;
		size = x->size;
		block = (void *)(uintptr_t)x->ptr;
		via = "xfer";
	}
	if (nr == TSG_NV_ESC_CHECK_VERSION_STR && size == sizeof(struct tsg_rm_api_version))
		return version(req, block, via);
	if (nr == TSG_NV_ESC_RM_ALLOC && (size == sizeof(struct tsg_rm_alloc21) || size == sizeof(struct tsg_rm_alloc64)))
		return alloc(req, block, size, via);
	if (nr == TSG_NV_ESC_RM_CONTROL && size == sizeof(struct tsg_rm_control))
		return control(req, block, via);
	if (nr == TSG_NV_ESC_RM_FREE) {
		logf_("req=0x%lx via=%s nr=0x%x size=%u", req, via, nr, size);
		return 0;
	}
	*handled = 0;
	return 0;
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (TSG_IOC_TYPE(req) == (unsigned)TSG_NV_IOCTL_MAGIC && arg != NULL) {
		int handled;
		int rc = fake_rm(req, arg, &handled);
		if (handled)
			return rc;
	}
	ioctl_fn next = (ioctl_fn)dlsym(RTLD_NEXT, "ioctl");
	if (next)
		return next(fd, req, arg);
	return (int)syscall(SYS_ioctl, fd, req, arg);
}

__attribute__((constructor)) static void fake_load(void)
{
	const char *at = getenv("FAKE_RM_ALLOC_AT_LOAD");
	if (!at || strcmp(at, "1") != 0)
		return;
	ioctl_fn first = (ioctl_fn)dlsym(RTLD_DEFAULT, "ioctl");
	if (!first)
		return;
	struct tsg_rm_alloc21 a;
	memset(&a, 0, sizeof a);
	a.h_root = 0xc1d00001u;
	a.h_parent = 0xc1d00002u;
	a.h_class = TSG_CLASS_KEPLER_CHANNEL_GROUP_A;
	int err = errno;
	first(-1, TSG_IOWR(TSG_NV_IOCTL_MAGIC, TSG_NV_ESC_RM_ALLOC, sizeof a), &a);
	errno = err;
}

/*
 * Drives the time-slice shim over the fake driver (fake_rm.c) as a CUDA context
 * would, and prints what the application saw, one "app" line per call:
 *
 *   tsgtest [-64] [-xfer] [-set US] [-serialized] [-threads N -allocs M]
 *
 * It allocates a client and a device (classes the shim ignores), then channel groups
 * (NVOS21, or NVOS64 with -64; through the size indirection with -xfer; M in each of
 * N threads with -threads), then, with -set, its own SET_TIMESLICE on the first group
 * (flagged serialized with -serialized), GET_TIMESLICE, a control the shim ignores,
 * and two ioctls of other drivers. errno is set to 777 before the calls that succeed:
 * the shim must leave it so. The descriptor is /dev/null: the shim must not care.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "../shim/nvrm_abi.h"

#define NV01_ROOT_CLIENT 0x41u
#define NV01_DEVICE_0 0x80u
#define SENTINEL_ERRNO 777

static int fd;
static int use64, usexfer;
static const uint32_t client = 0xc1d00001u, device = 0xc1d00002u;

static int rm(unsigned nr, void *block, unsigned size)
{
	if (usexfer) {
		struct tsg_xfer x = {nr, size, (uint64_t)(uintptr_t)block};
		return ioctl(fd, TSG_IOWR(TSG_NV_IOCTL_MAGIC, TSG_NV_ESC_IOCTL_XFER_CMD, sizeof x), &x);
	}
	return ioctl(fd, TSG_IOWR(TSG_NV_IOCTL_MAGIC, nr, size), block);
}

/* alloc returns the new handle; status gets RM's status. */
static uint32_t alloc(uint32_t parent, uint32_t cls, uint32_t *status, int *rc)
{
	if (use64) {
		struct tsg_rm_alloc64 a;
		memset(&a, 0, sizeof a);
		a.h_root = client;
		a.h_parent = parent;
		a.h_class = cls;
		*rc = rm(TSG_NV_ESC_RM_ALLOC, &a, sizeof a);
		*status = a.status;
		return a.h_new;
	}
	struct tsg_rm_alloc21 a;
	memset(&a, 0, sizeof a);
	a.h_root = client;
	a.h_parent = parent;
	a.h_class = cls;
	*rc = rm(TSG_NV_ESC_RM_ALLOC, &a, sizeof a);
	*status = a.status;
	return a.h_new;
}

static int control(uint32_t object, uint32_t cmd, uint32_t flags, uint64_t *value, uint32_t *status)
{
	struct tsg_timeslice_params p = {*value};
	struct tsg_rm_control c;
	memset(&c, 0, sizeof c);
	c.h_client = client;
	c.h_object = object;
	c.cmd = cmd;
	c.flags = flags;
	c.params = (uint64_t)(uintptr_t)&p;
	c.params_size = sizeof p;
	int rc = rm(TSG_NV_ESC_RM_CONTROL, &c, sizeof c);
	*status = c.status;
	*value = p.timeslice_us;
	return rc;
}

static int allocs = 1;

static void *alloc_groups(void *out)
{
	for (int i = 0; i < allocs; i++) {
		uint32_t status;
		int rc;
		errno = SENTINEL_ERRNO;
		uint32_t h = alloc(device, TSG_CLASS_KEPLER_CHANNEL_GROUP_A, &status, &rc);
		int err = errno;
		if (i == 0 && out != NULL)
			*(uint32_t *)out = h;
		printf("app call=alloc rc=%d errno=%d status=0x%x object=0x%08x\n", rc, err, status, h);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long set = -1;
	int serialized = 0, threads = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-64") == 0)
			use64 = 1;
		else if (strcmp(argv[i], "-xfer") == 0)
			usexfer = 1;
		else if (strcmp(argv[i], "-serialized") == 0)
			serialized = 1;
		else if (strcmp(argv[i], "-set") == 0 && i + 1 < argc)
			set = atol(argv[++i]);
		else if (strcmp(argv[i], "-threads") == 0 && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (strcmp(argv[i], "-allocs") == 0 && i + 1 < argc)
			allocs = atoi(argv[++i]);
		else {
			fprintf(stderr, "tsgtest: unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror("open /dev/null");
		return 1;
	}

	uint32_t status;
	int rc;
	alloc(0, NV01_ROOT_CLIENT, &status, &rc);
	printf("app call=alloc-client rc=%d status=0x%x\n", rc, status);
	alloc(client, NV01_DEVICE_0, &status, &rc);
	printf("app call=alloc-device rc=%d status=0x%x\n", rc, status);

	uint32_t tsg = 0;
	if (threads > 0) {
		pthread_t t[64];
		if (threads > 64)
			threads = 64;
		for (int i = 0; i < threads; i++)
			pthread_create(&t[i], NULL, alloc_groups, i == 0 ? &tsg : NULL);
		for (int i = 0; i < threads; i++)
			pthread_join(t[i], NULL);
	} else {
		alloc_groups(&tsg);
	}

	if (set >= 0) {
		uint64_t v = (uint64_t)set;
		errno = SENTINEL_ERRNO;
		rc = control(tsg, TSG_CTRL_CMD_SET_TIMESLICE, serialized ? TSG_NVOS54_FLAGS_FINN_SERIALIZED : 0, &v,
			     &status);
		printf("app call=set rc=%d errno=%d status=0x%x params=%llu\n", rc, errno, status,
		       (unsigned long long)v);
	}
	uint64_t v = 0;
	rc = control(tsg, TSG_CTRL_CMD_GET_TIMESLICE, 0, &v, &status);
	printf("app call=get rc=%d status=0x%x value=%llu\n", rc, status, (unsigned long long)v);

	v = 0;
	rc = control(device, 0x20800101u, 0, &v, &status);
	printf("app call=other-control rc=%d status=0x%x\n", rc, status);

	int pipefd[2];
	if (pipe(pipefd) != 0) {
		perror("pipe");
		return 1;
	}
	if (write(pipefd[1], "abc", 3) != 3)
		return 1;
	int avail = -1;
	errno = SENTINEL_ERRNO;
	rc = ioctl(pipefd[0], FIONREAD, &avail);
	printf("app call=fionread rc=%d errno=%d avail=%d\n", rc, errno, avail);
	struct termios tio;
	errno = 0;
	rc = ioctl(fd, TCGETS, &tio);
	printf("app call=tcgets rc=%d errno=%d\n", rc, errno);
	return 0;
}

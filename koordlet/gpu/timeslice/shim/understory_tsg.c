/*
 * libunderstory-tsg.so: gives every GPU context of a process the time slice the agent
 * chose, with no change to the application (docs/gpu.md, "Per-context time slices").
 *
 * Loaded with LD_PRELOAD, it wraps ioctl (glibc's only exported spelling on x86_64 and
 * aarch64; 32-bit builds with 64-bit time_t call __ioctl_time64, not wrapped here) and
 * looks only at the NVIDIA driver's resource-manager ioctls, recognised by type 'F'
 * and their numbers and sizes, directly or through the driver's size indirection
 * (NV_ESC_IOCTL_XFER_CMD), on whatever file descriptor:
 *
 *   - after a successful allocation of a channel group (TSG, class 0xa06c) it sets the
 *     group's slice (SET_TIMESLICE) to the configured value on the same descriptor,
 *     reads it back (GET_TIMESLICE) and reports both;
 *   - an application's own SET_TIMESLICE goes to the driver with the configured value
 *     instead of its own; the application's parameter block is not written, and the
 *     report says what it asked;
 *   - every other ioctl goes through unchanged, and nothing is ever refused.
 *
 * Environment, read once when the library loads:
 *   UNDERSTORY_TSG_TIMESLICE_US      the slice in microseconds (1..100000000); absent:
 *                                    the shim changes nothing and only reports; not a
 *                                    plain decimal in range: likewise ("badconfig")
 *   UNDERSTORY_TSG_REPORT            the report file, or a directory where each process
 *                                    writes tsg-<pid>.log; absent: no report
 *   UNDERSTORY_TSG_REPORT_MAX_BYTES  a report file's bound (default 1 MiB): a line that
 *                                    would pass it is dropped
 *
 * The driver: before it issues or rewrites anything, the shim asks the kernel module
 * its version once per process (NV_ESC_CHECK_VERSION_STR with the QUERY command on
 * the descriptor of the allocation, which can only be the control device). A branch
 * outside TSG_SUPPORTED_BRANCHES, a failed or empty answer: nothing is changed and
 * each event reports "unsupported".
 *
 * Report: one line per event, appended with one write(2) to a file opened with
 * O_APPEND for that line:
 *   tsg/1 t=<unix ns> pid=<pid> ev=<alloc|app-set> mode=<set|report|badconfig|
 *   unsupported|skip> drv=<version|-> client=0x<8 hex> object=0x<8 hex> asked=<us|->
 *   app=<us|-> rc=<errno|-> status=0x<hex>|- rb=<us|-> rbrc=<errno|-> rbstatus=0x<hex>|-
 * koordlet/gpu/timeslice parses it. The report is the tenant's word: the agent never
 * takes it alone as confirmation (docs/gpu.md).
 *
 * The ioctl path allocates no memory and keeps errno as the application's call left
 * it. Shared state is written once at load (configuration) or once per process
 * (the driver's verdict, published with a compare-and-swap).
 *
 * glibc: the library is preloaded into the tenant's programs, whose glibc may be older
 * than the build host's, and a preloaded library that needs a newer symbol version
 * stops the program at start. So it binds only versions of glibc 2.17 or older (the
 * tests check every one): dlsym at its first version (glibc 2.34 moved it from libdl
 * to libc under a new one and kept the old in both; the build links libdl.so.2 with
 * --no-as-needed for the glibc that still has it there), and no stat or fstat (2.33
 * gave them new versions): open with O_DIRECTORY and the fstat system call instead.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "nvrm_abi.h"

#if defined(__x86_64__)
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver dlsym,dlsym@GLIBC_2.17");
#endif

#define TSG_ENV_TIMESLICE "UNDERSTORY_TSG_TIMESLICE_US"
#define TSG_ENV_REPORT "UNDERSTORY_TSG_REPORT"
#define TSG_ENV_REPORT_MAX "UNDERSTORY_TSG_REPORT_MAX_BYTES"
#define TSG_MAX_SLICE_US 100000000ull
#define TSG_DEFAULT_REPORT_MAX (1ull << 20)
#define TSG_MOST_REPORT_MAX (1ull << 40)
#define TSG_REPORT_VERSION "tsg/1"
#define TSG_LINE_BYTES 512
#define TSG_PATH_BYTES 4096

enum { CFG_ABSENT, CFG_SET, CFG_BAD };
enum { DRV_UNKNOWN, DRV_PUBLISHING, DRV_SUPPORTED, DRV_UNSUPPORTED };

typedef int (*ioctl_fn)(int, unsigned long, ...);

static ioctl_fn next_ioctl;
static int loaded;
static int cfg_state;
static uint64_t cfg_slice_us;
static char report_path[TSG_PATH_BYTES];
static int report_is_dir;
static uint64_t report_max = TSG_DEFAULT_REPORT_MAX;
static int drv_state;
static char drv_version[TSG_RM_API_VERSION_STRING_LENGTH];

/* parse_u64 reads a plain decimal in 1..most. */
static int parse_u64(const char *s, uint64_t most, uint64_t *out)
{
	uint64_t v = 0;
	if (s == NULL || *s == '\0')
		return 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return 0;
		if (v > (most - (uint64_t)(*s - '0')) / 10)
			return 0;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	if (v == 0)
		return 0;
	*out = v;
	return 1;
}

static void load_config(void)
{
	if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
		return;
	ioctl_fn f = (ioctl_fn)dlsym(RTLD_NEXT, "ioctl");
	const char *slice = getenv(TSG_ENV_TIMESLICE);
	uint64_t v;
	if (slice == NULL) {
		cfg_state = CFG_ABSENT;
	} else if (parse_u64(slice, TSG_MAX_SLICE_US, &v)) {
		cfg_slice_us = v;
		cfg_state = CFG_SET;
	} else {
		cfg_state = CFG_BAD;
	}
	const char *path = getenv(TSG_ENV_REPORT);
	if (path != NULL && path[0] != '\0' && strlen(path) < TSG_PATH_BYTES - 40) {
		strcpy(report_path, path);
		int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		report_is_dir = dfd >= 0;
		if (dfd >= 0)
			close(dfd);
	}
	if (parse_u64(getenv(TSG_ENV_REPORT_MAX), TSG_MOST_REPORT_MAX, &v))
		report_max = v;
	__atomic_store_n(&next_ioctl, f, __ATOMIC_RELEASE);
	__atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void tsg_load(void)
{
	load_config();
}

static int call_next(int fd, unsigned long req, void *arg)
{
	ioctl_fn f = __atomic_load_n(&next_ioctl, __ATOMIC_ACQUIRE);
	if (f != NULL)
		return f(fd, req, arg);
	return (int)syscall(SYS_ioctl, fd, req, arg);
}

/* The driver's version and verdict. */

static int branch_supported(const char *v)
{
	static const unsigned branches[] = {TSG_SUPPORTED_BRANCHES};
	unsigned major = 0;
	int digits = 0;
	for (; *v >= '0' && *v <= '9' && digits < 6; v++, digits++)
		major = major * 10 + (unsigned)(*v - '0');
	if (digits == 0 || *v != '.')
		return 0;
	for (size_t i = 0; i < sizeof branches / sizeof branches[0]; i++)
		if (branches[i] == major)
			return 1;
	return 0;
}

/* query_driver asks the kernel module its version on fd; ver gets it, sanitised to
 * [0-9A-Za-z._-], or "-" when the module did not answer with one. */
static int query_driver(int fd, char ver[TSG_RM_API_VERSION_STRING_LENGTH])
{
	struct tsg_rm_api_version q;
	memset(&q, 0, sizeof q);
	q.cmd = TSG_RM_API_VERSION_CMD_QUERY;
	strcpy(ver, "-");
	if (call_next(fd, TSG_IOWR(TSG_NV_IOCTL_MAGIC, TSG_NV_ESC_CHECK_VERSION_STR, sizeof q), &q) != 0 ||
	    q.reply != TSG_RM_API_VERSION_REPLY_RECOGNIZED || q.version[0] == '\0')
		return 0;
	size_t i = 0;
	for (; i < TSG_RM_API_VERSION_STRING_LENGTH - 1 && q.version[i] != '\0'; i++) {
		char c = q.version[i];
		int ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			 c == '.' || c == '_' || c == '-';
		ver[i] = ok ? c : '_';
	}
	ver[i] = '\0';
	return branch_supported(ver);
}

/* driver_check returns whether the driver is supported, asking it once per process:
 * the first answer is published; a thread that finds another publishing asks itself. */
static int driver_check(int fd, char ver[TSG_RM_API_VERSION_STRING_LENGTH])
{
	int s = __atomic_load_n(&drv_state, __ATOMIC_ACQUIRE);
	if (s == DRV_SUPPORTED || s == DRV_UNSUPPORTED) {
		memcpy(ver, drv_version, TSG_RM_API_VERSION_STRING_LENGTH);
		return s == DRV_SUPPORTED;
	}
	int ok = query_driver(fd, ver);
	int expect = DRV_UNKNOWN;
	if (__atomic_compare_exchange_n(&drv_state, &expect, DRV_PUBLISHING, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		memcpy(drv_version, ver, TSG_RM_API_VERSION_STRING_LENGTH);
		__atomic_store_n(&drv_state, ok ? DRV_SUPPORTED : DRV_UNSUPPORTED, __ATOMIC_RELEASE);
	}
	return ok;
}

/* One event and its report line. */

struct call_result {
	int done;        /* the call was made */
	int err;         /* its errno, 0 when the ioctl returned 0 */
	uint32_t status; /* RM's status when err is 0 */
	uint64_t value;  /* GET: the slice read back */
};

struct tsg_event {
	const char *ev;
	const char *mode;
	char drv[TSG_RM_API_VERSION_STRING_LENGTH];
	uint32_t client, object;
	int has_asked, has_app;
	uint64_t asked, app;
	struct call_result set, rb;
};

struct line {
	char buf[TSG_LINE_BYTES];
	size_t n;
};

static void put_str(struct line *l, const char *s)
{
	while (*s && l->n < sizeof l->buf - 1)
		l->buf[l->n++] = *s++;
}

static void put_u64(struct line *l, uint64_t v)
{
	char tmp[24];
	int i = 0;
	do {
		tmp[i++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (i > 0 && l->n < sizeof l->buf - 1)
		l->buf[l->n++] = tmp[--i];
}

static void put_hex(struct line *l, uint32_t v, int width)
{
	static const char digits[] = "0123456789abcdef";
	char tmp[8];
	int i = 0;
	do {
		tmp[i++] = digits[v & 0xf];
		v >>= 4;
	} while (v && i < 8);
	while (i < width)
		tmp[i++] = '0';
	put_str(l, "0x");
	while (i > 0 && l->n < sizeof l->buf - 1)
		l->buf[l->n++] = tmp[--i];
}

static void put_opt(struct line *l, const char *key, int has, uint64_t v)
{
	put_str(l, key);
	if (has)
		put_u64(l, v);
	else
		put_str(l, "-");
}

static void put_result(struct line *l, const char *rc, const char *status, const struct call_result *r)
{
	put_opt(l, rc, r->done, (uint64_t)r->err);
	put_str(l, status);
	if (r->done && r->err == 0)
		put_hex(l, r->status, 1);
	else
		put_str(l, "-");
}

static void format_event(struct line *l, const struct tsg_event *e)
{
	struct timespec ts;
	uint64_t ns = 0;
	if (clock_gettime(CLOCK_REALTIME, &ts) == 0 && ts.tv_sec >= 0)
		ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	l->n = 0;
	put_str(l, TSG_REPORT_VERSION " t=");
	put_u64(l, ns);
	put_str(l, " pid=");
	put_u64(l, (uint64_t)getpid());
	put_str(l, " ev=");
	put_str(l, e->ev);
	put_str(l, " mode=");
	put_str(l, e->mode);
	put_str(l, " drv=");
	put_str(l, e->drv[0] ? e->drv : "-");
	put_str(l, " client=");
	put_hex(l, e->client, 8);
	put_str(l, " object=");
	put_hex(l, e->object, 8);
	put_opt(l, " asked=", e->has_asked, e->asked);
	put_opt(l, " app=", e->has_app, e->app);
	put_result(l, " rc=", " status=", &e->set);
	put_opt(l, " rb=", e->rb.done && e->rb.err == 0 && e->rb.status == TSG_NV_OK, e->rb.value);
	put_result(l, " rbrc=", " rbstatus=", &e->rb);
	l->buf[l->n++] = '\n';
}

static void report(const struct tsg_event *e)
{
	if (report_path[0] == '\0')
		return;
	struct line l;
	format_event(&l, e);
	char path[TSG_PATH_BYTES];
	size_t n = strlen(report_path);
	memcpy(path, report_path, n + 1);
	if (report_is_dir) {
		struct line name;
		name.n = 0;
		put_str(&name, "/tsg-");
		put_u64(&name, (uint64_t)getpid());
		put_str(&name, ".log");
		memcpy(path + n, name.buf, name.n);
		path[n + name.n] = '\0';
	}
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return;
	struct stat st; /* the kernel's layout on x86_64 and aarch64 */
	if (syscall(SYS_fstat, fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size + l.n <= report_max) {
		ssize_t w = write(fd, l.buf, l.n);
		(void)w;
	}
	close(fd);
}

/* The driver calls the shim makes itself. */

/* rm_control issues a time-slice control on the group; value is its parameter in and
 * out. It returns the ioctl's errno, 0 when the ioctl returned 0. */
static int rm_control(int fd, uint32_t client, uint32_t object, uint32_t cmd, uint64_t *value, uint32_t *status)
{
	struct tsg_timeslice_params p = {*value};
	struct tsg_rm_control c;
	memset(&c, 0, sizeof c);
	c.h_client = client;
	c.h_object = object;
	c.cmd = cmd;
	c.params = (uint64_t)(uintptr_t)&p;
	c.params_size = sizeof p;
	*status = 0;
	if (call_next(fd, TSG_IOWR(TSG_NV_IOCTL_MAGIC, TSG_NV_ESC_RM_CONTROL, sizeof c), &c) != 0)
		return errno != 0 ? errno : EIO;
	*status = c.status;
	*value = p.timeslice_us;
	return 0;
}

static void read_back(int fd, struct tsg_event *e)
{
	uint64_t v = 0;
	e->rb.done = 1;
	e->rb.err = rm_control(fd, e->client, e->object, TSG_CTRL_CMD_GET_TIMESLICE, &v, &e->rb.status);
	e->rb.value = v;
}

/* decide sets the event's mode; it returns whether the shim acts (a value is
 * configured and the driver is supported). */
static int decide(int fd, struct tsg_event *e)
{
	if (cfg_state == CFG_ABSENT) {
		e->mode = "report";
		return 0;
	}
	if (cfg_state == CFG_BAD) {
		e->mode = "badconfig";
		return 0;
	}
	if (!driver_check(fd, e->drv)) {
		e->mode = "unsupported";
		return 0;
	}
	e->mode = "set";
	e->has_asked = 1;
	e->asked = cfg_slice_us;
	return 1;
}

static void after_alloc(int fd, const void *block, unsigned size)
{
	const struct tsg_rm_alloc21 *a = block;
	uint32_t status = size == sizeof(struct tsg_rm_alloc21) ? a->status
								 : ((const struct tsg_rm_alloc64 *)block)->status;
	if (status != TSG_NV_OK || a->h_class != TSG_CLASS_KEPLER_CHANNEL_GROUP_A)
		return;
	struct tsg_event e;
	memset(&e, 0, sizeof e);
	e.ev = "alloc";
	e.client = a->h_root;
	e.object = a->h_new;
	if (decide(fd, &e)) {
		uint64_t v = cfg_slice_us;
		e.set.done = 1;
		e.set.err = rm_control(fd, e.client, e.object, TSG_CTRL_CMD_SET_TIMESLICE, &v, &e.set.status);
		read_back(fd, &e);
	}
	report(&e);
}

/* app_set handles the application's own SET_TIMESLICE (c, reached through x when it
 * came through the size indirection). */
static int app_set(int fd, unsigned long req, void *arg, struct tsg_xfer *x, struct tsg_rm_control *c)
{
	struct tsg_event e;
	memset(&e, 0, sizeof e);
	e.ev = "app-set";
	e.client = c->h_client;
	e.object = c->h_object;
	int act = 0;
	if (c->params_size != sizeof(struct tsg_timeslice_params) || c->params == 0 ||
	    (c->flags & TSG_NVOS54_FLAGS_FINN_SERIALIZED) != 0) {
		e.mode = "skip";
	} else {
		e.has_app = 1;
		e.app = ((const struct tsg_timeslice_params *)(uintptr_t)c->params)->timeslice_us;
		act = decide(fd, &e);
	}
	int rc, err;
	if (act) {
		struct tsg_timeslice_params p = {cfg_slice_us};
		struct tsg_rm_control lc = *c;
		struct tsg_xfer lx;
		void *a = &lc;
		lc.params = (uint64_t)(uintptr_t)&p;
		if (x != NULL) {
			lx = *x;
			lx.ptr = (uint64_t)(uintptr_t)&lc;
			a = &lx;
		}
		rc = call_next(fd, req, a);
		err = errno;
		c->status = lc.status;
	} else {
		rc = call_next(fd, req, arg);
		err = errno;
	}
	e.set.done = 1;
	e.set.err = rc == 0 ? 0 : (err != 0 ? err : EIO);
	e.set.status = c->status;
	if (act)
		read_back(fd, &e);
	report(&e);
	errno = err;
	return rc;
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
		load_config();
	if (TSG_IOC_TYPE(req) != (unsigned)TSG_NV_IOCTL_MAGIC || arg == NULL)
		return call_next(fd, req, arg);

	unsigned nr = TSG_IOC_NR(req), size = TSG_IOC_SIZE(req);
	struct tsg_xfer *x = NULL;
	void *block = arg;
	if (nr == TSG_NV_ESC_IOCTL_XFER_CMD) {
		if (size != sizeof(struct tsg_xfer))
			return call_next(fd, req, arg);
		x = arg;
		nr = x->cmd;
		size = x->size;
		block = (void *)(uintptr_t)x->ptr;
		if (block == NULL)
			return call_next(fd, req, arg);
	}
	if (nr == TSG_NV_ESC_RM_CONTROL && size == sizeof(struct tsg_rm_control)) {
		struct tsg_rm_control *c = block;
		if (c->cmd == TSG_CTRL_CMD_SET_TIMESLICE)
			return app_set(fd, req, arg, x, c);
		return call_next(fd, req, arg);
	}
	if (nr == TSG_NV_ESC_RM_ALLOC &&
	    (size == sizeof(struct tsg_rm_alloc21) || size == sizeof(struct tsg_rm_alloc64))) {
		int rc = call_next(fd, req, arg);
		if (rc == 0) {
			int err = errno;
			after_alloc(fd, block, size);
			errno = err;
		}
		return rc;
	}
	return call_next(fd, req, arg);
}

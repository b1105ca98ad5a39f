/*
 * The part of the NVIDIA resource manager's (RM) user interface that the time-slice
 * shim touches: the ioctl numbers, the layouts of the parameter blocks it reads and
 * writes, the channel-group (TSG) class and its two time-slice controls, and the driver
 * branches it acts on. Written here from the open kernel modules' headers
 * (github.com/NVIDIA/open-gpu-kernel-modules; docs/gpu.md, "Per-context time slices"):
 * the same in every release from 535.43.02 to 595.45.04. koordlet/gpu/timeslice's Go
 * constants are checked against this file by its tests.
 */
#ifndef UNDERSTORY_NVRM_ABI_H
#define UNDERSTORY_NVRM_ABI_H

#include <stdint.h>

/* ioctl request words: direction (2 bits), size (14 bits), type (8), number (8). */
#define TSG_IOC_NRBITS 8
#define TSG_IOC_TYPEBITS 8
#define TSG_IOC_SIZEBITS 14
#define TSG_IOC_NRSHIFT 0
#define TSG_IOC_TYPESHIFT (TSG_IOC_NRSHIFT + TSG_IOC_NRBITS)
#define TSG_IOC_SIZESHIFT (TSG_IOC_TYPESHIFT + TSG_IOC_TYPEBITS)
#define TSG_IOC_DIRSHIFT (TSG_IOC_SIZESHIFT + TSG_IOC_SIZEBITS)
#define TSG_IOC_READWRITE 3u
#define TSG_IOC_NR(req) (((req) >> TSG_IOC_NRSHIFT) & 0xffu)
#define TSG_IOC_TYPE(req) (((req) >> TSG_IOC_TYPESHIFT) & 0xffu)
#define TSG_IOC_SIZE(req) (((req) >> TSG_IOC_SIZESHIFT) & 0x3fffu)
#define TSG_IOWR(type, nr, size)                                                          \
	((unsigned long)((TSG_IOC_READWRITE << TSG_IOC_DIRSHIFT) |                        \
			 ((unsigned)(size) << TSG_IOC_SIZESHIFT) |                        \
			 ((unsigned)(type) << TSG_IOC_TYPESHIFT) | ((unsigned)(nr) << TSG_IOC_NRSHIFT)))

/* The driver's ioctls: type 'F'. The kernel module dispatches on the number and the
 * size alone (it ignores the direction bits). */
#define TSG_NV_IOCTL_MAGIC 'F'
#define TSG_NV_IOCTL_BASE 200
#define TSG_NV_ESC_CHECK_VERSION_STR (TSG_NV_IOCTL_BASE + 10) /* 210 */
#define TSG_NV_ESC_IOCTL_XFER_CMD (TSG_NV_IOCTL_BASE + 11)    /* 211: number and size in the block */
#define TSG_NV_ESC_RM_FREE 0x29
#define TSG_NV_ESC_RM_CONTROL 0x2A
#define TSG_NV_ESC_RM_ALLOC 0x2B

/* The channel group (time-slice group, TSG) class: the only one from Kepler to
 * Blackwell. */
#define TSG_CLASS_KEPLER_CHANNEL_GROUP_A 0xA06Cu
#define TSG_CTRL_CMD_SET_TIMESLICE 0xA06C0103u
#define TSG_CTRL_CMD_GET_TIMESLICE 0xA06C0104u
/* A control whose parameters are serialized rather than the plain structure. */
#define TSG_NVOS54_FLAGS_FINN_SERIALIZED 0x4u

/* The version exchange on the control device. QUERY (since 530.30.02) returns the
 * kernel module's version string and checks nothing. */
#define TSG_RM_API_VERSION_CMD_QUERY '2'
#define TSG_RM_API_VERSION_REPLY_RECOGNIZED 1u
#define TSG_RM_API_VERSION_STRING_LENGTH 64

#define TSG_NV_OK 0u

/* The driver branches (major versions) whose headers were read and found to hold
 * these numbers and layouts; any other branch is unsupported. */
#define TSG_SUPPORTED_BRANCHES 535, 545, 550, 555, 560, 565, 570, 575, 580, 590, 595

/* RM alloc, the short form (NVOS21). */
struct tsg_rm_alloc21 {
	uint32_t h_root;   /* client */
	uint32_t h_parent; /* the device, for a TSG */
	uint32_t h_new;    /* in: the handle asked for, 0 for one RM picks; out: the handle */
	uint32_t h_class;
	uint64_t p_alloc_params;
	uint32_t params_size;
	uint32_t status;
};

/* RM alloc with access rights (NVOS64). */
struct tsg_rm_alloc64 {
	uint32_t h_root;
	uint32_t h_parent;
	uint32_t h_new;
	uint32_t h_class;
	uint64_t p_alloc_params;
	uint64_t p_rights_requested;
	uint32_t params_size;
	uint32_t flags;
	uint32_t status;
};

/* RM control (NVOS54). */
struct tsg_rm_control {
	uint32_t h_client;
	uint32_t h_object;
	uint32_t cmd;
	uint32_t flags;
	uint64_t params;
	uint32_t params_size;
	uint32_t status;
};

/* The indirection for blocks too large for the request word (nv_ioctl_xfer_t). */
struct tsg_xfer {
	uint32_t cmd;
	uint32_t size;
	uint64_t ptr;
};

/* The version exchange (nv_ioctl_rm_api_version_t). */
struct tsg_rm_api_version {
	uint32_t cmd;
	uint32_t reply;
	char version[TSG_RM_API_VERSION_STRING_LENGTH];
};

/* SET_TIMESLICE and GET_TIMESLICE's parameters (NVA06C_CTRL_TIMESLICE_PARAMS). */
struct tsg_timeslice_params {
	uint64_t timeslice_us;
};

_Static_assert(sizeof(struct tsg_rm_alloc21) == 32, "NVOS21 is 32 bytes");
_Static_assert(sizeof(struct tsg_rm_alloc64) == 48, "NVOS64 is 48 bytes");
_Static_assert(sizeof(struct tsg_rm_control) == 32, "NVOS54 is 32 bytes");
_Static_assert(sizeof(struct tsg_xfer) == 16, "nv_ioctl_xfer_t is 16 bytes");
_Static_assert(sizeof(struct tsg_rm_api_version) == 72, "nv_ioctl_rm_api_version_t is 72 bytes");
_Static_assert(sizeof(struct tsg_timeslice_params) == 8, "the time-slice parameters are 8 bytes");
_Static_assert(__builtin_offsetof(struct tsg_rm_alloc21, status) == 28, "NVOS21 status");
_Static_assert(__builtin_offsetof(struct tsg_rm_alloc64, status) == 40, "NVOS64 status");
_Static_assert(__builtin_offsetof(struct tsg_rm_control, params) == 16, "NVOS54 params");
_Static_assert(__builtin_offsetof(struct tsg_rm_control, status) == 28, "NVOS54 status");

#endif

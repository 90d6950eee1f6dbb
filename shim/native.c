/* SPDX-License-Identifier: MIT */
/*
 * A native program's loader, followed to its uploads, to tell the user
 * (issue 5, "which uploads are batches"; README, "The GPU data plane").
 *
 * A PyTorch-style loader's workers build each batch tensor in a
 * shared-memory object and pass it to the job by descriptor (recvmsg,
 * SCM_RIGHTS). recvmsg is interposed only to note the head of every such
 * object received (core/objseen.h): a regular file of tmpfs or hugetlbfs
 * (shm_open, memfd_create), read with pread before the program has even
 * seen the descriptor. The copy hooks hand us the job's large host-to-device
 * uploads that nothing registered as batches, and copies whose direction
 * the driver infers from the pointers (cudaMemcpyDefault, cuMemcpy); the
 * head of one is read with process_vm_readv (a bad pointer, or a device
 * pointer the host cannot read, is an error there, never a fault: one try
 * spent) and looked up. One that starts with a worker's object carries
 * that worker's batch, from its mapping or from a pinned copy: the job
 * uploads its loader's batches itself, which the shim shares only when the
 * program says what they are (tsshim_batch(): samples, tensors, loader,
 * epoch).
 * So it says that, once, and changes nothing.
 *
 * Cost: recvmsg without control data, a copy of another kind and every
 * call once the watch is over (found, given up, a tsshim_batch() call, not
 * socket mode, a Python interpreter, a forked child) cost a few loads. A
 * watch costs a pread of 4 KiB per received object and a process_vm_readv
 * of 4 KiB per large upload, for at most TS_OBJSEEN_TRIES uploads.
 * recvmmsg is followed as recvmsg is, for each message it received.
 */
#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "log.h"
#include "native.h"
#include "objseen.h"
#include "prim.h"
#include "real.h"
#include "shim.h"

#define TS_EXPORT __attribute__((visibility("default")))

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

struct ts_objseen ts_native_seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
static _Atomic int batch_api_used;

void ts_native_batch_api_used(void)
{
	atomic_store_explicit(&batch_api_used, 1, memory_order_relaxed);
}

/* Is a watch of this process worth having at all? */
static int watch_applies(void)
{
	return ts_shim_ready() && !atomic_load_explicit(&ts_is_fork_child, memory_order_relaxed) && !ts_is_python &&
	       (ts_cfg.mode == TS_MODE_SOCKET || ts_cfg.mode == TS_MODE_AUTO) &&
	       !atomic_load_explicit(&batch_api_used, memory_order_relaxed) &&
	       atomic_load_explicit(&ts_native_seen.state, memory_order_relaxed) == TS_OBJSEEN_WATCH;
}

/* A descriptor received: a shared-memory object's head, noted. */
static void note_object(int fd)
{
	struct stat sb;
	struct statfs fs;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < (off_t)TS_OBJSEEN_HEAD ||
	    fstatfs(fd, &fs) != 0 || (fs.f_type != TMPFS_MAGIC && fs.f_type != (typeof(fs.f_type))HUGETLBFS_MAGIC))
		return;
	struct ts_objseen_hasher h;
	unsigned char buf[1024];
	ts_objseen_head_begin(&h);
	for (off_t at = 0; at < (off_t)TS_OBJSEEN_HEAD;) {
		/* the raw call: our own pread hook is not for this */
		ssize_t got = syscall(SYS_pread64, fd, buf, sizeof(buf), at);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return;
		ts_objseen_head_add(&h, buf, (size_t)got);
		at += got;
	}
	uint64_t head;
	if (ts_objseen_head_end(&h, &head) == 0)
		ts_objseen_note(&ts_native_seen, head);
}

/* Control data room enough for a descriptor? (the common recv without it costs this) */
static inline int has_control(const struct msghdr *msg)
{
	return msg && msg->msg_control && msg->msg_controllen >= sizeof(struct cmsghdr);
}

static void note_received(const struct msghdr *msg)
{
	int saved = errno;
	for (const struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR((struct msghdr *)msg, (struct cmsghdr *)c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(sizeof(int)))
			continue;
		size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		const unsigned char *data = CMSG_DATA(c);
		for (size_t i = 0; i < nfd && i < 16; i++) { /* a loader passes one per tensor: a few */
			int fd;
			memcpy(&fd, data + i * sizeof(int), sizeof(fd));
			note_object(fd);
		}
	}
	errno = saved;
}

TS_REAL(ssize_t, recvmsg, (int, struct msghdr *, int));
TS_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	if (!TS_RESOLVE(recvmsg)) {
		errno = ENOSYS;
		return -1;
	}
	ssize_t r = real_recvmsg(fd, msg, flags);
	if (r < 0 || !has_control(msg) || !watch_applies())
		return r;
	if (ts_hook_enter()) {
		note_received(msg);
		ts_hook_leave();
	}
	return r;
}

/* recvmmsg: the same, for each message received. */
TS_REAL(int, recvmmsg, (int, struct mmsghdr *, unsigned int, int, struct timespec *));
TS_EXPORT int recvmmsg(int fd, struct mmsghdr *msgs, unsigned int n, int flags, struct timespec *timeout)
{
	if (!TS_RESOLVE(recvmmsg)) {
		errno = ENOSYS;
		return -1;
	}
	int r = real_recvmmsg(fd, msgs, n, flags, timeout);
	if (r <= 0 || !msgs || !watch_applies())
		return r;
	if (ts_hook_enter()) {
		for (int i = 0; i < r; i++)
			if (has_control(&msgs[i].msg_hdr))
				note_received(&msgs[i].msg_hdr);
		ts_hook_leave();
	}
	return r;
}

void ts_native_upload(const void *src, size_t n)
{
	if (!watch_applies() || n < TS_OBJSEEN_HEAD)
		return;
	int saved = errno;
	struct ts_objseen_hasher h;
	unsigned char buf[1024];
	int ok = 1;
	ts_objseen_head_begin(&h);
	for (size_t at = 0; at < TS_OBJSEEN_HEAD && ok; at += sizeof(buf)) {
		ok = ts_prim_read_own(buf, (const char *)src + at, sizeof(buf)) == 0;
		if (ok)
			ts_objseen_head_add(&h, buf, sizeof(buf));
	}
	uint64_t head;
	int first = 0;
	int st = ok && ts_objseen_head_end(&h, &head) == 0 ? ts_objseen_upload(&ts_native_seen, head, &first)
							   : ts_objseen_upload_unknown(&ts_native_seen);
	if (first)
		ts_warn("this program uploads its loader workers' batches itself (an upload starts with a shared-memory "
			"object a worker passed it): they go from the host, not shared on the GPU; a native program shares "
			"them by calling tsshim_batch() before each upload (include/tsshim.h)");
	else if (st == TS_OBJSEEN_GAVE_UP)
		ts_debug("native: no upload started with an object a worker passed (%u looked at): not looking any more",
			 TS_OBJSEEN_TRIES);
	errno = saved;
}

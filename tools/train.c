/* SPDX-License-Identifier: MIT */
/*
 * tsshim-train: the reference *unmodified* training program that tsshim
 * must serve. It is built the way a PyTorch DataLoader job is built and
 * knows nothing about tsshim (it calls nothing of it), except with --tsshim:
 * then each training batch goes through tsshim_batch() (include/tsshim.h, a
 * weak reference: NULL without the shim) right before its upload.
 *
 *   main process                         worker processes (--workers N)
 *   ------------                         ------------------------------
 *   sampler (seeded permutation)   --->  per sample: open/read the file,
 *   index lists, round robin,            libjpeg decode, crop/resize/flip,
 *   prefetch 2 per worker                normalise to float32 CHW
 *                                        collate into shared memory
 *   mmap the batch               <---    (shm_open+unlink or memfd), fd
 *   [pinning thread: copy into           passed over a unix socketpair
 *    page-locked memory]                 (SCM_RIGHTS)
 *   upload each tensor (CUDA runtime
 *   via dlopen, or a host copy),
 *   checksum, record, simulated step
 *
 * Determinism: the sample order depends on (seed, epoch) and each sample's
 * augmentation on (seed, epoch, sample index) only, so the same options
 * give the same batches, records and trained_checksum whatever --workers,
 * --start, --persistent-workers, --pin, --shm and --device are.
 * Hash and generator definitions are in tools/train_hash.h, the per-sample
 * pipeline in tools/train_image.h. --help documents the options and the
 * record format.
 */
/* Types and prototypes only: libcudart is dlopen()ed, except in the build
 * with the runtime linked in (TRAIN_CUDART_LINKED, below). */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train_hash.h"
#include "train_image.h"
#include "tsshim.h"

#define PROG "tsshim-train"
#define MAX_BATCH 8192
#define MAX_WORKERS 256
#define MAX_SIZE 2048
#define ERRLEN 1024

enum { DEV_CPU, DEV_CUDA };
enum { START_FORK, START_SPAWN };
enum { SHM_POSIX, SHM_MEMFD };
/* --upload-pattern: how the tensors of a batch go up (see usage) */
enum { UP_WHOLE, UP_HALVES, UP_REPEAT, UP_SIDE_STREAM, UP_LATE_LABELS };
#define LATE_LABELS_UPLOADS 3 /* late-labels: uploads whose labels stay on the host */
#define STR_(x) #x
#define STR(x)  STR_(x)

static struct options {
	const char *root, *val_root, *record, *cudart;
	uint64_t limit, val_limit, seed, epochs, val_every, break_after;
	unsigned batch, val_batch, size, prefetch;
	int workers, start, shm, shuffle, persistent, pin, device, step_spin, readback, tsshim, gpu;
	int labels_on_host, upload, graph, capture_thread, peer_probe, peer_early, device_reset, own_context;
	uint64_t ctx_release_every;
	double step_ms, val_step_ms, timeout_s;
} opt = {
	.seed = 0, .epochs = 1, .batch = 32, .size = 224, .prefetch = 2, .workers = 2,
	.start = START_FORK, .shm = SHM_POSIX, .shuffle = 1, .device = DEV_CPU, .peer_probe = -1,
};

static volatile sig_atomic_t g_signal;
static char g_self_exe[PATH_MAX];
static const char *g_argv0 = PROG;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- main-side descriptors a forked worker must not keep --------------------- */

static int g_fds[2 * MAX_WORKERS + 4];
static int g_nfds;

static void fd_register(int fd)
{
	if (g_nfds < (int)(sizeof g_fds / sizeof g_fds[0]))
		g_fds[g_nfds++] = fd;
}

static void fd_close(int *fd)
{
	if (*fd < 0)
		return;
	for (int i = 0; i < g_nfds; i++)
		if (g_fds[i] == *fd) {
			g_fds[i] = g_fds[--g_nfds];
			break;
		}
	close(*fd);
	*fd = -1;
}

/* ---- dataset ---------------------------------------------------------------- */

struct dataset {
	char *root;
	size_t nclasses;
	char **classes;
	size_t n;
	char **paths;
	int64_t *labels;
	uint64_t fp; /* XXH64 over every "path\0" and its int64 label */
};

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_jpeg_ext(const char *name)
{
	const char *dot = strrchr(name, '.');
	return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static void free_names(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* Sorted names in dir: subdirectories (want_dirs) or .jpg/.jpeg files
 * (symbolic links followed, like os.scandir().is_dir() and os.walk). */
static int list_dir(const char *dir, int want_dirs, char ***out, size_t *nout, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	if (!d) {
		snprintf(err, errlen, "%s: cannot open directory: %s", dir, strerror(errno));
		return -1;
	}
	char **v = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	for (;;) {
		errno = 0;
		e = readdir(d);
		if (!e)
			break;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		int isdir = e->d_type == DT_DIR, isreg = e->d_type == DT_REG;
		if (e->d_type != DT_DIR && e->d_type != DT_REG) {
			struct stat st;
			if (fstatat(dirfd(d), e->d_name, &st, 0) < 0)
				continue; /* dangling link */
			isdir = S_ISDIR(st.st_mode);
			isreg = S_ISREG(st.st_mode);
		}
		if (want_dirs ? !isdir : !(isreg && has_jpeg_ext(e->d_name)))
			continue;
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 64;
			char **nv = realloc(v, nc * sizeof *nv);
			if (!nv)
				goto oom;
			v = nv;
			cap = nc;
		}
		if (!(v[n] = strdup(e->d_name)))
			goto oom;
		n++;
	}
	if (errno) {
		snprintf(err, errlen, "%s: cannot read directory: %s", dir, strerror(errno));
		free_names(v, n);
		closedir(d);
		return -1;
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof *v, name_cmp);
	*out = v;
	*nout = n;
	return 0;
oom:
	snprintf(err, errlen, "%s: out of memory while listing", dir);
	free_names(v, n);
	closedir(d);
	return -1;
}

static void dataset_free(struct dataset *ds)
{
	free(ds->root);
	free_names(ds->classes, ds->nclasses);
	free_names(ds->paths, ds->n);
	free(ds->labels);
	memset(ds, 0, sizeof *ds);
}

static char *path_join(const char *a, const char *b)
{
	size_t la = strlen(a);
	char *p;
	if (asprintf(&p, "%s%s%s", a, la && a[la - 1] == '/' ? "" : "/", b) < 0)
		return NULL;
	return p;
}

/* ImageFolder: classes = sorted subdirectories of root, samples = their
 * .jpg/.jpeg files sorted by name, class by class; the first `limit`
 * samples when limit > 0. */
static int dataset_scan(struct dataset *ds, const char *root, uint64_t limit, char *err, size_t errlen)
{
	memset(ds, 0, sizeof *ds);
	if (!(ds->root = strdup(root)))
		goto oom;
	if (list_dir(root, 1, &ds->classes, &ds->nclasses, err, errlen) < 0)
		goto fail;
	if (ds->nclasses == 0) {
		snprintf(err, errlen, "%s: no class subdirectories (expected ROOT/<class>/<file>.jpg)", root);
		goto fail;
	}
	size_t cap = 0;
	for (size_t c = 0; c < ds->nclasses && !(limit && ds->n >= limit); c++) {
		char *cdir = path_join(root, ds->classes[c]);
		char **files = NULL;
		size_t nf = 0;
		if (!cdir)
			goto oom;
		int rc = list_dir(cdir, 0, &files, &nf, err, errlen);
		if (rc < 0) {
			free(cdir);
			goto fail;
		}
		for (size_t i = 0; i < nf && !(limit && ds->n >= limit); i++) {
			if (ds->n == cap) {
				size_t nc = cap ? 2 * cap : 1024;
				char **np = realloc(ds->paths, nc * sizeof *np);
				if (np)
					ds->paths = np;
				int64_t *nl = realloc(ds->labels, nc * sizeof *nl);
				if (nl)
					ds->labels = nl;
				if (!np || !nl) {
					free(cdir);
					free_names(files, nf);
					goto oom;
				}
				cap = nc;
			}
			if (!(ds->paths[ds->n] = path_join(cdir, files[i]))) {
				free(cdir);
				free_names(files, nf);
				goto oom;
			}
			ds->labels[ds->n++] = (int64_t)c;
		}
		free(cdir);
		free_names(files, nf);
	}
	if (ds->n == 0) {
		snprintf(err, errlen, "%s: no .jpg or .jpeg files in its class subdirectories", root);
		goto fail;
	}
	struct xxh64_state h;
	xxh64_init(&h, 0);
	for (size_t i = 0; i < ds->n; i++) {
		xxh64_update(&h, ds->paths[i], strlen(ds->paths[i]) + 1);
		xxh64_update(&h, &ds->labels[i], sizeof ds->labels[i]);
	}
	ds->fp = xxh64_digest(&h);
	return 0;
oom:
	snprintf(err, errlen, "%s: out of memory while listing the dataset", root);
fail:
	dataset_free(ds);
	return -1;
}

/* ---- messages between the main process and its workers ------------------------ */

enum { MSG_INIT = 0x54520001, MSG_TASK, MSG_RESET, MSG_RESULT, MSG_ACK, MSG_ERROR };

struct msg_task { /* main -> worker: load these samples as batch `seq` */
	uint32_t type, n;
	uint64_t gen, seq, epoch;
	uint64_t ids[];
};

struct msg_result { /* worker -> main, with 2 fds: images, labels */
	uint32_t type, n;
	uint64_t gen, seq, img_bytes, lbl_bytes;
};

struct msg_error { /* worker -> main */
	uint32_t type, pad;
	uint64_t gen, seq;
	char text[ERRLEN];
};

struct msg_ack { /* MSG_RESET (main -> worker), MSG_ACK (worker -> main) */
	uint32_t type, pad;
};

struct msg_init { /* main -> spawned worker: what a forked one inherits */
	uint32_t type, train, size, shm, maxbatch, pad;
	uint64_t seed, limit, n, fp;
	char root[PATH_MAX];
};

union msg_in {
	uint32_t type;
	struct msg_result r;
	struct msg_error e;
	struct msg_ack a;
};

static int send_msg(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
	struct iovec iov = {(void *)buf, len};
	union {
		char b[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.b;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	for (;;) {
		ssize_t r = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		return r == (ssize_t)len ? 0 : -1;
	}
}

/* One message; received descriptors in fds[0..*nfds) (at most 2 kept, the
 * rest closed). Returns its length, 0 at end of stream, -1 with errno. */
static ssize_t recv_msg(int sock, void *buf, size_t cap, int fds[2], int *nfds)
{
	union {
		char b[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {buf, cap};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
	*nfds = 0;
	ssize_t r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	if (r < 0)
		return -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			if (*nfds < 2)
				fds[(*nfds)++] = fd;
			else
				close(fd);
		}
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		for (int i = 0; i < *nfds; i++)
			close(fds[i]);
		*nfds = 0;
		errno = EMSGSIZE;
		return -1;
	}
	return r;
}

/* ---- worker processes --------------------------------------------------------- */

struct wcfg {
	const struct dataset *ds;
	int train, size, shm;
	uint64_t seed;
	unsigned maxbatch;
};

/* A shared-memory object of `bytes`, as a descriptor: shm_open + shm_unlink
 * (PyTorch's file_descriptor strategy) or memfd_create. posix_fallocate
 * reserves the memory now, so a full /dev/shm is an error, not a SIGBUS. */
static int shm_create(int kind, size_t bytes, char *err, size_t errlen)
{
	static unsigned counter;
	int fd = -1;
	if (kind == SHM_MEMFD) {
		fd = memfd_create("train-batch", MFD_CLOEXEC);
		if (fd < 0) {
			snprintf(err, errlen, "memfd_create: %s", strerror(errno));
			return -1;
		}
	} else {
		char name[64];
		for (int attempt = 0; fd < 0; attempt++) {
			snprintf(name, sizeof name, "/train_%d_%u_%u", (int)getpid(), (unsigned)(now_s() * 1e6),
				 counter++);
			fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
			if (fd < 0 && (errno != EEXIST || attempt > 100)) {
				snprintf(err, errlen, "shm_open %s: %s", name, strerror(errno));
				return -1;
			}
		}
		shm_unlink(name);
	}
	int e = posix_fallocate(fd, 0, (off_t)bytes);
	if (e) {
		snprintf(err, errlen, "cannot allocate %zu bytes of shared memory: %s", bytes, strerror(e));
		close(fd);
		return -1;
	}
	return fd;
}

/* Returns -1 when the main process is gone or has shut us down. */
static int worker_send_error(int sock, uint64_t gen, uint64_t seq, const char *text)
{
	struct msg_error m = {.type = MSG_ERROR, .gen = gen, .seq = seq};
	snprintf(m.text, sizeof m.text, "%s", text);
	return send_msg(sock, &m, sizeof m, NULL, 0);
}

/* Build one batch in two fresh shared-memory objects and pass them on.
 * Returns -1 when the main process is gone or has shut us down. */
static int worker_task(int sock, const struct wcfg *cfg, struct ti_ctx *tc, const struct msg_task *t)
{
	char err[ERRLEN];
	size_t per = (size_t)3 * cfg->size * cfg->size;
	size_t img_bytes = t->n * per * sizeof(float), lbl_bytes = t->n * sizeof(int64_t);
	int fds[2] = {-1, -1};
	void *img = MAP_FAILED, *lbl = MAP_FAILED;

	if ((fds[0] = shm_create(cfg->shm, img_bytes, err, sizeof err)) < 0 ||
	    (fds[1] = shm_create(cfg->shm, lbl_bytes, err, sizeof err)) < 0)
		goto fail;
	img = mmap(NULL, img_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	lbl = mmap(NULL, lbl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	if (img == MAP_FAILED || lbl == MAP_FAILED) {
		snprintf(err, sizeof err, "mmap of a batch: %s", strerror(errno));
		goto fail;
	}
	for (uint32_t i = 0; i < t->n; i++) {
		uint64_t id = t->ids[i];
		struct pollfd pf = {.fd = sock, .events = 0};
		if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLERR))) {
			munmap(img, img_bytes); /* shut down (or the main process died): stop now */
			munmap(lbl, lbl_bytes);
			close(fds[0]);
			close(fds[1]);
			return -1;
		}
		if (id >= cfg->ds->n) {
			snprintf(err, sizeof err, "sample index %" PRIu64 " out of range", id);
			goto fail;
		}
		if (ti_load(tc, cfg->ds->paths[id], t->epoch, id, (float *)img + i * per, err, sizeof err) < 0)
			goto fail;
		((int64_t *)lbl)[i] = cfg->ds->labels[id];
	}
	munmap(img, img_bytes);
	munmap(lbl, lbl_bytes);
	struct msg_result r = {.type = MSG_RESULT, .n = t->n, .gen = t->gen, .seq = t->seq,
			       .img_bytes = img_bytes, .lbl_bytes = lbl_bytes};
	int rc = send_msg(sock, &r, sizeof r, fds, 2);
	close(fds[0]);
	close(fds[1]);
	return rc;
fail:
	if (img != MAP_FAILED)
		munmap(img, img_bytes);
	if (lbl != MAP_FAILED)
		munmap(lbl, lbl_bytes);
	for (int i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return worker_send_error(sock, t->gen, t->seq, err);
}

/* Serve tasks until the main process closes its end (or goes away).
 * Returns the worker's exit status. */
static int worker_loop(int sock, const struct wcfg *cfg)
{
	struct ti_ctx tc;
	size_t cap = sizeof(struct msg_task) + sizeof(uint64_t) * cfg->maxbatch;
	struct msg_task *m = malloc(cap);
	int code = 0;
	if (!m || ti_init(&tc, cfg->size, cfg->train, cfg->seed) < 0) {
		worker_send_error(sock, 0, UINT64_MAX, "worker: out of memory");
		free(m);
		return 1;
	}
	for (;;) {
		ssize_t r = recv(sock, m, cap, MSG_TRUNC);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* end of stream: shut down */
		if ((size_t)r >= sizeof(struct msg_ack) && m->type == MSG_RESET) {
			struct msg_ack a = {.type = MSG_ACK};
			if (send_msg(sock, &a, sizeof a, NULL, 0) < 0)
				break;
		} else if ((size_t)r >= sizeof *m && (size_t)r <= cap && m->type == MSG_TASK && m->n >= 1 &&
			   m->n <= cfg->maxbatch && (size_t)r == sizeof *m + m->n * sizeof(uint64_t)) {
			if (worker_task(sock, cfg, &tc, m) < 0)
				break;
		} else {
			worker_send_error(sock, 0, UINT64_MAX, "worker: malformed message from the main process");
			code = 2;
			break;
		}
	}
	ti_free(&tc);
	free(m);
	close(sock);
	return code;
}

/* The program re-executed as a spawned worker: argv = {.., "--worker-fd", FD}. */
static int spawned_worker_main(const char *fdarg)
{
	char *end;
	long fd = strtol(fdarg, &end, 10);
	if (*end || fd < 0 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0) {
		fprintf(stderr, PROG ": --worker-fd is internal (a spawned worker's socket), got '%s'\n", fdarg);
		return 2;
	}
	int sock = (int)fd;
	fcntl(sock, F_SETFD, FD_CLOEXEC);
	signal(SIGINT, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	struct msg_init *in = calloc(1, sizeof *in);
	static struct dataset ds;
	char err[ERRLEN];
	int fds[2], nfds, code = 1;
	ssize_t r;
	if (!in)
		return 1;
	do
		r = recv_msg(sock, in, sizeof *in, fds, &nfds);
	while (r < 0 && errno == EINTR);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (r < 0) {
		fprintf(stderr, PROG ": --worker-fd %s: not a worker's socket: %s\n", fdarg, strerror(errno));
		code = 2;
		goto out;
	}
	if (r == 0) {
		code = 0; /* the main process went away before starting us */
		goto out;
	}
	if ((size_t)r != sizeof *in || in->type != MSG_INIT || !memchr(in->root, 0, sizeof in->root) ||
	    in->maxbatch < 1 || in->maxbatch > MAX_BATCH || in->size < 1 || in->size > MAX_SIZE) {
		worker_send_error(sock, 0, UINT64_MAX, "spawned worker: malformed start message");
		code = 2;
		goto out;
	}
	if (dataset_scan(&ds, in->root, in->limit, err, sizeof err) < 0) {
		worker_send_error(sock, 0, UINT64_MAX, err);
		goto out;
	}
	if (ds.n != in->n || ds.fp != in->fp) {
		snprintf(err, sizeof err, "%s: the dataset changed since the main process listed it "
			 "(%zu samples now, %" PRIu64 " then)", in->root, ds.n, in->n);
		worker_send_error(sock, 0, UINT64_MAX, err);
		goto out;
	}
	struct wcfg cfg = {.ds = &ds, .train = (int)in->train, .size = (int)in->size, .shm = (int)in->shm,
			   .seed = in->seed, .maxbatch = in->maxbatch};
	free(in);
	code = worker_loop(sock, &cfg); /* closes sock */
	dataset_free(&ds);
	return code;
out:
	free(in);
	dataset_free(&ds);
	close(sock);
	return code;
}

/* ---- CUDA runtime, by dlopen ----------------------------------------------------- */

static struct {
	void *lib;
	__typeof__(cudaSetDevice) *SetDevice;
	__typeof__(cudaMalloc) *Malloc;
	__typeof__(cudaFree) *Free;
	__typeof__(cudaMemcpy) *Memcpy;
	__typeof__(cudaMemcpyAsync) *MemcpyAsync;
	__typeof__(cudaStreamCreate) *StreamCreate;
	__typeof__(cudaStreamSynchronize) *StreamSynchronize;
	__typeof__(cudaHostAlloc) *HostAlloc;
	__typeof__(cudaFreeHost) *FreeHost;
	__typeof__(cudaGetLastError) *GetLastError;
	__typeof__(cudaGetErrorString) *GetErrorString;
	/* --graph, --capture-thread */
	__typeof__(cudaStreamCreateWithFlags) *StreamCreateWithFlags;
	__typeof__(cudaStreamBeginCapture) *StreamBeginCapture;
	__typeof__(cudaStreamEndCapture) *StreamEndCapture;
	__typeof__(cudaGraphInstantiate) *GraphInstantiate;
	__typeof__(cudaGraphLaunch) *GraphLaunch;
	__typeof__(cudaGraphExecDestroy) *GraphExecDestroy;
	__typeof__(cudaGraphDestroy) *GraphDestroy;
	/* --peer-probe */
	__typeof__(cudaDeviceEnablePeerAccess) *DeviceEnablePeerAccess;
	__typeof__(cudaDeviceDisablePeerAccess) *DeviceDisablePeerAccess;
	/* --device-reset */
	__typeof__(cudaDeviceReset) *DeviceReset;
	/* --ctx-release-every: the driver's, as the runtime gets them (version 7000) */
	__typeof__(cudaGetDriverEntryPointByVersion) *GetDriverEntryPointByVersion;
	__typeof__(cuDevicePrimaryCtxRetain) *PrimaryCtxRetain;
	__typeof__(cuDevicePrimaryCtxRelease) *PrimaryCtxRelease;
	/* --own-context: the driver's, as the runtime gets them (CUDA 13) */
	CUresult (*CtxCreate)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUcontext own_ctx;
	cudaStream_t stream;
	cudaStream_t side;         /* --upload-pattern side-stream: the labels' */
	int have_stream;
} cu;

static int cuda_ok(cudaError_t rc, const char *what)
{
	if (rc == cudaSuccess)
		return 0;
	const char *s = cu.GetErrorString ? cu.GetErrorString(rc) : NULL;
	fprintf(stderr, PROG ": CUDA error in %s: %s (error %d)\n", what, s ? s : "unknown error", (int)rc);
	if (cu.GetLastError)
		cu.GetLastError(); /* reset the runtime's last error */
	return -1;
}

/*
 * TRAIN_CUDART_LINKED builds the program with the CUDA runtime linked in,
 * as nvcc links it by default (-cudart static): its cudaMemcpy calls bind
 * inside the program, where no preloaded library can interpose them, and the
 * shim sees only the driver entry points the runtime takes from
 * cuGetProcAddress. The table then holds the linked functions; --cudart is
 * refused.
 */
#ifdef TRAIN_CUDART_LINKED
#define RT_SYM(f) {(void **)&cu.f, "cuda" #f, (void *)cuda##f}
#else
#define RT_SYM(f) {(void **)&cu.f, "cuda" #f, NULL}
#endif
struct rt_sym {
	void **p;
	const char *name;
	void *linked;
};

/* Resolved only for --graph and --capture-thread. */
#define NGRAPH_SYMS 7
static const struct rt_sym graph_syms[NGRAPH_SYMS] = {
	RT_SYM(StreamCreateWithFlags), RT_SYM(StreamBeginCapture), RT_SYM(StreamEndCapture),
	RT_SYM(GraphInstantiate),      RT_SYM(GraphLaunch),        RT_SYM(GraphExecDestroy),
	RT_SYM(GraphDestroy),
};

/* Resolved only for --peer-probe. */
static const struct rt_sym peer_syms[] = {RT_SYM(DeviceEnablePeerAccess), RT_SYM(DeviceDisablePeerAccess)};
/* Resolved only for --device-reset, --ctx-release-every. */
static const struct rt_sym reset_sym = RT_SYM(DeviceReset);
static const struct rt_sym entry_sym = RT_SYM(GetDriverEntryPointByVersion);

/* cudaGetDriverEntryPointByVersion, for the option that needs the driver API. */
static int entry_open(const char *option)
{
	if (!(*entry_sym.p = entry_sym.linked ? entry_sym.linked : dlsym(cu.lib, entry_sym.name))) {
		fprintf(stderr, PROG ": %s: the CUDA runtime lacks %s\n", option, entry_sym.name);
		return -1;
	}
	return 0;
}

/*
 * --own-context: a context of the program's own on the device (cuCtxCreate,
 * CUDA 13's: _v4), current on this thread, so that everything the job does
 * on the GPU (the runtime works in the driver's current context) lives in
 * it; destroyed at the end (own_context_end), as a driver-API program does.
 */
static int own_context_begin(void)
{
	enum cudaDriverEntryPointQueryResult q;
	if (entry_open("--own-context") < 0 ||
	    cuda_ok(cu.GetDriverEntryPointByVersion("cuCtxCreate", (void **)&cu.CtxCreate, 13000, cudaEnableDefault, &q),
		    "cudaGetDriverEntryPointByVersion(cuCtxCreate)") < 0 ||
	    cuda_ok(cu.GetDriverEntryPointByVersion("cuCtxDestroy", (void **)&cu.CtxDestroy, 13000, cudaEnableDefault,
						    &q),
		    "cudaGetDriverEntryPointByVersion(cuCtxDestroy)") < 0)
		return -1;
	CUresult r = cu.CtxCreate(&cu.own_ctx, NULL, 0, opt.gpu);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, PROG ": --own-context: cuCtxCreate answered %d\n", (int)r);
		return -1;
	}
	return 0;
}

static int own_context_end(void)
{
	if (!cu.own_ctx)
		return 0;
	CUresult r = cu.CtxDestroy(cu.own_ctx);
	cu.own_ctx = NULL;
	if (r != CUDA_SUCCESS)
		fprintf(stderr, PROG ": --own-context: cuCtxDestroy answered %d\n", (int)r);
	return r == CUDA_SUCCESS ? 0 : -1;
}

/* --ctx-release-every: the driver's primary-context retain and release, from the runtime. */
static int ctx_release_open(void)
{
	enum cudaDriverEntryPointQueryResult q;
	if (entry_open("--ctx-release-every") < 0)
		return -1;
	if (cuda_ok(cu.GetDriverEntryPointByVersion("cuDevicePrimaryCtxRetain", (void **)&cu.PrimaryCtxRetain, 7000,
						    cudaEnableDefault, &q),
		    "cudaGetDriverEntryPointByVersion(cuDevicePrimaryCtxRetain)") < 0 ||
	    cuda_ok(cu.GetDriverEntryPointByVersion("cuDevicePrimaryCtxRelease", (void **)&cu.PrimaryCtxRelease, 7000,
						    cudaEnableDefault, &q),
		    "cudaGetDriverEntryPointByVersion(cuDevicePrimaryCtxRelease)") < 0)
		return -1;
	return 0;
}

/*
 * --ctx-release-every N, after every N training batches: one retain and one
 * release of the device's primary context, as a library that uses the driver
 * API for a moment would. The runtime holds its own retain, so the context
 * lives on; the shim must treat the release as one that may destroy it.
 */
static int ctx_release_now(void)
{
	CUcontext c;
	CUresult r = cu.PrimaryCtxRetain(&c, opt.gpu);
	if (r == CUDA_SUCCESS)
		r = cu.PrimaryCtxRelease(opt.gpu);
	if (r != CUDA_SUCCESS)
		fprintf(stderr, PROG ": --ctx-release-every: the driver answered %d\n", (int)r);
	return r == CUDA_SUCCESS ? 0 : -1;
}

static int cuda_open(void)
{
#ifdef TRAIN_CUDART_LINKED
	if (opt.cudart) {
		fprintf(stderr, PROG ": --cudart: this build has the CUDA runtime linked in\n");
		return -1;
	}
	cu.lib = &cu; /* "open" */
#else
	const char *names[2] = {"libcudart.so.13", "libcudart.so"};
	int nnames = 2;
	char why[2048] = "";
	size_t wl = 0;
	if (opt.cudart) {
		names[0] = opt.cudart;
		nnames = 1;
	}
	for (int i = 0; i < nnames && !cu.lib; i++) {
		cu.lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
		if (!cu.lib && wl < sizeof why) {
			const char *e = dlerror();
			wl += snprintf(why + wl, sizeof why - wl, "%s%s", wl ? "; " : "", e ? e : names[i]);
		}
	}
	if (!cu.lib) {
		fprintf(stderr, PROG ": --device cuda: no CUDA runtime found (%s)\n", why);
		return -1;
	}
#endif
	const struct rt_sym syms[] = {
		RT_SYM(SetDevice),    RT_SYM(Malloc),       RT_SYM(Free),
		RT_SYM(Memcpy),       RT_SYM(MemcpyAsync),  RT_SYM(StreamCreate),
		RT_SYM(StreamSynchronize), RT_SYM(HostAlloc), RT_SYM(FreeHost),
		RT_SYM(GetLastError), RT_SYM(GetErrorString),
	};
	size_t nsyms = sizeof syms / sizeof syms[0];
	for (size_t i = 0; i < nsyms + (opt.graph || opt.capture_thread ? NGRAPH_SYMS : 0); i++) {
		const struct rt_sym *e = i < nsyms ? &syms[i] : &graph_syms[i - nsyms];
		void **p = e->p;
		const char *name = e->name;
		if (!(*p = e->linked ? e->linked : dlsym(cu.lib, name))) {
			fprintf(stderr, PROG ": --device cuda: the CUDA runtime %s lacks %s\n",
				opt.cudart ? opt.cudart : "libcudart", name);
			return -1;
		}
	}
	for (size_t i = 0; opt.peer_probe >= 0 && i < sizeof peer_syms / sizeof peer_syms[0]; i++) {
		const struct rt_sym *e = &peer_syms[i];
		if (!(*e->p = e->linked ? e->linked : dlsym(cu.lib, e->name))) {
			fprintf(stderr, PROG ": --peer-probe: the CUDA runtime lacks %s\n", e->name);
			return -1;
		}
	}
	if (opt.device_reset &&
	    !(*reset_sym.p = reset_sym.linked ? reset_sym.linked : dlsym(cu.lib, reset_sym.name))) {
		fprintf(stderr, PROG ": --device-reset: the CUDA runtime lacks %s\n", reset_sym.name);
		return -1;
	}
	if (opt.ctx_release_every && ctx_release_open() < 0)
		return -1;
	return 0;
}

/*
 * --peer-probe N, after training: what the program's own peer-access calls
 * answer (the same with and without the shim, whose mappings of another
 * device's memory enable peer access as a side effect): disable, enable,
 * disable, disable again. Without the shim, on devices that are peers:
 * 705 0 0 705; after --peer-early's enable (0): 0 0 0 705.
 */
static cudaError_t peer_early_rc; /* --peer-early: the enable before training */

static void peer_probe(void)
{
	cudaError_t pre = cu.DeviceDisablePeerAccess(opt.peer_probe);
	cudaError_t en = cu.DeviceEnablePeerAccess(opt.peer_probe, 0);
	cudaError_t dis = cu.DeviceDisablePeerAccess(opt.peer_probe);
	cudaError_t again = cu.DeviceDisablePeerAccess(opt.peer_probe);
	cu.GetLastError();
	printf(PROG ": peer-probe device %d:", opt.peer_probe);
	if (opt.peer_early)
		printf(" early=%d", (int)peer_early_rc);
	printf(" pre=%d enable=%d disable=%d again=%d\n", (int)pre, (int)en, (int)dis, (int)again);
}

/* A helper thread with every signal blocked (the job's handlers run on the
 * main thread); -1 with a line on stderr when it cannot be started. */
static int start_thread(pthread_t *th, void *(*fn)(void *), const char *what)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int e = pthread_create(th, NULL, fn, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e)
		fprintf(stderr, PROG ": cannot start the %s thread: %s\n", what, strerror(e));
	return e ? -1 : 0;
}

/* ---- CUDA graphs (--graph), a capture in another thread (--capture-thread) ---------------- */

/*
 * --graph: a batch's uploads are captured on the job's stream into a CUDA
 * graph (global mode, torch.cuda.graph's default), which is instantiated
 * and launched there: the device gets what the batch buffers hold at the
 * launch. A capture that ends invalidated fails the job.
 */
static int graph_begin(void)
{
	return cuda_ok(cu.StreamBeginCapture(cu.stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture (--graph)");
}

/* Ends the capture whatever happened inside it; then the launch. */
static int graph_end(void)
{
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	int rc = cuda_ok(cu.StreamEndCapture(cu.stream, &g), "cudaStreamEndCapture (--graph)");
	if (!rc)
		rc = cuda_ok(cu.GraphInstantiate(&x, g, 0), "cudaGraphInstantiate (--graph)");
	if (!rc)
		rc = cuda_ok(cu.GraphLaunch(x, cu.stream), "cudaGraphLaunch (--graph)");
	if (x)
		cu.GraphExecDestroy(x); /* the launch in flight runs to its end */
	if (g)
		cu.GraphDestroy(g);
	return rc;
}

/*
 * --capture-thread: a second thread holds a CUDA graph capture open, in
 * global mode, on a stream of its own while the main thread hands each
 * batch to the shim and queues its uploads, as a program that captures on
 * one thread while another feeds the GPU. CUDA then bars every thread in
 * global mode from "potentially unsafe" calls (allocations, IPC opens,
 * queries, synchronisations), and one such call invalidates the capture:
 * the job fails when it ends invalidated. The main thread makes none itself
 * in that window (its uploads are queued copies from pinned memory; it
 * synchronises after the capture has ended).
 */
#define CAPT_BYTES 4096

static struct {
	pthread_t th;
	int running;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int want, state;  /* 1: capturing, 0: not; want -1: stop */
	cudaError_t rc;   /* of the last switch */
	const char *what;
	cudaStream_t stream;
	void *a, *b;      /* what it captures: a small device-to-device copy */
} capt = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* In the capture thread: begin (a copy captured) or end the capture. */
static cudaError_t capt_do(int begin, const char **what)
{
	cudaGraph_t g = NULL;
	cudaError_t rc;
	if (!begin) {
		*what = "cudaStreamEndCapture (--capture-thread)";
		rc = cu.StreamEndCapture(capt.stream, &g);
		if (g)
			cu.GraphDestroy(g);
		return rc;
	}
	*what = "cudaStreamBeginCapture (--capture-thread)";
	rc = cu.StreamBeginCapture(capt.stream, cudaStreamCaptureModeGlobal);
	if (rc != cudaSuccess)
		return rc;
	*what = "cudaMemcpyAsync (--capture-thread)";
	return cu.MemcpyAsync(capt.b, capt.a, CAPT_BYTES, cudaMemcpyDeviceToDevice, capt.stream);
}

static void *capt_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&capt.mu);
	for (;;) {
		while (capt.want == capt.state)
			pthread_cond_wait(&capt.cv, &capt.mu);
		int want = capt.want;
		if (want < 0)
			break;
		pthread_mutex_unlock(&capt.mu);
		const char *what;
		cudaError_t rc = capt_do(want, &what);
		pthread_mutex_lock(&capt.mu);
		capt.state = want;
		capt.rc = rc;
		capt.what = what;
		pthread_cond_broadcast(&capt.cv);
	}
	pthread_mutex_unlock(&capt.mu);
	return NULL;
}

static int capt_start(void)
{
	if (cuda_ok(cu.Malloc(&capt.a, CAPT_BYTES), "cudaMalloc (--capture-thread)") < 0 ||
	    cuda_ok(cu.Malloc(&capt.b, CAPT_BYTES), "cudaMalloc (--capture-thread)") < 0 ||
	    cuda_ok(cu.StreamCreateWithFlags(&capt.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") < 0)
		return -1;
	if (start_thread(&capt.th, capt_thread, "capture"))
		return -1;
	capt.running = 1;
	return 0;
}

/* The capture thread's capture open (1) or ended (0); its CUDA error fails the job. */
static int capt_switch(int want)
{
	if (!capt.running)
		return 0;
	pthread_mutex_lock(&capt.mu);
	capt.want = want;
	pthread_cond_broadcast(&capt.cv);
	while (capt.state != want)
		pthread_cond_wait(&capt.cv, &capt.mu);
	cudaError_t rc = capt.rc;
	const char *what = capt.what;
	pthread_mutex_unlock(&capt.mu);
	return cuda_ok(rc, what);
}

static void capt_stop(void)
{
	if (!capt.running)
		return;
	if (capt.state)
		(void)capt_switch(0); /* a batch that failed inside the window */
	pthread_mutex_lock(&capt.mu);
	capt.want = -1;
	pthread_cond_broadcast(&capt.cv);
	pthread_mutex_unlock(&capt.mu);
	pthread_join(capt.th, NULL);
	capt.running = 0;
	cu.Free(capt.a);
	cu.Free(capt.b);
}

/* ---- device buffers, upload ----------------------------------------------------- */

static struct {
	void *img, *lbl;           /* device (cuda) or "device" host memory (cpu) */
	size_t img_cap, lbl_cap;
	void *rb_img, *rb_lbl;     /* --readback with cuda: host copies */
	void *host_lbl;            /* where labels that are not uploaded stay (a loss on the host) */
	int lbl_on_host;           /* the last batch's labels stayed there */
	uint64_t uploads;          /* batches uploaded so far */
} dev;

static int device_init(size_t img_cap, size_t lbl_cap)
{
	dev.img_cap = img_cap;
	dev.lbl_cap = lbl_cap;
	if (opt.device == DEV_CPU) {
		dev.img = malloc(img_cap);
		dev.lbl = malloc(lbl_cap);
		if (!dev.img || !dev.lbl) {
			fprintf(stderr, PROG ": out of memory for the %zu-byte device buffers\n", img_cap + lbl_cap);
			return -1;
		}
		return 0;
	}
	if (cuda_open() < 0)
		return -1;
	if (opt.gpu && cuda_ok(cu.SetDevice(opt.gpu), "cudaSetDevice (--gpu)") < 0)
		return -1;
	if (opt.own_context && own_context_begin() < 0)
		return -1;
	if (opt.peer_early)
		peer_early_rc = cu.DeviceEnablePeerAccess(opt.peer_probe, 0);
	if (cuda_ok(cu.Malloc(&dev.img, img_cap), "cudaMalloc (images)") < 0)
		return -1;
	if (!opt.labels_on_host && cuda_ok(cu.Malloc(&dev.lbl, lbl_cap), "cudaMalloc (labels)") < 0)
		return -1;
	if ((opt.labels_on_host || opt.upload == UP_LATE_LABELS) && !(dev.host_lbl = malloc(lbl_cap))) {
		fprintf(stderr, PROG ": out of memory for the %zu-byte label buffer\n", lbl_cap);
		return -1;
	}
	if (opt.pin || opt.upload == UP_SIDE_STREAM) {
		if (cuda_ok(cu.StreamCreate(&cu.stream), "cudaStreamCreate") < 0)
			return -1;
		cu.have_stream = 1;
	}
	if (opt.upload == UP_SIDE_STREAM && cuda_ok(cu.StreamCreate(&cu.side), "cudaStreamCreate (side)") < 0)
		return -1;
	if (opt.capture_thread && capt_start() < 0)
		return -1;
	if (opt.readback) {
		dev.rb_img = malloc(img_cap);
		dev.rb_lbl = malloc(lbl_cap);
		if (!dev.rb_img || !dev.rb_lbl) {
			fprintf(stderr, PROG ": out of memory for the read-back buffers\n");
			return -1;
		}
	}
	return 0;
}

static void device_free(void)
{
	if (opt.device == DEV_CUDA && cu.lib) {
		capt_stop();
		if (dev.img)
			cu.Free(dev.img);
		if (dev.lbl)
			cu.Free(dev.lbl);
		/* The stream and the library stay until exit, as in PyTorch. */
	} else {
		free(dev.img);
		free(dev.lbl);
	}
	free(dev.rb_img);
	free(dev.rb_lbl);
	free(dev.host_lbl);
	memset(&dev, 0, sizeof dev);
}

/* One host-to-device copy of src[off, off + n) to dst + off: on stream s
 * with cudaMemcpyAsync (pinned batches, or any batch on the side stream),
 * else with cudaMemcpy. */
static int copy_up(void *dst, const void *src, size_t off, size_t n, int async, cudaStream_t s, const char *what)
{
	if (async)
		return cuda_ok(cu.MemcpyAsync((char *)dst + off, (const char *)src + off, n, cudaMemcpyHostToDevice, s),
			       what);
	return cuda_ok(cu.Memcpy((char *)dst + off, (const char *)src + off, n, cudaMemcpyHostToDevice), what);
}

/*
 * Host-to-device copy of each tensor, queued; pinned sources go through
 * cudaMemcpyAsync on the job's stream (*sync: the caller waits for the
 * stream, upload_wait), pageable ones through cudaMemcpy. --upload-pattern
 * changes the order and the pieces, never what ends up on the device;
 * --graph captures the copies and launches them.
 */
static int upload_queue(const void *img, size_t img_bytes, const void *lbl, size_t lbl_bytes, int pinned, int *sync)
{
	*sync = 0;
	if (opt.device == DEV_CPU) {
		memcpy(dev.img, img, img_bytes);
		memcpy(dev.lbl, lbl, lbl_bytes);
		return 0;
	}
	size_t ih = img_bytes / 2, lh = lbl_bytes / 2;
	/* the loss is taken on the host: the labels stay there (late-labels: for the first batches) */
	dev.lbl_on_host = opt.labels_on_host || (opt.upload == UP_LATE_LABELS && dev.uploads < LATE_LABELS_UPLOADS);
	dev.uploads++;
	if (dev.lbl_on_host)
		memcpy(dev.host_lbl, lbl, lbl_bytes);
	int up_lbl = !dev.lbl_on_host, rc = 0;
	*sync = pinned;
	if (opt.graph && graph_begin() < 0)
		return -1;
	switch (opt.upload) {
	case UP_HALVES: /* each tensor in two copies */
		rc = copy_up(dev.img, img, 0, ih, pinned, cu.stream, "images, first half") < 0 ||
		     copy_up(dev.img, img, ih, img_bytes - ih, pinned, cu.stream, "images, second half") < 0 ||
		     (up_lbl && (copy_up(dev.lbl, lbl, 0, lh, pinned, cu.stream, "labels, first half") < 0 ||
				 copy_up(dev.lbl, lbl, lh, lbl_bytes - lh, pinned, cu.stream, "labels, second half") < 0));
		break;
	case UP_REPEAT: /* the images' first half twice, their second half after the labels */
		rc = copy_up(dev.img, img, 0, ih, pinned, cu.stream, "images, first half") < 0 ||
		     copy_up(dev.img, img, 0, ih, pinned, cu.stream, "images, first half again") < 0 ||
		     (up_lbl && copy_up(dev.lbl, lbl, 0, lbl_bytes, pinned, cu.stream, "labels") < 0) ||
		     copy_up(dev.img, img, ih, img_bytes - ih, pinned, cu.stream, "images, second half") < 0;
		break;
	case UP_SIDE_STREAM: /* the labels on a stream of their own */
		rc = copy_up(dev.img, img, 0, img_bytes, 1, cu.stream, "images") < 0 ||
		     (up_lbl && copy_up(dev.lbl, lbl, 0, lbl_bytes, 1, cu.side, "labels (side stream)") < 0) ||
		     cuda_ok(cu.StreamSynchronize(cu.side), "cudaStreamSynchronize (side)") < 0;
		*sync = 1; /* the images' stream */
		break;
	default:
		rc = copy_up(dev.img, img, 0, img_bytes, pinned, cu.stream, "images") < 0 ||
		     (up_lbl && copy_up(dev.lbl, lbl, 0, lbl_bytes, pinned, cu.stream, "labels") < 0);
	}
	if (opt.graph && graph_end() < 0)
		rc = 1;
	return rc ? -1 : 0;
}

static int upload_wait(int sync)
{
	return sync ? cuda_ok(cu.StreamSynchronize(cu.stream), "cudaStreamSynchronize") : 0;
}

/* --readback: where the device copy of the batch can be read on the host. */
static int readback(size_t img_bytes, size_t lbl_bytes, const void **img, const void **lbl)
{
	if (opt.device == DEV_CPU) {
		*img = dev.img;
		*lbl = dev.lbl;
		return 0;
	}
	if (cuda_ok(cu.Memcpy(dev.rb_img, dev.img, img_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (read back)") < 0 ||
	    (!dev.lbl_on_host &&
	     cuda_ok(cu.Memcpy(dev.rb_lbl, dev.lbl, lbl_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (read back)") < 0))
		return -1;
	*img = dev.rb_img;
	*lbl = dev.lbl_on_host ? dev.host_lbl : dev.rb_lbl;
	return 0;
}

/* ---- batches and pinning ------------------------------------------------------------ */

struct pinbuf {
	void *img, *lbl;
	struct pinbuf *next;
};

enum { PIN_NONE, PIN_QUEUED, PIN_DONE, PIN_FAILED };

struct batch {
	uint64_t seq; /* index within its iteration */
	uint32_t n;
	const uint64_t *ids;
	void *img, *lbl; /* the loader's tensors: shared memory from a worker, or malloc */
	size_t img_bytes, lbl_bytes;
	int mapped;
	struct pinbuf *pin; /* page-locked copy (--pin) */
	int pin_state;
	struct batch *qnext;
};

static struct {
	pthread_t th;
	int threaded, running, stop; /* threaded: start the thread at the first batch */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct batch *head, *tail;
	struct pinbuf *free_list;
	size_t img_cap, lbl_cap;
	char err[ERRLEN];
} pins = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static struct pinbuf *pinbuf_get(void)
{
	pthread_mutex_lock(&pins.mu);
	struct pinbuf *pb = pins.free_list;
	if (pb)
		pins.free_list = pb->next;
	pthread_mutex_unlock(&pins.mu);
	if (pb)
		return pb;
	if (!(pb = calloc(1, sizeof *pb)))
		goto oom;
	if (opt.device == DEV_CUDA) {
		cudaError_t rc = cu.HostAlloc(&pb->img, pins.img_cap, cudaHostAllocDefault);
		if (rc == cudaSuccess)
			rc = cu.HostAlloc(&pb->lbl, pins.lbl_cap, cudaHostAllocDefault);
		if (rc != cudaSuccess) {
			pthread_mutex_lock(&pins.mu);
			snprintf(pins.err, sizeof pins.err, "CUDA error in cudaHostAlloc: %s (error %d)",
				 cu.GetErrorString(rc), (int)rc);
			pthread_mutex_unlock(&pins.mu);
			if (pb->img)
				cu.FreeHost(pb->img);
			free(pb);
			return NULL;
		}
		return pb;
	}
	pb->img = malloc(pins.img_cap);
	pb->lbl = malloc(pins.lbl_cap);
	if (!pb->img || !pb->lbl) {
		free(pb->img);
		free(pb->lbl);
		free(pb);
		goto oom;
	}
	/* Best effort: without CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK
	 * this stays plain memory, which changes nothing but speed. */
	mlock(pb->img, pins.img_cap);
	mlock(pb->lbl, pins.lbl_cap);
	return pb;
oom:
	pthread_mutex_lock(&pins.mu);
	snprintf(pins.err, sizeof pins.err, "out of memory for a pinned batch buffer");
	pthread_mutex_unlock(&pins.mu);
	return NULL;
}

static void pinbuf_put(struct pinbuf *pb)
{
	pthread_mutex_lock(&pins.mu);
	pb->next = pins.free_list;
	pins.free_list = pb;
	pthread_mutex_unlock(&pins.mu);
}

static void pin_copy(struct batch *b)
{
	struct pinbuf *pb = pinbuf_get();
	if (pb) {
		memcpy(pb->img, b->img, b->img_bytes);
		memcpy(pb->lbl, b->lbl, b->lbl_bytes);
	}
	pthread_mutex_lock(&pins.mu);
	b->pin = pb;
	b->pin_state = pb ? PIN_DONE : PIN_FAILED;
	pthread_cond_broadcast(&pins.cv);
	pthread_mutex_unlock(&pins.mu);
}

static void *pin_thread(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&pins.mu);
		while (!pins.stop && !pins.head)
			pthread_cond_wait(&pins.cv, &pins.mu);
		struct batch *b = pins.head;
		if (!b) {
			pthread_mutex_unlock(&pins.mu);
			return NULL;
		}
		pins.head = b->qnext;
		if (!pins.head)
			pins.tail = NULL;
		pthread_mutex_unlock(&pins.mu);
		pin_copy(b);
	}
}

/*
 * With workers a thread pins, started at the first batch, once the workers
 * of the first pass exist (as PyTorch starts its pin_memory thread after its
 * workers): a worker forked while that thread was starting deadlocked in
 * ASan's allocator (gcc 12's is not fork-safe in a threaded process).
 */
static void pin_start(size_t img_cap, size_t lbl_cap)
{
	pins.img_cap = img_cap;
	pins.lbl_cap = lbl_cap;
	pins.threaded = opt.workers > 0; /* else, like PyTorch, the main thread pins as it loads */
}

static void pin_submit(struct batch *b)
{
	if (!pins.running && pins.threaded) {
		pins.threaded = 0; /* one try: on failure (said) the main thread pins */
		pins.running = start_thread(&pins.th, pin_thread, "pinning") == 0;
	}
	if (!pins.running) {
		pin_copy(b);
		return;
	}
	pthread_mutex_lock(&pins.mu);
	b->pin_state = PIN_QUEUED;
	b->qnext = NULL;
	if (pins.tail)
		pins.tail->qnext = b;
	else
		pins.head = b;
	pins.tail = b;
	pthread_cond_broadcast(&pins.cv);
	pthread_mutex_unlock(&pins.mu);
}

static int pin_wait(struct batch *b)
{
	pthread_mutex_lock(&pins.mu);
	while (b->pin_state == PIN_QUEUED)
		pthread_cond_wait(&pins.cv, &pins.mu);
	int ok = b->pin_state == PIN_DONE;
	if (!ok)
		fprintf(stderr, PROG ": pinning: %s\n", pins.err);
	pthread_mutex_unlock(&pins.mu);
	return ok ? 0 : -1;
}

static void pin_stop(void)
{
	if (pins.running) {
		pthread_mutex_lock(&pins.mu);
		pins.stop = 1;
		pthread_cond_broadcast(&pins.cv);
		pthread_mutex_unlock(&pins.mu);
		pthread_join(pins.th, NULL);
		pins.running = 0;
	}
	while (pins.free_list) {
		struct pinbuf *pb = pins.free_list;
		pins.free_list = pb->next;
		if (opt.device == DEV_CUDA) {
			cu.FreeHost(pb->img);
			cu.FreeHost(pb->lbl);
		} else {
			munlock(pb->img, pins.img_cap);
			munlock(pb->lbl, pins.lbl_cap);
			free(pb->img);
			free(pb->lbl);
		}
		free(pb);
	}
}

/* ---- loaders ---------------------------------------------------------------------- */

struct worker {
	pid_t pid;
	int fd;
};

struct loader {
	const char *name; /* "train" or "val" */
	struct dataset ds;
	int train;
	unsigned batch;
	uint64_t limit;
	int nworkers;
	struct worker w[MAX_WORKERS];
	int running, need_reset;
	uint64_t gen; /* iteration number, carried by tasks and results */
	uint64_t epoch;
	uint64_t *order;
	uint64_t nbatches, sent, fetched;
	struct batch *ahead; /* --pin: the next batch, being pinned */
	struct ti_ctx local; /* --workers 0 */
	int have_local;
	struct msg_task *task;
};

static uint32_t batch_n(const struct loader *L, uint64_t k)
{
	uint64_t left = L->ds.n - k * L->batch;
	return (uint32_t)(left < L->batch ? left : L->batch);
}

static void worker_report_death(struct loader *L, int i)
{
	struct worker *w = &L->w[i];
	int st = 0;
	pid_t r = 0;
	for (int k = 0; k < 200 && r == 0; k++) {
		r = waitpid(w->pid, &st, WNOHANG);
		if (r == 0)
			usleep(10000);
	}
	if (r == w->pid) {
		if (WIFSIGNALED(st))
			fprintf(stderr, PROG ": %s loader worker %d (pid %d) was killed by signal %d (%s)\n", L->name, i,
				(int)w->pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
		else
			fprintf(stderr, PROG ": %s loader worker %d (pid %d) exited unexpectedly with status %d\n",
				L->name, i, (int)w->pid, WEXITSTATUS(st));
		w->pid = 0;
	} else {
		fprintf(stderr, PROG ": %s loader worker %d (pid %d) closed its connection unexpectedly\n", L->name, i,
			(int)w->pid);
	}
}

/*
 * Stop all workers: close their sockets (a worker exits at end of stream,
 * or between two samples once its socket is closed), wait up to
 * patience_s, then SIGKILL. Unless quiet, a worker that had died on its
 * own (signal, non-zero exit) is reported and makes this return -1.
 */
static int workers_stop(struct loader *L, double patience_s, int quiet)
{
	int bad = 0;
	for (int i = 0; i < L->nworkers; i++)
		fd_close(&L->w[i].fd);
	double deadline = now_s() + patience_s;
	for (;;) {
		int left = 0;
		for (int i = 0; i < L->nworkers; i++) {
			struct worker *w = &L->w[i];
			int st;
			if (w->pid <= 0)
				continue;
			pid_t r = waitpid(w->pid, &st, WNOHANG);
			if (r == 0) {
				left++;
				continue;
			}
			if (r == w->pid && !quiet && (WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0))) {
				if (WIFSIGNALED(st))
					fprintf(stderr, PROG ": %s loader worker %d (pid %d) was killed by signal %d (%s)\n",
						L->name, i, (int)w->pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
				else
					fprintf(stderr, PROG ": %s loader worker %d (pid %d) exited with status %d\n",
						L->name, i, (int)w->pid, WEXITSTATUS(st));
				bad = 1;
			}
			w->pid = 0;
		}
		if (!left)
			break;
		if (now_s() >= deadline) {
			for (int i = 0; i < L->nworkers; i++)
				if (L->w[i].pid > 0) {
					if (!quiet)
						fprintf(stderr, PROG ": %s loader worker %d (pid %d) did not exit; killing it\n",
							L->name, i, (int)L->w[i].pid);
					kill(L->w[i].pid, SIGKILL);
					while (waitpid(L->w[i].pid, NULL, 0) < 0 && errno == EINTR)
						;
					L->w[i].pid = 0;
				}
			break;
		}
		usleep(2000);
	}
	L->running = 0;
	L->need_reset = 0;
	return bad ? -1 : 0;
}

static void write_num(int fd, const char *s, long v)
{
	char b[24];
	int i = sizeof b;
	b[--i] = '\n';
	do
		b[--i] = (char)('0' + v % 10);
	while ((v /= 10) && i > 0);
	if (write(fd, s, strlen(s)) < 0 || write(fd, b + i, sizeof b - i) < 0)
		return;
}

static int worker_start(struct loader *L, int i)
{
	struct worker *w = &L->w[i];
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		fprintf(stderr, PROG ": socketpair: %s\n", strerror(errno));
		return -1;
	}
	char fdarg[16];
	snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
	char *argv[] = {(char *)g_argv0, "--worker-fd", fdarg, NULL};
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, PROG ": fork: %s\n", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	if (pid == 0) {
		signal(SIGINT, SIG_IGN); /* the main process handles ^C and shuts us down */
		signal(SIGTERM, SIG_DFL);
		for (int k = 0; k < g_nfds; k++)
			close(g_fds[k]);
		close(sv[0]);
		if (opt.start == START_SPAWN) {
			fcntl(sv[1], F_SETFD, 0);
			execv(g_self_exe, argv);
			write_num(2, PROG ": worker: cannot execute this program again; errno ", errno);
			_exit(127);
		}
		struct wcfg cfg = {.ds = &L->ds, .train = L->train, .size = (int)opt.size, .shm = opt.shm,
				   .seed = opt.seed, .maxbatch = L->batch};
		_exit(worker_loop(sv[1], &cfg));
	}
	close(sv[1]);
	w->pid = pid;
	w->fd = sv[0];
	fd_register(sv[0]);
	if (opt.start == START_SPAWN) {
		struct msg_init *in = calloc(1, sizeof *in);
		if (!in) {
			fprintf(stderr, PROG ": out of memory\n");
			return -1;
		}
		*in = (struct msg_init){.type = MSG_INIT, .train = (uint32_t)L->train, .size = opt.size,
					.shm = (uint32_t)opt.shm, .maxbatch = L->batch, .seed = opt.seed,
					.limit = L->limit, .n = L->ds.n, .fp = L->ds.fp};
		snprintf(in->root, sizeof in->root, "%s", L->ds.root);
		int rc = send_msg(w->fd, in, sizeof *in, NULL, 0);
		free(in);
		if (rc < 0) {
			worker_report_death(L, i);
			return -1;
		}
	}
	return 0;
}

static int workers_start(struct loader *L)
{
	for (int i = 0; i < L->nworkers; i++)
		L->w[i] = (struct worker){.pid = 0, .fd = -1};
	for (int i = 0; i < L->nworkers; i++)
		if (worker_start(L, i) < 0) {
			workers_stop(L, 2.0, 1);
			return -1;
		}
	L->running = 1;
	return 0;
}

/*
 * Wait for the next message from worker wi, watching every worker of the
 * loader: one that dies is reported at once. Returns 0 with the message,
 * -1 after reporting (or on a signal).
 */
static int worker_recv(struct loader *L, int wi, union msg_in *m, int fds[2], int *nfds, const char *what)
{
	struct pollfd pf[MAX_WORKERS];
	double t0 = now_s();
	for (;;) {
		if (g_signal)
			return -1;
		for (int i = 0; i < L->nworkers; i++)
			pf[i] = (struct pollfd){.fd = L->w[i].fd, .events = i == wi ? POLLIN : 0};
		int r = poll(pf, L->nworkers, 200);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, PROG ": poll: %s\n", strerror(errno));
			return -1;
		}
		for (int i = 0; i < L->nworkers; i++)
			if (i != wi && (pf[i].revents & (POLLHUP | POLLERR | POLLNVAL))) {
				worker_report_death(L, i);
				return -1;
			}
		if (pf[wi].revents & POLLIN) {
			ssize_t n = recv_msg(L->w[wi].fd, m, sizeof *m, fds, nfds);
			if (n == 0) {
				worker_report_death(L, wi);
				return -1;
			}
			if (n < 0) {
				if (errno == EINTR || errno == EAGAIN)
					continue;
				if (errno == ECONNRESET || errno == EPIPE) { /* died with tasks unread */
					worker_report_death(L, wi);
					return -1;
				}
				fprintf(stderr, PROG ": %s loader: receiving from worker %d (pid %d): %s\n", L->name, wi,
					(int)L->w[wi].pid, strerror(errno));
				return -1;
			}
			if ((size_t)n < sizeof(struct msg_ack) ||
			    (m->type == MSG_RESULT && (size_t)n != sizeof m->r) ||
			    (m->type == MSG_ERROR && (size_t)n != sizeof m->e)) {
				fprintf(stderr, PROG ": %s loader: malformed message from worker %d (pid %d)\n", L->name,
					wi, (int)L->w[wi].pid);
				for (int i = 0; i < *nfds; i++)
					close(fds[i]);
				return -1;
			}
			if (m->type == MSG_ERROR)
				m->e.text[sizeof m->e.text - 1] = 0;
			return 0;
		}
		if (pf[wi].revents & (POLLHUP | POLLERR | POLLNVAL)) {
			worker_report_death(L, wi);
			return -1;
		}
		if (opt.timeout_s > 0 && now_s() - t0 > opt.timeout_s) {
			fprintf(stderr, PROG ": %s loader: timed out after %g s waiting for %s from worker %d (pid %d)\n",
				L->name, opt.timeout_s, what, wi, (int)L->w[wi].pid);
			return -1;
		}
	}
}

/* Persistent workers between iterations: every worker acknowledges a
 * reset after its queue; what it still delivers before is dropped. */
static int loader_reset(struct loader *L)
{
	struct msg_ack rs = {.type = MSG_RESET};
	for (int i = 0; i < L->nworkers; i++)
		if (send_msg(L->w[i].fd, &rs, sizeof rs, NULL, 0) < 0) {
			worker_report_death(L, i);
			return -1;
		}
	for (int i = 0; i < L->nworkers; i++) {
		for (;;) {
			union msg_in m;
			int fds[2], nfds;
			if (worker_recv(L, i, &m, fds, &nfds, "a reset acknowledgement") < 0)
				return -1;
			for (int k = 0; k < nfds; k++)
				close(fds[k]);
			if (m.type == MSG_ACK)
				break;
		}
	}
	L->need_reset = 0;
	return 0;
}

static int loader_send_task(struct loader *L, uint64_t k)
{
	int wi = (int)(k % (uint64_t)L->nworkers);
	struct msg_task *t = L->task;
	t->type = MSG_TASK;
	t->n = batch_n(L, k);
	t->gen = L->gen;
	t->seq = k;
	t->epoch = L->epoch;
	memcpy(t->ids, L->order + k * L->batch, t->n * sizeof(uint64_t));
	if (send_msg(L->w[wi].fd, t, sizeof *t + t->n * sizeof(uint64_t), NULL, 0) < 0) {
		if (errno == EPIPE || errno == ECONNRESET)
			worker_report_death(L, wi);
		else
			fprintf(stderr, PROG ": %s loader: sending to worker %d: %s\n", L->name, wi, strerror(errno));
		return -1;
	}
	return 0;
}

static void batch_release(struct batch *b)
{
	if (!b)
		return;
	if (b->mapped) {
		if (b->img)
			munmap(b->img, b->img_bytes);
		if (b->lbl)
			munmap(b->lbl, b->lbl_bytes);
	} else {
		free(b->img);
		free(b->lbl);
	}
	if (b->pin)
		pinbuf_put(b->pin);
	free(b);
}

static int loader_begin(struct loader *L, uint64_t epoch)
{
	L->epoch = epoch;
	if (!L->order && !(L->order = malloc(L->ds.n * sizeof *L->order))) {
		fprintf(stderr, PROG ": out of memory for the sampler\n");
		return -1;
	}
	if (L->train && opt.shuffle)
		train_permutation(L->order, L->ds.n, opt.seed, epoch);
	else
		for (uint64_t i = 0; i < L->ds.n; i++)
			L->order[i] = i;
	L->nbatches = (L->ds.n + L->batch - 1) / L->batch;
	L->sent = L->fetched = 0;
	L->gen++;
	if (L->nworkers == 0) {
		if (!L->have_local) {
			if (ti_init(&L->local, (int)opt.size, L->train, opt.seed) < 0) {
				fprintf(stderr, PROG ": out of memory\n");
				return -1;
			}
			L->have_local = 1;
		}
		return 0;
	}
	if (!L->task && !(L->task = malloc(sizeof *L->task + L->batch * sizeof(uint64_t)))) {
		fprintf(stderr, PROG ": out of memory\n");
		return -1;
	}
	if (!L->running)
		return workers_start(L);
	if (L->need_reset)
		return loader_reset(L);
	return 0;
}

/* The next batch of the iteration, as the loader produced it (not pinned).
 * Returns 1, 0 at the end, -1 after reporting an error. */
static int loader_fetch(struct loader *L, struct batch **out)
{
	if (L->fetched == L->nbatches)
		return 0;
	uint64_t k = L->fetched;
	struct batch *b = calloc(1, sizeof *b);
	if (!b) {
		fprintf(stderr, PROG ": out of memory\n");
		return -1;
	}
	b->seq = k;
	b->n = batch_n(L, k);
	b->ids = L->order + k * L->batch;
	size_t per = (size_t)3 * opt.size * opt.size;
	b->img_bytes = b->n * per * sizeof(float);
	b->lbl_bytes = b->n * sizeof(int64_t);

	if (L->nworkers == 0) {
		char err[ERRLEN];
		b->img = malloc(b->img_bytes);
		b->lbl = malloc(b->lbl_bytes);
		if (!b->img || !b->lbl) {
			fprintf(stderr, PROG ": out of memory for a batch\n");
			goto fail;
		}
		for (uint32_t i = 0; i < b->n; i++) {
			if (g_signal)
				goto fail;
			uint64_t id = b->ids[i];
			if (ti_load(&L->local, L->ds.paths[id], L->epoch, id, (float *)b->img + i * per, err,
				    sizeof err) < 0) {
				fprintf(stderr, PROG ": %s\n", err);
				goto fail;
			}
			((int64_t *)b->lbl)[i] = L->ds.labels[id];
		}
		L->fetched++;
		*out = b;
		return 1;
	}

	while (L->sent < L->nbatches && L->sent < L->fetched + (uint64_t)opt.prefetch * L->nworkers)
		if (loader_send_task(L, L->sent++) < 0)
			goto fail;
	int wi = (int)(k % (uint64_t)L->nworkers);
	union msg_in m;
	int fds[2], nfds;
	if (worker_recv(L, wi, &m, fds, &nfds, "a batch") < 0)
		goto fail;
	if (m.type == MSG_ERROR) {
		fprintf(stderr, PROG ": %s loader worker %d (pid %d): %s\n", L->name, wi, (int)L->w[wi].pid,
			m.e.text);
		goto fail_fds;
	}
	if (m.type != MSG_RESULT || m.r.gen != L->gen || m.r.seq != k || m.r.n != b->n ||
	    m.r.img_bytes != b->img_bytes || m.r.lbl_bytes != b->lbl_bytes || nfds != 2) {
		fprintf(stderr, PROG ": %s loader: worker %d (pid %d) sent an unexpected message for batch %" PRIu64 "\n",
			L->name, wi, (int)L->w[wi].pid, k);
		goto fail_fds;
	}
	struct stat st0, st1;
	if (fstat(fds[0], &st0) < 0 || fstat(fds[1], &st1) < 0 || (size_t)st0.st_size < b->img_bytes ||
	    (size_t)st1.st_size < b->lbl_bytes) {
		fprintf(stderr, PROG ": %s loader: batch %" PRIu64 " from worker %d has the wrong size\n", L->name, k,
			wi);
		goto fail_fds;
	}
	b->mapped = 1;
	b->img = mmap(NULL, b->img_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	b->lbl = mmap(NULL, b->lbl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	close(fds[0]);
	close(fds[1]);
	if (b->img == MAP_FAILED || b->lbl == MAP_FAILED) {
		fprintf(stderr, PROG ": %s loader: mmap of batch %" PRIu64 ": %s\n", L->name, k, strerror(errno));
		if (b->img == MAP_FAILED)
			b->img = NULL;
		if (b->lbl == MAP_FAILED)
			b->lbl = NULL;
		goto fail;
	}
	L->fetched++;
	*out = b;
	return 1;
fail_fds:
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
fail:
	batch_release(b);
	return -1;
}

/* The next batch, pinned when --pin: with workers, the pinning thread
 * copies batch k+1 while the caller uses batch k. */
static int loader_next(struct loader *L, struct batch **out)
{
	if (!opt.pin)
		return loader_fetch(L, out);
	struct batch *cur = L->ahead, *next = NULL;
	L->ahead = NULL;
	if (!cur) {
		int r = loader_fetch(L, &cur);
		if (r <= 0)
			return r;
		pin_submit(cur);
	}
	if (pins.running && L->fetched < L->nbatches) {
		if (loader_fetch(L, &next) < 0) {
			pin_wait(cur);
			batch_release(cur);
			return -1;
		}
		pin_submit(next);
		L->ahead = next;
	}
	if (pin_wait(cur) < 0) {
		batch_release(cur);
		return -1;
	}
	*out = cur;
	return 1;
}

/* End of an iteration (all batches used, or a break). */
static int loader_end(struct loader *L)
{
	if (L->ahead) {
		pin_wait(L->ahead);
		batch_release(L->ahead);
		L->ahead = NULL;
	}
	if (L->nworkers == 0 || !L->running)
		return 0;
	if (!opt.persistent)
		return workers_stop(L, 10.0, 0);
	L->need_reset = 1;
	return 0;
}

static int loader_close(struct loader *L, int abort_workers)
{
	int rc = 0;
	if (L->ahead) {
		pin_wait(L->ahead);
		batch_release(L->ahead);
		L->ahead = NULL;
	}
	if (L->running)
		rc = workers_stop(L, abort_workers ? 2.0 : 10.0, abort_workers);
	if (L->have_local)
		ti_free(&L->local);
	L->have_local = 0;
	free(L->order);
	free(L->task);
	L->order = NULL;
	L->task = NULL;
	dataset_free(&L->ds);
	return rc;
}

/* ---- the job ----------------------------------------------------------------------------- */

static struct {
	struct loader train, val;
	int have_val;
	FILE *rec;
	uint64_t seq; /* job-relative batch number, train and val */
	uint64_t train_batches, train_samples, val_batches, val_samples, val_passes;
	struct xxh64_state trained, device;
	char share_loader[64]; /* --tsshim: "train.<dataset fingerprint>.<size>" */
	int64_t *share_ids;    /* --tsshim: a batch's ids as tsshim_batch takes them */
} J;

static int step(double ms)
{
	if (ms <= 0)
		return 0;
	struct timespec end;
	clock_gettime(CLOCK_MONOTONIC, &end);
	long long ns = end.tv_nsec + (long long)(ms * 1e6);
	end.tv_sec += ns / 1000000000LL;
	end.tv_nsec = ns % 1000000000LL;
	if (opt.step_spin) {
		for (;;) {
			struct timespec t;
			if (g_signal)
				return -1;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec > end.tv_sec || (t.tv_sec == end.tv_sec && t.tv_nsec >= end.tv_nsec))
				return 0;
		}
	}
	for (;;) {
		int e = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &end, NULL);
		if (g_signal)
			return -1;
		if (e != EINTR)
			return 0;
	}
}

enum { SHARE_OWN, SHARE_PUB, SHARE_SERVED };
static const char *const share_name[] = {"own", "pub", "served"};

/*
 * --tsshim: hand a training batch to the shim right before its upload
 * (include/tsshim.h). On SERVED the shim has replaced the bytes of img and
 * lbl with the stream's: the caller uploads and records those. Without the
 * shim (tsshim_batch NULL), and for validation, the batch stays the job's.
 */
static int share_batch(const struct loader *L, const struct batch *b, void *img, void *lbl, uint64_t iter,
		       struct tsshim_where *at)
{
	if (!opt.tsshim || !L->train || !tsshim_batch)
		return SHARE_OWN;
	void *data[2] = {img, lbl};
	size_t bytes[2] = {b->img_bytes, b->lbl_bytes};
	unsigned flags = (iter == 0 ? TSSHIM_BATCH_FIRST : 0) | (iter + 1 == L->nbatches ? TSSHIM_BATCH_LAST : 0);
	for (uint32_t i = 0; i < b->n; i++)
		J.share_ids[i] = (int64_t)b->ids[i];
	int r = tsshim_batch(J.share_loader, 2, data, bytes, b->n, J.share_ids, L->ds.n, flags, at);
	if (r == TSSHIM_BATCH_PUBLISHED)
		return SHARE_PUB;
	return r == TSSHIM_BATCH_SERVED ? SHARE_SERVED : SHARE_OWN;
}

/* " KEY=H1,H2,..": per sample, XXH64 of its image bytes then its label
 * bytes, so that a verifier can follow single samples across jobs that
 * batch them differently. */
static void record_sample_hashes(FILE *f, const char *key, const struct batch *b, const void *img, const void *lbl)
{
	size_t ib = b->img_bytes / b->n, lb = b->lbl_bytes / b->n;
	fprintf(f, " %s=", key);
	for (uint32_t i = 0; i < b->n; i++) {
		struct xxh64_state h;
		xxh64_init(&h, 0);
		xxh64_update(&h, (const char *)img + i * ib, ib);
		xxh64_update(&h, (const char *)lbl + i * lb, lb);
		fprintf(f, i ? ",%016" PRIx64 : "%016" PRIx64, xxh64_digest(&h));
	}
}

/* What one batch line records besides the loader's batch. */
struct rec_batch {
	uint64_t epoch, pass, iter;
	const void *img, *lbl, *dimg, *dlbl; /* uploaded, and read back (--readback) */
	uint64_t h_img, h_lbl, d_img, d_lbl;
	int share;
	struct tsshim_where at;
};

static void record_batch(const struct loader *L, const struct batch *b, const struct rec_batch *r)
{
	FILE *f = J.rec;
	fprintf(f, "seq=%" PRIu64 " phase=%s epoch=%" PRIu64 " pass=%" PRIu64 " iter=%" PRIu64 " n=%u ids=", J.seq,
		L->name, r->epoch, r->pass, r->iter, b->n);
	for (uint32_t i = 0; i < b->n; i++)
		fprintf(f, i ? ",%" PRIu64 : "%" PRIu64, b->ids[i]);
	fputs(" labels=", f);
	for (uint32_t i = 0; i < b->n; i++) {
		int64_t v;
		memcpy(&v, (const char *)r->lbl + i * sizeof v, sizeof v);
		fprintf(f, i ? ",%" PRId64 : "%" PRId64, v);
	}
	fprintf(f, " img=%016" PRIx64 " lbl=%016" PRIx64, r->h_img, r->h_lbl);
	if (opt.readback)
		fprintf(f, " dimg=%016" PRIx64 " dlbl=%016" PRIx64, r->d_img, r->d_lbl);
	if (opt.tsshim) {
		fprintf(f, " share=%s", share_name[r->share]);
		if (r->share != SHARE_OWN)
			fprintf(f, " fseq=%" PRIu64 " fsamp=%" PRIu64, r->at.seq, r->at.sample);
		record_sample_hashes(f, "sh", b, r->img, r->lbl);
		if (opt.readback)
			record_sample_hashes(f, "dsh", b, r->dimg, r->dlbl);
	}
	fputc('\n', f);
	fflush(f);
}

/* Upload, checksum, record and step one batch. */
static int consume(struct loader *L, struct batch *b, uint64_t epoch, uint64_t pass, uint64_t iter)
{
	void *img = b->pin ? b->pin->img : b->img;
	void *lbl = b->pin ? b->pin->lbl : b->lbl;
	struct rec_batch r = {.epoch = epoch, .pass = pass, .iter = iter, .img = img, .lbl = lbl};
	if (capt_switch(1) < 0)
		return -1;
	r.share = share_batch(L, b, img, lbl, iter, &r.at);
	int sync, up = upload_queue(img, b->img_bytes, lbl, b->lbl_bytes, b->pin != NULL, &sync);
	if (capt_switch(0) < 0 || up < 0 || upload_wait(sync) < 0)
		return -1;
	/* What was handed to the copy is what was uploaded. */
	r.h_img = xxh64(img, b->img_bytes, 0);
	r.h_lbl = xxh64(lbl, b->lbl_bytes, 0);
	if (L->train) {
		xxh64_update(&J.trained, img, b->img_bytes);
		xxh64_update(&J.trained, lbl, b->lbl_bytes);
	}
	if (opt.readback) {
		if (readback(b->img_bytes, b->lbl_bytes, &r.dimg, &r.dlbl) < 0)
			return -1;
		r.d_img = xxh64(r.dimg, b->img_bytes, 0);
		r.d_lbl = xxh64(r.dlbl, b->lbl_bytes, 0);
		if (L->train) {
			xxh64_update(&J.device, r.dimg, b->img_bytes);
			xxh64_update(&J.device, r.dlbl, b->lbl_bytes);
		}
	}
	if (J.rec)
		record_batch(L, b, &r);
	J.seq++;
	if (L->train) {
		J.train_batches++;
		J.train_samples += b->n;
		if (opt.ctx_release_every && J.train_batches % opt.ctx_release_every == 0 && ctx_release_now() < 0)
			return -1;
	} else {
		J.val_batches++;
		J.val_samples += b->n;
	}
	return step(L->train ? opt.step_ms : opt.val_step_ms);
}

/* One pass over a loader: every batch, or the first `limit` (0: all). */
static int run_pass(struct loader *L, uint64_t epoch, uint64_t pass, uint64_t limit, int (*after)(uint64_t epoch))
{
	if (loader_begin(L, L->train ? epoch : pass) < 0)
		return -1;
	for (uint64_t it = 0;; it++) {
		struct batch *b;
		int r = loader_next(L, &b);
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		r = consume(L, b, epoch, pass, it);
		batch_release(b);
		if (r < 0)
			return -1;
		/* a break in the for loop over the DataLoader, or its end */
		if ((limit && it + 1 == limit) || it + 1 == L->nbatches)
			break;
		if (after && after(epoch) < 0)
			return -1;
	}
	return loader_end(L);
}

static int run_val(uint64_t epoch)
{
	uint64_t pass = J.val_passes++;
	return run_pass(&J.val, epoch, pass, 0, NULL);
}

/* After a training batch that is not its epoch's last: validation every
 * --val-every training batches of the job (the epoch-end pass covers the
 * last one). */
static int after_train_batch(uint64_t epoch)
{
	if (J.have_val && opt.val_every && J.train_batches % opt.val_every == 0)
		return run_val(epoch);
	return 0;
}

static int train(void)
{
	for (uint64_t epoch = 0; epoch < opt.epochs; epoch++) {
		if (run_pass(&J.train, epoch, epoch, opt.break_after, after_train_batch) < 0)
			return -1;
		if (J.have_val && run_val(epoch) < 0)
			return -1;
	}
	return 0;
}

/* ---- options --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: " PROG " [OPTIONS] ROOT\n"
"\n"
"The reference training program of tsshim, built like a PyTorch DataLoader job\n"
"(it knows nothing about tsshim). It reads an ImageFolder dataset with worker\n"
"processes, uploads every batch, and records what it trained on.\n"
"\n"
"Dataset\n"
"  ROOT                  training set: ROOT/<class>/<file>.jpg. Classes are the\n"
"                        subdirectories sorted by name (label = position);\n"
"                        samples are their .jpg/.jpeg files (any case, links\n"
"                        followed, not recursive) sorted by name, class by class.\n"
"                        A sample id is a position in that list.\n"
"  --val ROOT2           validation set, same layout (default: none). With it, a\n"
"                        validation pass runs after every epoch.\n"
"  --limit N             use only the first N training samples (default 0: all)\n"
"  --val-limit N         use only the first N validation samples (default 0: all)\n"
"  --size S              side of the output images in pixels, 1..%d (default 224)\n"
"\n"
"Loader\n"
"  --batch B             batch size, 1..%d (default 32); the last batch of an\n"
"                        epoch holds the rest (drop_last=False)\n"
"  --val-batch B         validation batch size (default: --batch)\n"
"  --workers N           worker processes per loader, 0..%d (default 2); 0 loads\n"
"                        in the main process\n"
"  --start fork|spawn    fork the workers, or fork and exec this program again\n"
"                        (like multiprocessing's spawn) (default fork)\n"
"  --persistent-workers  keep each loader's workers across epochs and passes\n"
"                        (default: start them for every pass, stop them after)\n"
"  --prefetch N          batches in flight per worker, 1..64 (default 2)\n"
"  --shm posix|memfd     shared memory for batches: shm_open + shm_unlink, as\n"
"                        PyTorch's file_descriptor strategy, or memfd_create\n"
"                        (default posix); passed to the main process as file\n"
"                        descriptors over a unix socketpair (SCM_RIGHTS)\n"
"  --timeout SEC         fail when a batch takes longer than SEC seconds (default\n"
"                        0: wait; a worker that dies is always detected at once)\n"
"  --pin                 copy each batch into page-locked memory before it is\n"
"                        used (pin_memory=True): cudaHostAlloc with --device\n"
"                        cuda, else mlock'ed memory where allowed; done by a\n"
"                        pinning thread while the previous batch trains\n"
"\n"
"Sampler\n"
"  --seed S              seed of the sampler and of the augmentation (default 0)\n"
"  --shuffle 0|1         shuffle the training set every epoch (default 1); the\n"
"                        validation set is never shuffled\n"
"\n"
"Training\n"
"  --epochs N            epochs (default 1)\n"
"  --device cpu|cuda     upload target (default cpu). cuda: libcudart loaded with\n"
"                        dlopen (libcudart.so.13, else libcudart.so), one\n"
"                        cudaMalloc'd buffer per tensor; pinned batches go\n"
"                        through cudaMemcpyAsync + cudaStreamSynchronize,\n"
"                        pageable ones through cudaMemcpy. cpu: memcpy into a\n"
"                        host buffer.\n"
"  --cudart LIB          the CUDA runtime library to dlopen instead (a build with\n"
"                        the runtime linked in, TRAIN_CUDART_LINKED, has none)\n"
"  --step-ms X           simulated training step per training batch, in ms\n"
"                        (default 0)\n"
"  --val-step-ms X       simulated step per validation batch, in ms (default 0)\n"
"  --step-spin           spin during steps instead of sleeping\n"
"  --val-every K         also validate after every K-th training batch of the job\n"
"                        (counted across epochs), except after an epoch's last\n"
"                        batch (default 0: only at epoch ends; needs --val)\n"
"  --break-after K       leave each epoch after K batches, like `break` in the\n"
"                        loop over the loader (default 0: never)\n"
"  --gpu N               with --device cuda: the CUDA device to use (default 0)\n"
"  --labels-on-host      with --device cuda: upload the images only; the labels\n"
"                        stay on the host (a loss taken there); --readback then\n"
"                        reads them from there\n"
"  --upload-pattern P    with --device cuda: how a batch's tensors go up; what\n"
"                        ends on the device is the same (default whole):\n"
"                        whole: one copy per tensor, images then labels\n"
"                        halves: each tensor in two copies\n"
"                        repeat: the images' first half twice, then the\n"
"                        labels, then the images' second half\n"
"                        side-stream: the images on the job's stream, the\n"
"                        labels on a second stream (both cudaMemcpyAsync)\n"
"                        late-labels: the labels of the first " STR(LATE_LABELS_UPLOADS) " batches stay\n"
"                        on the host (as --labels-on-host), later ones go up\n"
"  --graph               with --device cuda --pin --workers 0: capture each\n"
"                        batch's uploads on the job's stream into a CUDA graph\n"
"                        (cudaStreamBeginCapture, global mode), instantiate it\n"
"                        and launch it there, as torch.cuda.graphs does; a\n"
"                        capture that ends invalidated fails the job\n"
"  --capture-thread      with --device cuda --pin --workers 0: a second thread\n"
"                        holds a CUDA graph capture open (global mode, on a\n"
"                        stream of its own) while each batch is handed to the\n"
"                        shim and its uploads are queued; the job fails when\n"
"                        that capture ends invalidated\n"
"  --peer-probe N        with --device cuda: after training, disable peer access\n"
"                        to device N, enable it, disable it, disable it again,\n"
"                        and print what each call answered (pre=705 enable=0\n"
"                        disable=0 again=705 where the devices are peers: the\n"
"                        shim must not change that)\n"
"  --peer-early          with --peer-probe N: also enable peer access to device N\n"
"                        before training (early=0; then pre=0)\n"
"  --device-reset        with --device cuda: call cudaDeviceReset() after the\n"
"                        device buffers are freed, before the end, as CUDA's\n"
"                        samples end main (its primary context goes, and all\n"
"                        its memory with it); a failure fails the job\n"
"  --own-context         with --device cuda: make a context of the job's own with\n"
"                        the driver's cuCtxCreate (current on the main thread:\n"
"                        the job's device memory, streams and uploads live in\n"
"                        it) and destroy it with cuCtxDestroy after the device\n"
"                        buffers are freed, before the end, as a driver-API\n"
"                        program does (all its memory goes with it); a failure\n"
"                        fails the job\n"
"  --ctx-release-every N with --device cuda: after every N training batches,\n"
"                        retain and release the device's primary context through\n"
"                        the driver API (the runtime's own retain keeps it alive)\n"
"  --readback            copy each uploaded batch back from the device and record\n"
"                        its checksums too (dimg=, dlbl=, device_checksum=)\n"
"  --tsshim              hand every training batch to the shim right before its\n"
"                        upload: tsshim_batch() of include/tsshim.h, loader\n"
"                        \"train.<dataset fingerprint>.<size>\". The shim may\n"
"                        publish the batch, or replace its bytes with the\n"
"                        session's stream (then those are uploaded, checksummed\n"
"                        and recorded). Validation batches stay the job's own.\n"
"                        Without the shim (the symbol is weak) nothing changes\n"
"                        but the record's extra fields (share=own).\n"
"\n"
"Output\n"
"  --record FILE         write one line per batch (train and validation):\n"
"      seq=S phase=train|val epoch=E pass=P iter=I n=N ids=A,B,.. labels=L,M,..\n"
"      img=HEX lbl=HEX [dimg=HEX dlbl=HEX]\n"
"                        seq: job-relative batch number from 0; epoch: training\n"
"                        epoch (for val, the epoch it ran in); pass: the epoch\n"
"                        (train) or the validation pass number from 0 (val);\n"
"                        iter: batch number within the pass; ids: sample ids in\n"
"                        batch order as this job's sampler chose them; labels:\n"
"                        the uploaded label tensor; img, lbl: XXH64 (seed 0) of\n"
"                        the uploaded bytes of the images (float32 [N,3,S,S],\n"
"                        normalised, CHW) and of the labels (int64 [N]), both\n"
"                        little-endian, 16 hex digits.\n"
"      with --tsshim also: share=own|pub|served [fseq=F fsamp=K] sh=H1,H2,..\n"
"      [dsh=H1,H2,..]\n"
"                        share: own (the job's batch: no shim, a validation\n"
"                        batch, or the shim kept out), pub (published into the\n"
"                        stream), served (the stream's samples replaced it);\n"
"                        fseq, fsamp (pub and served): the stream batch and the\n"
"                        index within it of the first sample; sh: per sample,\n"
"                        XXH64 (seed 0) of its image bytes then its 8 label\n"
"                        bytes as uploaded; dsh (with --readback): the same of\n"
"                        the bytes read back from the device. tsshim-verify\n"
"                        checks such records of the jobs of one session.\n"
"                        Lines starting with '#' are comments: a header with the\n"
"                        options that change the data (with --tsshim also\n"
"                        tsshim_loader=NAME), and a final '# end ...' line on\n"
"                        success.\n"
"  --help                this text\n"
"\n"
"At the end, on stdout:\n"
"  " PROG ": batches=N samples=M trained_checksum=HEX\n"
"batches and samples of the training phase; trained_checksum is XXH64 (seed 0)\n"
"of the concatenation, in training order, of every training batch's image bytes\n"
"then label bytes as uploaded (validation batches are not included). On stderr:\n"
"wall time and samples/s.\n"
"\n"
"Per sample (in a worker): open/fstat/read the file, decode with libjpeg (to\n"
"RGB, grayscale included); train: RandomResizedCrop(S, scale 0.08-1, ratio 3/4-\n"
"4/3, 10 attempts, then a centre crop), bilinear resize (antialiased, as\n"
"Pillow), horizontal flip with p=0.5; val: resize the shorter side to S*256/224,\n"
"centre crop S; then ToTensor + Normalize(ImageNet mean/std). The sampler uses\n"
"splitmix64 + Fisher-Yates seeded with seed+epoch; each sample's augmentation a\n"
"splitmix64 generator derived from (seed, epoch, sample id) only, so results do\n"
"not depend on workers, start method, pinning or timing (see\n"
"tools/train_hash.h and tools/train_image.h). A file that cannot be read or\n"
"decoded (libjpeg warnings included) stops the job with its name.\n"
"\n"
"Exit status: 0 done, 1 error (a clear message on stderr; a worker that dies is\n"
"reported with its pid and signal), 2 bad usage, 128+signal after SIGINT or\n"
"SIGTERM (workers are stopped, nothing is left behind).\n",
		MAX_SIZE, MAX_BATCH, MAX_WORKERS);
}

__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '" PROG " --help'.\n");
	exit(2);
}

static uint64_t parse_u64(const char *name, const char *s, uint64_t min, uint64_t max)
{
	char range[96];
	snprintf(range, sizeof range, "an integer from %" PRIu64 " to %" PRIu64, min, max);
	if (!*s || strspn(s, "0123456789") != strlen(s))
		goto bad;
	errno = 0;
	uint64_t v = strtoull(s, NULL, 10);
	if (errno == ERANGE || v < min || v > max)
		goto bad;
	return v;
bad:
	bad_usage("--%s: expected %s, got '%s'", name, range, s);
}

static double parse_num(const char *name, const char *s, const char *unit)
{
	char *end;
	errno = 0;
	/* plain decimal (the README's rule for numbers): strtod alone takes hex, spaces, inf */
	int plain = *s && strspn(s, "0123456789.") == strlen(s);
	double v = strtod(s, &end);
	if (!plain || *end || errno || !(v >= 0) || v > 1e9)
		bad_usage("--%s: expected a number of %s >= 0, got '%s'", name, unit, s);
	return v;
}

static int parse_choice(const char *name, const char *s, const char *a, const char *b)
{
	if (!strcmp(s, a))
		return 0;
	if (!strcmp(s, b))
		return 1;
	bad_usage("--%s: expected %s or %s, got '%s'", name, a, b, s);
}

static int parse_pattern(const char *s)
{
	static const char *const names[] = {"whole", "halves", "repeat", "side-stream", "late-labels"};
	for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
		if (!strcmp(s, names[i]))
			return i;
	bad_usage("--upload-pattern: expected whole, halves, repeat, side-stream or late-labels, got '%s'", s);
}

static void parse_args(int argc, char **argv)
{
	enum {
		O_VAL = 256, O_LIMIT, O_VAL_LIMIT, O_SIZE, O_BATCH, O_VAL_BATCH, O_WORKERS, O_START, O_PERSIST,
		O_PREFETCH, O_SHM, O_TIMEOUT, O_PIN, O_SEED, O_SHUFFLE, O_EPOCHS, O_DEVICE, O_CUDART, O_STEP,
		O_VAL_STEP, O_SPIN, O_VAL_EVERY, O_BREAK, O_GPU, O_READBACK, O_LABELS_HOST, O_UPLOAD, O_TSSHIM, O_RECORD, O_HELP, O_WORKER_FD,
		O_GRAPH, O_CAPTURE_THREAD, O_PEER_PROBE, O_PEER_EARLY, O_DEVICE_RESET, O_CTX_RELEASE, O_OWN_CONTEXT,
	};
	static const struct option lo[] = {
		{"val", required_argument, 0, O_VAL},
		{"limit", required_argument, 0, O_LIMIT},
		{"val-limit", required_argument, 0, O_VAL_LIMIT},
		{"size", required_argument, 0, O_SIZE},
		{"batch", required_argument, 0, O_BATCH},
		{"val-batch", required_argument, 0, O_VAL_BATCH},
		{"workers", required_argument, 0, O_WORKERS},
		{"start", required_argument, 0, O_START},
		{"persistent-workers", no_argument, 0, O_PERSIST},
		{"prefetch", required_argument, 0, O_PREFETCH},
		{"shm", required_argument, 0, O_SHM},
		{"timeout", required_argument, 0, O_TIMEOUT},
		{"pin", no_argument, 0, O_PIN},
		{"seed", required_argument, 0, O_SEED},
		{"shuffle", required_argument, 0, O_SHUFFLE},
		{"epochs", required_argument, 0, O_EPOCHS},
		{"device", required_argument, 0, O_DEVICE},
		{"cudart", required_argument, 0, O_CUDART},
		{"step-ms", required_argument, 0, O_STEP},
		{"val-step-ms", required_argument, 0, O_VAL_STEP},
		{"step-spin", no_argument, 0, O_SPIN},
		{"val-every", required_argument, 0, O_VAL_EVERY},
		{"break-after", required_argument, 0, O_BREAK},
		{"gpu", required_argument, 0, O_GPU},
		{"readback", no_argument, 0, O_READBACK},
		{"labels-on-host", no_argument, 0, O_LABELS_HOST},
		{"upload-pattern", required_argument, 0, O_UPLOAD},
		{"graph", no_argument, 0, O_GRAPH},
		{"capture-thread", no_argument, 0, O_CAPTURE_THREAD},
		{"peer-probe", required_argument, 0, O_PEER_PROBE},
		{"peer-early", no_argument, 0, O_PEER_EARLY},
		{"device-reset", no_argument, 0, O_DEVICE_RESET},
		{"ctx-release-every", required_argument, 0, O_CTX_RELEASE},
		{"own-context", no_argument, 0, O_OWN_CONTEXT},
		{"tsshim", no_argument, 0, O_TSSHIM},
		{"record", required_argument, 0, O_RECORD},
		{"help", no_argument, 0, O_HELP},
		{"worker-fd", required_argument, 0, O_WORKER_FD},
		{0, 0, 0, 0},
	};
	int c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		const char *a = optarg;
		switch (c) {
		case O_VAL: opt.val_root = a; break;
		case O_LIMIT: opt.limit = parse_u64("limit", a, 0, UINT64_MAX / 2); break;
		case O_VAL_LIMIT: opt.val_limit = parse_u64("val-limit", a, 0, UINT64_MAX / 2); break;
		case O_SIZE: opt.size = (unsigned)parse_u64("size", a, 1, MAX_SIZE); break;
		case O_BATCH: opt.batch = (unsigned)parse_u64("batch", a, 1, MAX_BATCH); break;
		case O_VAL_BATCH: opt.val_batch = (unsigned)parse_u64("val-batch", a, 1, MAX_BATCH); break;
		case O_WORKERS: opt.workers = (int)parse_u64("workers", a, 0, MAX_WORKERS); break;
		case O_START: opt.start = parse_choice("start", a, "fork", "spawn"); break;
		case O_PERSIST: opt.persistent = 1; break;
		case O_PREFETCH: opt.prefetch = (unsigned)parse_u64("prefetch", a, 1, 64); break;
		case O_SHM: opt.shm = parse_choice("shm", a, "posix", "memfd"); break;
		case O_TIMEOUT: opt.timeout_s = parse_num("timeout", a, "seconds"); break;
		case O_PIN: opt.pin = 1; break;
		case O_SEED: opt.seed = parse_u64("seed", a, 0, UINT64_MAX); break;
		case O_SHUFFLE: opt.shuffle = (int)parse_u64("shuffle", a, 0, 1); break;
		case O_EPOCHS: opt.epochs = parse_u64("epochs", a, 0, 1000000000); break;
		case O_DEVICE: opt.device = parse_choice("device", a, "cpu", "cuda"); break;
		case O_CUDART: opt.cudart = a; break;
		case O_STEP: opt.step_ms = parse_num("step-ms", a, "milliseconds"); break;
		case O_VAL_STEP: opt.val_step_ms = parse_num("val-step-ms", a, "milliseconds"); break;
		case O_SPIN: opt.step_spin = 1; break;
		case O_VAL_EVERY: opt.val_every = parse_u64("val-every", a, 0, UINT64_MAX / 2); break;
		case O_BREAK: opt.break_after = parse_u64("break-after", a, 0, UINT64_MAX / 2); break;
		case O_GPU: opt.gpu = (int)parse_u64("gpu", a, 0, 63); break;
		case O_READBACK: opt.readback = 1; break;
		case O_LABELS_HOST: opt.labels_on_host = 1; break;
		case O_UPLOAD: opt.upload = parse_pattern(a); break;
		case O_GRAPH: opt.graph = 1; break;
		case O_CAPTURE_THREAD: opt.capture_thread = 1; break;
		case O_PEER_PROBE: opt.peer_probe = (int)parse_u64("peer-probe", a, 0, 63); break;
		case O_PEER_EARLY: opt.peer_early = 1; break;
		case O_DEVICE_RESET: opt.device_reset = 1; break;
		case O_OWN_CONTEXT: opt.own_context = 1; break;
		case O_CTX_RELEASE: opt.ctx_release_every = parse_u64("ctx-release-every", a, 1, UINT32_MAX); break;
		case O_TSSHIM: opt.tsshim = 1; break;
		case O_RECORD: opt.record = a; break;
		case O_HELP: usage(stdout); exit(0);
		case O_WORKER_FD: bad_usage("--worker-fd is internal: it is how spawned workers start");
		case ':': bad_usage("%s: missing value", argv[optind - 1]);
		default: /* a short one inside a cluster (-xy) is not argv[optind - 1] itself */
			if (optopt && optopt != '?')
				bad_usage("unknown option '-%c'", optopt);
			bad_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		bad_usage("missing ROOT (the training set)");
	if (optind != argc - 1)
		bad_usage("one ROOT expected, got also '%s'", argv[optind + 1]);
	opt.root = argv[optind];
	if (!opt.val_batch)
		opt.val_batch = opt.batch;
	if (opt.val_every && !opt.val_root)
		bad_usage("--val-every needs --val ROOT2");
	/* pageable copies, and a pinning thread's cudaHostAlloc, are not allowed while a capture is open */
	if ((opt.graph || opt.capture_thread) && (opt.device != DEV_CUDA || !opt.pin || opt.workers))
		bad_usage("--graph and --capture-thread need --device cuda --pin --workers 0");
	if (opt.peer_probe >= 0 && opt.device != DEV_CUDA)
		bad_usage("--peer-probe needs --device cuda");
	if (opt.peer_early && opt.peer_probe < 0)
		bad_usage("--peer-early needs --peer-probe N");
	if (opt.device_reset && opt.device != DEV_CUDA)
		bad_usage("--device-reset needs --device cuda");
	if (opt.own_context && opt.device != DEV_CUDA)
		bad_usage("--own-context needs --device cuda");
	if (opt.own_context && (opt.capture_thread || opt.device_reset || opt.ctx_release_every))
		bad_usage("--own-context goes with none of --capture-thread, --device-reset, --ctx-release-every");
	if (opt.ctx_release_every && opt.device != DEV_CUDA)
		bad_usage("--ctx-release-every needs --device cuda");
	if ((opt.graph || opt.capture_thread) && opt.upload == UP_SIDE_STREAM)
		bad_usage("--graph and --capture-thread: not with --upload-pattern side-stream (it synchronises a "
			  "stream while the capture is open)");
	/* images of a full batch: at most 16 GiB */
	if ((uint64_t)opt.batch * 3 * opt.size * opt.size * 4 > (16ULL << 30) ||
	    (uint64_t)opt.val_batch * 3 * opt.size * opt.size * 4 > (16ULL << 30))
		bad_usage("--batch x --size too large: a batch would exceed 16 GiB");
}

/* ---- main ------------------------------------------------------------------------------ */

static void on_signal(int sig) { g_signal = sig; }

static int loader_setup(struct loader *L, const char *name, const char *root, uint64_t limit, unsigned batch,
			int train_kind)
{
	char err[ERRLEN];
	memset(L, 0, sizeof *L);
	L->name = name;
	L->train = train_kind;
	L->batch = batch;
	L->limit = limit;
	L->nworkers = opt.workers;
	for (int i = 0; i < MAX_WORKERS; i++)
		L->w[i].fd = -1;
	if (dataset_scan(&L->ds, root, limit, err, sizeof err) < 0) {
		fprintf(stderr, PROG ": %s\n", err);
		return -1;
	}
	return 0;
}

/* --tsshim: the loader name (the dataset and the transforms: jobs that
 * name the same loader share one stream) and the ids buffer. */
static int share_setup(void)
{
	snprintf(J.share_loader, sizeof J.share_loader, "train.%016" PRIx64 ".%u", J.train.ds.fp, opt.size);
	J.share_ids = malloc(opt.batch * sizeof *J.share_ids);
	if (!J.share_ids) {
		fprintf(stderr, PROG ": out of memory\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--worker-fd"))
		return spawned_worker_main(argv[2]);
	if (argc > 0)
		g_argv0 = argv[0];
	parse_args(argc, argv);

	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (opt.start == START_SPAWN) {
		ssize_t n = readlink("/proc/self/exe", g_self_exe, sizeof g_self_exe - 1);
		if (n <= 0) {
			fprintf(stderr, PROG ": --start spawn: cannot find this program (/proc/self/exe): %s\n",
				strerror(errno));
			return 1;
		}
		g_self_exe[n] = 0;
	}

	int rc = 1;
	double t0 = now_s(), t1;
	size_t per = (size_t)3 * opt.size * opt.size * sizeof(float);
	unsigned maxb = opt.batch > opt.val_batch ? opt.batch : opt.val_batch;
	if (loader_setup(&J.train, "train", opt.root, opt.limit, opt.batch, 1) < 0)
		goto out;
	if (opt.val_root) {
		J.have_val = 1;
		if (loader_setup(&J.val, "val", opt.val_root, opt.val_limit, opt.val_batch, 0) < 0)
			goto out;
	}
	/* Like model.cuda(): the device is set up before any worker starts. */
	if (device_init(maxb * per, maxb * sizeof(int64_t)) < 0)
		goto out;
	if (opt.pin)
		pin_start(maxb * per, maxb * sizeof(int64_t));
	if (opt.tsshim && share_setup() < 0)
		goto out;
	if (opt.record) {
		J.rec = fopen(opt.record, "we");
		if (!J.rec) {
			fprintf(stderr, PROG ": --record %s: %s\n", opt.record, strerror(errno));
			goto out;
		}
		/* readback=1: every batch line has dsh=, and tsshim-verify holds it to that */
		fprintf(J.rec, "# tsshim-train record v1 readback=%d\n# root=%s samples=%zu classes=%zu",
			opt.readback && opt.tsshim ? 1 : 0, opt.root, J.train.ds.n, J.train.ds.nclasses);
		if (J.have_val)
			fprintf(J.rec, " val=%s val_samples=%zu", opt.val_root, J.val.ds.n);
		fprintf(J.rec,
			" size=%u batch=%u val_batch=%u seed=%" PRIu64 " shuffle=%d epochs=%" PRIu64
			" limit=%" PRIu64 " val_limit=%" PRIu64 " val_every=%" PRIu64 " break_after=%" PRIu64 "\n",
			opt.size, opt.batch, opt.val_batch, opt.seed, opt.shuffle, opt.epochs, opt.limit,
			opt.val_limit, opt.val_every, opt.break_after);
		if (opt.tsshim)
			fprintf(J.rec, "# tsshim_loader=%s\n", J.share_loader);
		fflush(J.rec);
	}
	xxh64_init(&J.trained, 0);
	xxh64_init(&J.device, 0);
	t0 = now_s();
	if (train() == 0)
		rc = 0;
	if (rc == 0 && opt.peer_probe >= 0)
		peer_probe();
out:
	t1 = now_s();
	/* Normal end: workers get 10 s to finish; on errors and signals 2 s
	 * (they stop between samples once their socket is closed). */
	int abort_workers = rc != 0 || g_signal;
	if (loader_close(&J.train, abort_workers) < 0 || loader_close(&J.val, abort_workers) < 0)
		rc = 1; /* a persistent worker died on its own */
	pin_stop();
	device_free();
	if (own_context_end() < 0)
		rc = rc ? rc : 1;
	if (cu.DeviceReset && cuda_ok(cu.DeviceReset(), "cudaDeviceReset (--device-reset)") < 0) /* (resolved for it only) */
		rc = rc ? rc : 1;
	free(J.share_ids);
	if (g_signal) {
		fprintf(stderr, PROG ": interrupted by signal %d (%s); workers stopped\n", (int)g_signal,
			strsignal(g_signal));
		rc = 128 + g_signal;
	}
	uint64_t trained = xxh64_digest(&J.trained);
	if (J.rec) {
		if (rc == 0) {
			fprintf(J.rec, "# end batches=%" PRIu64 " samples=%" PRIu64 " trained_checksum=%016" PRIx64,
				J.train_batches, J.train_samples, trained);
			if (opt.readback)
				fprintf(J.rec, " device_checksum=%016" PRIx64, xxh64_digest(&J.device));
			fputc('\n', J.rec);
		}
		if ((ferror(J.rec) | fclose(J.rec)) && rc == 0) {
			fprintf(stderr, PROG ": --record %s: write error: %s\n", opt.record, strerror(errno));
			rc = 1;
		}
	}
	if (rc == 0) {
		printf(PROG ": batches=%" PRIu64 " samples=%" PRIu64 " trained_checksum=%016" PRIx64, J.train_batches,
		       J.train_samples, trained);
		if (opt.readback)
			printf(" device_checksum=%016" PRIx64, xxh64_digest(&J.device));
		printf("\n");
		double wall = t1 - t0;
		fprintf(stderr,
			PROG ": wall %.3f s, %.1f train samples/s (%" PRIu64 " train samples in %" PRIu64
			" batches; %" PRIu64 " val samples in %" PRIu64 " batches, %" PRIu64 " passes)\n",
			wall, wall > 0 ? J.train_samples / wall : 0.0, J.train_samples, J.train_batches, J.val_samples,
			J.val_batches, J.val_passes);
		if (fflush(stdout) != 0) {
			fprintf(stderr, PROG ": stdout: %s\n", strerror(errno));
			rc = 1;
		}
	}
	return rc;
}

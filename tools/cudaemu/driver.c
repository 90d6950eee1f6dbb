/* tsemu: the tsshim test device, driver half (build/emu/libcuda.so.1).
 *
 * A CPU emulation of the CUDA 13 driver API subset tsshim uses, so the shim's
 * CUDA path can be tested on machines without a GPU. It is not a GPU: there
 * are no kernels. What it keeps from real CUDA is what an interposer can get
 * wrong: entry points and their versioned names (cuGetProcAddress), stream
 * ordering and asynchrony, events, IPC across processes, pinned memory,
 * pointer attributes, fork behaviour and error codes.
 *
 * Model
 *  - Entry points: cuGetProcAddress hands out this library's own functions.
 *    The library is linked with -Bsymbolic-functions, so its table is bound
 *    at link time, as the real libcuda's is: a preloaded library that
 *    exports a driver name does not stand in for what it hands out.
 *  - Devices: TSEMU_DEVICES (0..16, default 2), each with a primary context
 *    and TSEMU_MEM_MB of memory (default 16384). Peer access between any two.
 *  - Device memory: one memfd per allocation. The device pointer is the
 *    address of a PROT_NONE reservation (so the host cannot dereference it,
 *    as on a real GPU); the bytes live in a second, shared mapping of the
 *    memfd. Bases are page aligned (>= 256 bytes, as CUDA promises).
 *  - IPC: a memory handle names the exporter's pid, the memfd's descriptor
 *    number and inode; the importer opens /proc/PID/fd/N (same user only)
 *    and maps it. The page after the allocation's bytes lists the processes
 *    that have it open; an exporter's cuMemFree while one of them lives is
 *    undefined behaviour on CUDA: tsemu says so, counts it
 *    (ipc_freed_while_open) and overwrites the bytes, as a reuse would.
 *    An exporter's exit destroys its context and its memory goes with it
 *    (PyTorch: "automatically freed upon the producer's exit"): what a live
 *    process still has open is overwritten then too (ipc_lost_at_exit). A
 *    copy that reads memory so lost is counted by its reader
 *    (ipc_read_lost). A killed exporter runs nothing: its memory is kept
 *    while open, as ipc-dead checks (what a real driver does, it prints).
 *    A primary context reset (cuDevicePrimaryCtxReset, cudaDeviceReset) or
 *    released for the last time is destroyed the same way, memory and all,
 *    and so is a context the program made (cuCtxCreate) at its cuCtxDestroy.
 *  - Contexts: a primary context per device, and up to MAXCTX the program
 *    makes (cuCtxCreate v2/v3/v4; never reused in a process). Each thread
 *    has a stack of contexts (CTX_STACK deep), the current one on top:
 *    cuCtxCreate and cuCtxPushCurrent push, cuCtxPopCurrent pops,
 *    cuCtxSetCurrent replaces the top (NULL pops), cuCtxDestroy of the
 *    current one pops it. A destroyed context's handle is invalid in every
 *    thread (CUDA_ERROR_INVALID_CONTEXT); one left on a thread's stack is
 *    popped at that thread's next call.
 *  - Streams: one worker thread per stream executes its queue in order.
 *    Copies run there, so a pinned source changed after an async copy and
 *    before synchronisation shows. The legacy default stream synchronises
 *    with every blocking stream of its context; the per-thread default
 *    stream is a blocking stream of each thread.
 *  - Events: a record counter and a completion counter (plus a futex word);
 *    for CU_EVENT_INTERPROCESS events they live in a shared memfd page, so
 *    an importer's cuStreamWaitEvent waits for the exporter's work.
 *  - Host/device synchronisation of copies follows the CUDA documentation
 *    ("API synchronization behavior"): see copy_blocks().
 *  - Stream capture (cuStreamBeginCapture): what is pushed into a capturing
 *    stream is appended to its graph instead of run; cuGraphLaunch replays
 *    the graph's copies on the launch stream, reading memory then. The rules
 *    of the CUDA documentation are kept: what waits for a capturing stream,
 *    depends on work outside its capture, or uses the legacy stream beside
 *    a blocking capture fails and invalidates the capture; "potentially
 *    unsafe" calls (allocation, freeing, IPC opens, synchronous copies,
 *    synchronisations and queries) fail in a thread the capture modes bar
 *    (cuThreadExchangeStreamCaptureMode), invalidating the captures that bar
 *    it. One stream per capture: a stream that waits on an event recorded in
 *    a capture, which would join it on CUDA, is refused (not modelled).
 *
 * Environment: TSEMU_DEVICES, TSEMU_MEM_MB, TSEMU_H2D_GBPS, TSEMU_D2H_GBPS
 * (default: the H2D rate), TSEMU_D2D_GBPS, TSEMU_PEER_GBPS (default: the D2D
 * rate), TSEMU_STREAM_DELAY_US (every stream operation waits this long before
 * it runs), TSEMU_STATS=FILE, TSEMU_TRACE=1 (cuGetProcAddress lookups) or 2
 * (every call), TSEMU_GETPROC_DENY=name,name (cuGetProcAddress reports these
 * base names as not found: a test knob), TSEMU_DEAD_EVENTS=pending (a record
 * whose recorder died pending never completes; default: it completes).
 *
 * Built with __CUDA_API_VERSION_INTERNAL so that cuda.h declares every name
 * this library defines, versioned (_v2), legacy (v1) and per-thread
 * (_ptds/_ptsz) alike, with the exact prototypes of the CUDA headers. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "tsemu.h"

#define API __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("global-dynamic")))

#define DRIVER_VERSION 13000
#define MAXDEV 16
#define MAXCTX 64 /* contexts a process makes (cuCtxCreate), never reused */
#define CTX_MAGIC 0x54435458u /* "TCTX" */
#define STREAM_MAGIC 0x5453544du
#define EVENT_MAGIC 0x5445564eu
#define EVSH_MAGIC 0x54455653u
#define GRAPH_MAGIC 0x54475248u
#define GEXEC_MAGIC 0x54474558u
#define IPC_MAGIC "TSEM"
#define IPC_VERSION 1

/* ---- state ------------------------------------------------------------------------ */

enum { M_DEV = 1, M_IPC, M_HOSTALLOC, M_HOSTREG };

struct ctx {
	uint32_t magic;   /* CTX_MAGIC while the context lives */
	int dev;
	int made;         /* made by the program (cuCtxCreate): G.made[made - 1] */
	int refs;   /* primary context retains */
	int active; /* retained at least once */
	uint32_t peers; /* devices this context has enabled peer access to */
	struct stream *legacy;
};

struct mem {
	int kind, dev;
	struct ctx *ctx;
	uintptr_t base; /* user-visible address */
	size_t size;
	char *data;     /* where the bytes are (== base for host memory) */
	size_t maplen;  /* device kinds: reservation and data mapping length */
	int fd;         /* M_DEV: the memfd (kept for IPC export) */
	uint64_t ino, id;
	unsigned flags;
	int refs;       /* the table's + in-flight operations' */
	int opens;      /* M_IPC: cuIpcOpenMemHandle count */
	pid_t peer_pid; /* M_IPC: exporter */
	uint64_t peer_id;
	struct importers *imp; /* M_IPC: the exporter's list, mapped; NULL if we are not on it */
	int imp_slot;
};

/*
 * The page that follows an allocation's bytes in its memfd: who has it
 * open through IPC. An importer takes a slot (its pid) at its first open
 * and gives it back when its mapping goes; a process that dies keeps its
 * slot, and its pid, which reads as dead.
 */
#define IMPORTERS 64
struct importers {
	int32_t pid[IMPORTERS];
	uint32_t lost; /* the exporter freed the memory or exited: what it holds now is garbage */
};

enum { OP_COPY = 1, OP_MEMSET, OP_RECORD, OP_WAITEV, OP_MARK, OP_HOSTFN };
enum { D_H2D, D_D2H, D_D2D, D_PEER, D_H2H };

struct dep {
	struct stream *s;
	uint64_t seq;
};

struct op {
	struct op *next;
	int kind;
	uint64_t seq;
	struct dep *deps;
	int ndeps, capdeps;
	/* copy / memset */
	char *dst;
	const char *src;
	size_t n;
	int dir;
	unsigned char value;
	char *staging; /* owned copy of a pageable source */
	struct mem *m[2];
	/* record / wait */
	struct event *ev;
	uint64_t gen;
	/* host function */
	CUhostFn fn;
	void *user;
};

enum { S_USER = 1, S_LEGACY, S_PTDS };

struct stream {
	uint32_t magic;
	int kind;
	unsigned flags;
	struct ctx *ctx;
	struct op *head, *tail;
	uint64_t submitted, completed;
	int refs;      /* handle (or owner) + dependencies naming it */
	int destroyed; /* no more work accepted; worker drains then ends */
	int started, finished, joined;
	pthread_t th;
	pthread_cond_t cv;
	struct capture *cap; /* capturing: its operations go to cap's graph */
	struct stream *next_all;
};

/* An event's state: private memory, or a shared memfd page (interprocess). */
struct evsh {
	uint32_t magic, version;
	uint64_t recorded; /* generation of the latest record (API call) */
	uint64_t done;     /* highest generation completed */
	uint64_t done_ns;  /* CLOCK_MONOTONIC of the latest completion */
	uint32_t futex;    /* bumped at every completion */
	int32_t recorder;  /* pid of the latest recorder */
};

struct event {
	uint32_t magic;
	unsigned flags;
	struct ctx *ctx;
	struct evsh *sh;
	int fd; /* exporter: memfd of the shared page; -1 otherwise */
	uint64_t ino, id;
	int imported;
	pid_t peer_pid;
	int refs, destroyed;
	uint64_t cap_id; /* its last record was in the capture of this id: it stands for no work that runs */
	struct event *next_all;
};

/* A graph: nodes (operations) in capture order; instantiated, an executable graph. */
struct graph {
	uint32_t magic; /* GRAPH_MAGIC, GEXEC_MAGIC */
	struct op *head, *tail;
	CUgraphNode last; /* tail as a node handle: what the next node captured depends on */
	struct graph *next_all;
};

/* A capture sequence, begun on one stream (its only stream here). */
struct capture {
	uint64_t id;
	CUstreamCaptureMode mode; /* as begun: which threads it bars from unsafe calls */
	int invalid;              /* a rule was broken: cuStreamEndCapture fails */
	pthread_t thread;         /* the thread that began it */
	struct ctx *ctx;
	int blocking;             /* of a blocking stream: the legacy stream is unusable meanwhile */
	struct graph *g;
	struct capture *next_all;
};

struct ipc_handle { /* fits CU_IPC_HANDLE_SIZE (64) bytes */
	char magic[4];
	uint8_t kind; /* 'M' memory, 'E' event */
	uint8_t dev;
	uint16_t version;
	int32_t pid;
	int32_t fd;
	uint32_t uid;
	uint32_t pad;
	uint64_t ino;
	uint64_t size;
	uint64_t id;
};
_Static_assert(sizeof(struct ipc_handle) <= CU_IPC_HANDLE_SIZE, "IPC handle too large");

static struct {
	pthread_mutex_t mu;
	pthread_cond_t done; /* broadcast when an operation completes or a worker ends */
	pthread_once_t once;
	int inited, forked, stopping;
	CUresult init_rc;
	pid_t pid;
	int ndev;
	size_t mem_total;
	double rate[5]; /* bytes/s per direction; 0: no delay */
	long delay_us;
	int ctxless; /* TSEMU_CTXLESS: device memory belongs to no context (see cuPointerGetAttribute) */
	int dead_pending; /* TSEMU_DEAD_EVENTS=pending: a dead recorder's pending record never completes */
	int trace;
	char *deny;
	struct ctx ctx[MAXDEV];
	struct ctx made[MAXCTX]; /* cuCtxCreate's, in order */
	int nmade;
	size_t used[MAXDEV];
	struct mem **mems; /* sorted by base, non-overlapping spans */
	size_t nmem, capmem;
	struct stream *streams;
	struct event *events;
	struct capture *captures; /* open capture sequences */
	int ncaptures;            /* how many: read without G.mu, to skip the checks */
	struct graph *graphs;     /* graphs and executable graphs the program holds */
	uint64_t next_id;
	pthread_key_t ptds_key;
	struct tsemu_stats st;
} G = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
	.once = PTHREAD_ONCE_INIT,
};

static TLS struct ctx *tls_ctx;              /* the current context: the top of tls_stack */
#define CTX_STACK 32
static TLS struct ctx *tls_stack[CTX_STACK];
static TLS int tls_depth;
static TLS CUstreamCaptureMode tls_capmode; /* cuThreadExchangeStreamCaptureMode; 0 is GLOBAL */
static TLS struct stream **tls_ptds; /* [MAXDEV], malloc'd on first use */

#define ST_ADD(field, v) __atomic_fetch_add(&G.st.field, (uint64_t)(v), __ATOMIC_RELAXED)

/* ---- small helpers --------------------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof buf, "tsemu[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < sizeof buf)
		n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof buf - 1)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	ssize_t w = write(2, buf, (size_t)n);
	(void)w;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleep until CLOCK_MONOTONIC reaches `until` ns, in slices, giving up when
 * the library is being torn down. */
static void sleep_until(uint64_t until)
{
	for (;;) {
		uint64_t t = now_ns();
		if (t >= until || __atomic_load_n(&G.stopping, __ATOMIC_ACQUIRE))
			return;
		uint64_t d = until - t;
		if (d > 50000000u)
			d = 50000000u;
		struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
		nanosleep(&ts, NULL);
	}
}

static int futex_wait(uint32_t *addr, uint32_t val, long ns)
{
	struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
	return (int)syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) / pg * pg;
}

/* ---- configuration, initialisation, fork, exit ------------------------------------ */

static int env_long(const char *name, long lo, long hi, long *out)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || end == v || x < lo || x > hi || *v == '+' || *v == '-' || *v == ' ') {
		say("%s='%s' is invalid: expected an integer from %ld to %ld; ignored", name, v, lo, hi);
		return 0;
	}
	*out = x;
	return 1;
}

static int env_rate(const char *name, double *out)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	if (errno || *end || end == v || !isfinite(x) || x <= 0 || x > 1e6) {
		say("%s='%s' is invalid: expected a positive number of GB/s (1e9 bytes/s); ignored", name, v);
		return 0;
	}
	*out = x * 1e9;
	return 1;
}

static void atfork_child(void)
{
	/* CUDA is unusable in a child forked after cuInit, as with a real
	 * driver. The child has none of the parent's threads: it must not
	 * touch the parent's queues or locks, so it only remembers this. */
	if (__atomic_load_n(&G.inited, __ATOMIC_ACQUIRE))
		G.forked = 1;
}

static void ptds_release(void *arg);

/* Configuration, once per process: by cuInit, or by cuGetProcAddress
 * (which works before cuInit). */
static void do_config(void)
{
	long v = 2;
	env_long("TSEMU_DEVICES", 0, MAXDEV, &v);
	G.ndev = (int)v;
	v = 16384;
	env_long("TSEMU_MEM_MB", 1, 1L << 24, &v);
	G.mem_total = (size_t)v << 20;
	env_rate("TSEMU_H2D_GBPS", &G.rate[D_H2D]);
	if (!env_rate("TSEMU_D2H_GBPS", &G.rate[D_D2H]))
		G.rate[D_D2H] = G.rate[D_H2D];
	env_rate("TSEMU_D2D_GBPS", &G.rate[D_D2D]);
	if (!env_rate("TSEMU_PEER_GBPS", &G.rate[D_PEER]))
		G.rate[D_PEER] = G.rate[D_D2D];
	v = 0;
	env_long("TSEMU_STREAM_DELAY_US", 0, 60000000L, &v);
	G.delay_us = v;
	v = 0;
	env_long("TSEMU_TRACE", 0, 2, &v);
	G.trace = (int)v;
	v = 0;
	env_long("TSEMU_CTXLESS", 0, 1, &v);
	G.ctxless = (int)v;
	const char *dead = getenv("TSEMU_DEAD_EVENTS");
	G.dead_pending = dead && !strcmp(dead, "pending");
	if (dead && *dead && !G.dead_pending && strcmp(dead, "complete"))
		say("TSEMU_DEAD_EVENTS='%s' is invalid: expected complete or pending; ignored", dead);
	const char *deny = getenv("TSEMU_GETPROC_DENY");
	if (deny && *deny) {
		size_t n = strlen(deny);
		G.deny = malloc(n + 3);
		if (G.deny)
			snprintf(G.deny, n + 3, ",%s,", deny);
	}
	G.pid = getpid();
	for (int i = 0; i < MAXDEV; i++) {
		G.ctx[i].magic = CTX_MAGIC;
		G.ctx[i].dev = i;
	}
	G.st.version = TSEMU_STATS_VERSION;
	G.st.devices = (uint32_t)G.ndev;
	G.next_id = 1;
	pthread_key_create(&G.ptds_key, ptds_release);
	pthread_atfork(NULL, NULL, atfork_child);
	G.init_rc = G.ndev == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

/* Every entry point but the few that work without cuInit starts here. */
static CUresult api_enter(const char *name)
{
	if (G.forked)
		return CUDA_ERROR_NOT_INITIALIZED;
	ST_ADD(api_calls, 1);
	if (G.trace >= 2)
		say("%s", name);
	if (!__atomic_load_n(&G.inited, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (__atomic_load_n(&G.stopping, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_DEINITIALIZED;
	/* contexts destroyed (elsewhere) since they were made current here are
	 * current no more: off the stack (the structs are never reused) */
	while (tls_depth && __atomic_load_n(&tls_stack[tls_depth - 1]->magic, __ATOMIC_ACQUIRE) != CTX_MAGIC)
		tls_ctx = --tls_depth ? tls_stack[tls_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

/* The calling thread's context stack; the current context is its top. */
static CUresult ctx_push(struct ctx *c)
{
	if (tls_depth == CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	tls_stack[tls_depth++] = c;
	tls_ctx = c;
	return CUDA_SUCCESS;
}

static struct ctx *ctx_pop(void)
{
	if (!tls_depth)
		return NULL;
	struct ctx *c = tls_stack[--tls_depth];
	tls_ctx = tls_depth ? tls_stack[tls_depth - 1] : NULL;
	return c;
}

#define ENTER(name)                                    \
	do {                                           \
		CUresult e_ = api_enter(name);         \
		if (e_ != CUDA_SUCCESS)                \
			return e_;                     \
	} while (0)

static void write_stats(void)
{
	const char *path = getenv("TSEMU_STATS");
	if (!path || !*path)
		return;
	struct tsemu_stats s = G.st;
	char buf[2048];
	int n = snprintf(buf, sizeof buf,
		"{\"pid\":%d,\"devices\":%u,"
		"\"h2d_bytes\":%llu,\"d2h_bytes\":%llu,\"d2d_bytes\":%llu,\"peer_bytes\":%llu,\"h2h_bytes\":%llu,"
		"\"h2d_calls\":%llu,\"d2h_calls\":%llu,\"d2d_calls\":%llu,\"peer_calls\":%llu,\"h2h_calls\":%llu,"
		"\"memset_bytes\":%llu,\"memset_calls\":%llu,\"allocs\":%llu,\"frees\":%llu,"
		"\"alloc_bytes\":%llu,\"peak_alloc_bytes\":%llu,"
		"\"ipc_mem_exports\":%llu,\"ipc_mem_opens\":%llu,\"ipc_mem_closes\":%llu,"
		"\"ipc_event_exports\":%llu,\"ipc_event_opens\":%llu,"
		"\"event_records\":%llu,\"stream_waits\":%llu,\"getproc_lookups\":%llu,\"api_calls\":%llu,"
		"\"ipc_freed_while_open\":%llu,\"ipc_lost_at_exit\":%llu,\"ipc_read_lost\":%llu}\n",
		(int)getpid(), s.devices,
		(unsigned long long)s.h2d_bytes, (unsigned long long)s.d2h_bytes, (unsigned long long)s.d2d_bytes,
		(unsigned long long)s.peer_bytes, (unsigned long long)s.h2h_bytes,
		(unsigned long long)s.h2d_calls, (unsigned long long)s.d2h_calls, (unsigned long long)s.d2d_calls,
		(unsigned long long)s.peer_calls, (unsigned long long)s.h2h_calls,
		(unsigned long long)s.memset_bytes, (unsigned long long)s.memset_calls,
		(unsigned long long)s.allocs, (unsigned long long)s.frees,
		(unsigned long long)s.alloc_bytes, (unsigned long long)s.peak_alloc_bytes,
		(unsigned long long)s.ipc_mem_exports, (unsigned long long)s.ipc_mem_opens,
		(unsigned long long)s.ipc_mem_closes, (unsigned long long)s.ipc_event_exports,
		(unsigned long long)s.ipc_event_opens, (unsigned long long)s.event_records,
		(unsigned long long)s.stream_waits, (unsigned long long)s.getproc_lookups,
		(unsigned long long)s.api_calls, (unsigned long long)s.ipc_freed_while_open,
		(unsigned long long)s.ipc_lost_at_exit, (unsigned long long)s.ipc_read_lost);
	if (n <= 0 || (size_t)n >= sizeof buf)
		return;
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		say("TSEMU_STATS=%s: %s", path, strerror(errno));
		return;
	}
	if (write(fd, buf, (size_t)n) != n)
		say("TSEMU_STATS=%s: short write", path);
	close(fd);
}

API int tsemu_stats(struct tsemu_stats *out)
{
	if (!out)
		return -1;
	*out = G.st;
	out->version = TSEMU_STATS_VERSION;
	return 0;
}

/* ---- memory table ------------------------------------------------------------------- */

static int is_dev(const struct mem *m)
{
	return m && (m->kind == M_DEV || m->kind == M_IPC);
}

static size_t mem_span(const struct mem *m)
{
	return is_dev(m) ? m->maplen : m->size;
}

/* Index of the first record whose base is > p. */
static size_t mem_upper(uintptr_t p)
{
	size_t lo = 0, hi = G.nmem;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (G.mems[mid]->base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The record whose span holds p (device records span their whole
 * reservation, so a pointer past the end of an allocation is still known to
 * be a device pointer). Under G.mu. */
static struct mem *mem_find(uintptr_t p)
{
	size_t i = mem_upper(p);
	if (i == 0)
		return NULL;
	struct mem *m = G.mems[i - 1];
	return p - m->base < mem_span(m) ? m : NULL;
}

/* Does [p, p+n) intersect any record? */
static int mem_overlaps(uintptr_t p, size_t n)
{
	size_t i = mem_upper(p);
	if (i > 0 && p - G.mems[i - 1]->base < mem_span(G.mems[i - 1]))
		return 1;
	return i < G.nmem && G.mems[i]->base - p < n;
}

static int mem_insert(struct mem *m)
{
	if (G.nmem == G.capmem) {
		size_t cap = G.capmem ? G.capmem * 2 : 64;
		/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
		struct mem **a = realloc(G.mems, cap * sizeof *a);
		if (!a)
			return -1;
		G.mems = a;
		G.capmem = cap;
	}
	size_t i = mem_upper(m->base);
	/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
	memmove(G.mems + i + 1, G.mems + i, (G.nmem - i) * sizeof *G.mems);
	G.mems[i] = m;
	G.nmem++;
	return 0;
}

static void mem_remove(struct mem *m)
{
	for (size_t i = 0; i < G.nmem; i++)
		if (G.mems[i] == m) {
			/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
			memmove(G.mems + i, G.mems + i + 1, (G.nmem - i - 1) * sizeof *G.mems);
			G.nmem--;
			return;
		}
}

/* Running, and not a zombie (a dead importer, a dead recorder: both are gone). */
static int pid_alive(pid_t pid)
{
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* Put ourselves on the exporter's list of importers of the memfd `fd`. */
static void importer_join(struct mem *m, int fd)
{
	size_t pg = page_round(1);
	void *p = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)m->maplen);
	if (p == MAP_FAILED)
		return;
	struct importers *imp = p;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < IMPORTERS; i++) {
			int32_t old = __atomic_load_n(&imp->pid[i], __ATOMIC_RELAXED);
			if ((pass == 0 && old != 0) || (pass == 1 && (old == 0 || pid_alive(old))))
				continue;
			if (__atomic_compare_exchange_n(&imp->pid[i], &old, (int32_t)G.pid, 0, __ATOMIC_SEQ_CST,
							__ATOMIC_RELAXED)) {
				m->imp = imp;
				m->imp_slot = i;
				return;
			}
		}
	say("an IPC allocation has more than %d importers: this one is not tracked", IMPORTERS);
	munmap(p, pg);
}

static void importer_leave(struct mem *m)
{
	int32_t me = (int32_t)G.pid;
	__atomic_compare_exchange_n(&m->imp->pid[m->imp_slot], &me, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
	munmap(m->imp, page_round(1));
	m->imp = NULL;
}

/* A live process (not us) that has our allocation m open through IPC, or 0. */
static pid_t open_elsewhere(const struct mem *m)
{
	struct importers imp;
	if (pread(m->fd, &imp, sizeof imp, (off_t)m->maplen) != (ssize_t)sizeof imp)
		return 0;
	for (int i = 0; i < IMPORTERS; i++)
		if (imp.pid[i] > 0 && imp.pid[i] != (int32_t)G.pid && pid_alive(imp.pid[i]))
			return imp.pid[i];
	return 0;
}

/*
 * Our allocation m is freed, or our context goes: a process that still has it
 * open finds garbage there from now on (the flag first, so a reader that
 * sees the flag clear after its copy read the bytes before they changed).
 */
static void mem_lose(struct mem *m)
{
	uint32_t one = 1;
	if (pwrite(m->fd, &one, sizeof one, (off_t)(m->maplen + offsetof(struct importers, lost))) != sizeof one)
		say("an allocation's importers cannot be told it is gone: their reads of it are not counted");
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	memset(m->data, 0xa5, m->maplen);
}

/* Our context goes (exit, reset): our allocation m, open in a live process, is lost there. */
static void mem_lose_with_ctx(struct mem *m)
{
	if (m->kind == M_DEV && open_elsewhere(m)) {
		ST_ADD(ipc_lost_at_exit, 1);
		mem_lose(m);
	}
}

/* m leaves the table, its bytes the device's count; the table's reference is the caller's to drop. Under G.mu. */
static void mem_table_remove(struct mem *m)
{
	mem_remove(m);
	if (m->kind == M_DEV) {
		G.used[m->dev] -= m->size;
		__atomic_fetch_sub(&G.st.alloc_bytes, m->size, __ATOMIC_RELAXED);
	}
}

/* A copy out of m has read its bytes: were they lost by then? (M_IPC we track) */
static int mem_read_lost(const struct mem *m)
{
	if (!m || m->kind != M_IPC || !m->imp)
		return 0;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(&m->imp->lost, __ATOMIC_RELAXED) != 0;
}

static void mem_unref(struct mem *m)
{
	if (!m || --m->refs > 0)
		return;
	if (m->kind == M_IPC && m->imp)
		importer_leave(m);
	if (is_dev(m)) {
		munmap((void *)m->base, m->maplen);
		munmap(m->data, m->maplen);
	} else if (m->kind == M_HOSTALLOC) {
		munmap(m->data, page_round(m->size));
	}
	if (m->fd >= 0)
		close(m->fd);
	free(m);
}

/* A reservation the host cannot touch, and the bytes behind it. */
static CUresult map_device(int fd, size_t maplen, uintptr_t *base, char **data)
{
	void *r = mmap(NULL, maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *d = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (d == MAP_FAILED) {
		munmap(r, maplen);
		return CUDA_ERROR_MAP_FAILED;
	}
	*base = (uintptr_t)r;
	*data = d;
	return CUDA_SUCCESS;
}

/* ---- streams and their workers ------------------------------------------------------ */

static void event_unref(struct event *e);

static void stream_unref(struct stream *s)
{
	if (s)
		s->refs--;
}

static void op_free(struct op *o)
{
	for (int i = 0; i < o->ndeps; i++)
		stream_unref(o->deps[i].s);
	free(o->deps);
	free(o->staging);
	mem_unref(o->m[0]);
	mem_unref(o->m[1]);
	if (o->ev)
		event_unref(o->ev);
	free(o);
}

static int deps_done(const struct op *o)
{
	for (int i = 0; i < o->ndeps; i++)
		if (o->deps[i].s->completed < o->deps[i].seq)
			return 0;
	return 1;
}

static int add_dep(struct op *o, struct stream *s, uint64_t seq)
{
	if (s->completed >= seq)
		return 0;
	for (int i = 0; i < o->ndeps; i++)
		if (o->deps[i].s == s) {
			if (o->deps[i].seq < seq)
				o->deps[i].seq = seq;
			return 0;
		}
	if (o->ndeps == o->capdeps) {
		int cap = o->capdeps ? o->capdeps * 2 : 4;
		struct dep *d = realloc(o->deps, (size_t)cap * sizeof *d);
		if (!d)
			return -1;
		o->deps = d;
		o->capdeps = cap;
	}
	o->deps[o->ndeps].s = s;
	o->deps[o->ndeps].seq = seq;
	o->ndeps++;
	s->refs++;
	return 0;
}

static int ev_wait(struct evsh *sh, uint64_t gen);

static void op_exec(struct op *o)
{
	switch (o->kind) {
	case OP_COPY: {
		/* With a bandwidth set, the bytes land at the end of the modelled
		 * transfer time: a reader that does not wait sees old data. */
		double rate = o->dir == D_H2H ? 0 : G.rate[o->dir];
		if (rate > 0)
			sleep_until(now_ns() + (uint64_t)((double)o->n / rate * 1e9));
		memmove(o->dst, o->src, o->n);
		if (mem_read_lost(o->m[1]))
			ST_ADD(ipc_read_lost, 1);
		switch (o->dir) {
		case D_H2D: ST_ADD(h2d_bytes, o->n); ST_ADD(h2d_calls, 1); break;
		case D_D2H: ST_ADD(d2h_bytes, o->n); ST_ADD(d2h_calls, 1); break;
		case D_D2D: ST_ADD(d2d_bytes, o->n); ST_ADD(d2d_calls, 1); break;
		case D_PEER: ST_ADD(peer_bytes, o->n); ST_ADD(peer_calls, 1); break;
		default: ST_ADD(h2h_bytes, o->n); ST_ADD(h2h_calls, 1); break;
		}
		break;
	}
	case OP_MEMSET:
		memset(o->dst, o->value, o->n);
		ST_ADD(memset_bytes, o->n);
		ST_ADD(memset_calls, 1);
		break;
	case OP_RECORD: {
		struct evsh *sh = o->ev->sh;
		__atomic_store_n(&sh->done_ns, now_ns(), __ATOMIC_RELAXED);
		uint64_t cur = __atomic_load_n(&sh->done, __ATOMIC_ACQUIRE);
		while (cur < o->gen &&
		       !__atomic_compare_exchange_n(&sh->done, &cur, o->gen, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		__atomic_fetch_add(&sh->futex, 1, __ATOMIC_RELEASE);
		futex_wake_all(&sh->futex);
		break;
	}
	case OP_WAITEV:
		ev_wait(o->ev->sh, o->gen);
		break;
	case OP_HOSTFN:
		o->fn(o->user); /* on the stream's thread, as CUDA runs it on one of its own */
		break;
	default:
		break;
	}
}

static void *worker(void *arg)
{
	struct stream *s = arg;
	pthread_mutex_lock(&G.mu);
	for (;;) {
		while (!s->head && !s->destroyed && !G.stopping)
			pthread_cond_wait(&s->cv, &G.mu);
		if (G.stopping || !s->head)
			break;
		struct op *o = s->head;
		while (!deps_done(o) && !G.stopping)
			pthread_cond_wait(&G.done, &G.mu);
		if (G.stopping)
			break;
		pthread_mutex_unlock(&G.mu);
		if (G.delay_us && (o->kind == OP_COPY || o->kind == OP_MEMSET || o->kind == OP_RECORD))
			sleep_until(now_ns() + (uint64_t)G.delay_us * 1000u);
		op_exec(o);
		pthread_mutex_lock(&G.mu);
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		s->completed = o->seq;
		op_free(o);
		pthread_cond_broadcast(&G.done);
	}
	/* Torn down (or destroyed and drained): what is left is abandoned. */
	while (s->head) {
		struct op *o = s->head;
		s->head = o->next;
		op_free(o);
	}
	s->tail = NULL;
	s->completed = s->submitted;
	s->finished = 1;
	pthread_cond_broadcast(&G.done);
	pthread_mutex_unlock(&G.mu);
	return NULL;
}

/* Join and free destroyed streams nobody refers to any more. Under G.mu. */
static void streams_reap(void)
{
	struct stream **pp = &G.streams;
	while (*pp) {
		struct stream *s = *pp;
		if (s->destroyed && s->refs <= 0 && (s->finished || !s->started)) {
			*pp = s->next_all;
			if (s->started)
				pthread_join(s->th, NULL);
			pthread_cond_destroy(&s->cv);
			free(s);
			continue;
		}
		pp = &s->next_all;
	}
}

static struct stream *stream_new(struct ctx *c, int kind, unsigned flags)
{
	struct stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->magic = STREAM_MAGIC;
	s->kind = kind;
	s->flags = flags;
	s->ctx = c;
	s->refs = 1;
	pthread_cond_init(&s->cv, NULL);
	s->next_all = G.streams;
	G.streams = s;
	return s;
}

/* Mark a stream for destruction: its worker finishes the queue, then ends. */
static void stream_retire(struct stream *s)
{
	s->destroyed = 1;
	s->magic = 0;
	s->refs--;
	if (!s->started)
		s->finished = 1;
	pthread_cond_signal(&s->cv);
}

static int blocking(const struct stream *s)
{
	return s->kind != S_USER || !(s->flags & CU_STREAM_NON_BLOCKING);
}

/* ---- stream capture: the rules ------------------------------------------------------------ */

static void graph_append(struct graph *g, struct op *o)
{
	o->next = NULL;
	if (g->tail)
		g->tail->next = o;
	else
		g->head = o;
	g->tail = o;
	g->last = (CUgraphNode)o;
}

static void graph_free(struct graph *g)
{
	while (g->head) {
		struct op *o = g->head;
		g->head = o->next;
		op_free(o);
	}
	free(g);
}

static struct capture *capture_by_id(uint64_t id)
{
	for (struct capture *c = G.captures; c; c = c->next_all)
		if (c->id == id)
			return c;
	return NULL;
}

/* Take s out of capture mode, dropping what it captured. Under G.mu. */
static void capture_discard(struct stream *s)
{
	struct capture *c = s->cap;
	if (!c)
		return;
	s->cap = NULL;
	for (struct capture **pp = &G.captures; *pp; pp = &(*pp)->next_all)
		if (*pp == c) {
			*pp = c->next_all;
			break;
		}
	__atomic_sub_fetch(&G.ncaptures, 1, __ATOMIC_RELEASE);
	if (c->g)
		graph_free(c->g);
	free(c);
}

/* Something that cannot be captured (it waits for the stream, or reads
 * pageable memory when called) pushed into a capturing stream: refused,
 * and the capture invalidated ("when an invalid operation is attempted
 * during stream capture, any associated capture graphs are invalidated"). */
static CUresult capture_refuse(struct capture *c)
{
	if (c->invalid)
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	c->invalid = 1;
	return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/*
 * May the calling thread make a "potentially unsafe" call now (one that
 * allocates, frees, opens IPC memory or waits for the device)? The rules of
 * cuThreadExchangeStreamCaptureMode: in relaxed mode yes; otherwise not
 * while it has a capture of its own not begun relaxed, nor, in global mode,
 * while another thread has one begun in global mode. A barred call fails
 * and invalidates the captures that bar it. Under G.mu.
 */
static CUresult capture_bars(void)
{
	CUresult r = CUDA_SUCCESS;
	if (tls_capmode == CU_STREAM_CAPTURE_MODE_RELAXED)
		return r;
	for (struct capture *c = G.captures; c; c = c->next_all) {
		int own = pthread_equal(c->thread, pthread_self());
		if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED ||
		    (!own && (tls_capmode != CU_STREAM_CAPTURE_MODE_GLOBAL || c->mode != CU_STREAM_CAPTURE_MODE_GLOBAL)))
			continue;
		c->invalid = 1;
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	return r;
}

/* capture_bars for an entry point that is unsafe as a whole; no lock while no capture is open. */
static CUresult unsafe_call(void)
{
	if (!__atomic_load_n(&G.ncaptures, __ATOMIC_ACQUIRE))
		return CUDA_SUCCESS;
	pthread_mutex_lock(&G.mu);
	CUresult r = capture_bars();
	pthread_mutex_unlock(&G.mu);
	return r;
}

#define UNSAFE()                                       \
	do {                                           \
		CUresult u_ = unsafe_call();           \
		if (u_ != CUDA_SUCCESS)                \
			return u_;                     \
	} while (0)

/* Work on (or a query of) the legacy stream while a blocking stream of its
 * context captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the legacy stream
 * would depend on work that does not run. Work invalidates the capture; a
 * query (cuStreamIsCapturing) does not. Under G.mu. */
static CUresult legacy_usable(const struct stream *s, int work)
{
	CUresult r = CUDA_SUCCESS;
	if (s->kind != S_LEGACY)
		return r;
	for (struct capture *c = G.captures; c; c = c->next_all)
		if (c->ctx == s->ctx && c->blocking) {
			c->invalid |= work;
			r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
		}
	return r;
}

/* Appended to the graph of the capture s is in, instead of queued (enqueue). */
static CUresult capture_add(struct stream *s, struct op *o)
{
	if (s->cap->invalid)
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	graph_append(s->cap->g, o);
	return CUDA_SUCCESS;
}

/* Append o to s, with the legacy default stream's implicit ordering:
 * work on the legacy stream waits for all earlier work of the context's
 * blocking streams, and work on a blocking stream waits for earlier legacy
 * work. Under G.mu; on failure o is not consumed. */
static CUresult enqueue(struct stream *s, struct op *o)
{
	if (s->cap)
		return capture_add(s, o);
	if (!s->started) {
		/* Workers block signals, so that the program's handlers run on
		 * its own threads. */
		pthread_attr_t a;
		sigset_t all, old;
		sigfillset(&all);
		pthread_attr_init(&a);
		pthread_attr_setstacksize(&a, 256 * 1024);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		int rc = pthread_create(&s->th, &a, worker, s);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&a);
		if (rc)
			return CUDA_ERROR_OUT_OF_MEMORY;
		s->started = 1;
	}
	if (s->kind == S_LEGACY) {
		for (struct stream *t = G.streams; t; t = t->next_all)
			if (t != s && t->ctx == s->ctx && blocking(t) && !t->finished &&
			    add_dep(o, t, t->submitted) < 0)
				return CUDA_ERROR_OUT_OF_MEMORY;
	} else if (blocking(s) && s->ctx->legacy) {
		if (add_dep(o, s->ctx->legacy, s->ctx->legacy->submitted) < 0)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	o->seq = ++s->submitted;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_signal(&s->cv);
	return CUDA_SUCCESS;
}

/* Wait until s has completed seq. Under G.mu; keeps s alive meanwhile. */
static CUresult stream_wait_seq(struct stream *s, uint64_t seq)
{
	s->refs++;
	for (;;) {
		if (G.stopping)
			return CUDA_ERROR_DEINITIALIZED; /* s may be gone: leave it alone */
		if (s->completed >= seq)
			break;
		pthread_cond_wait(&G.done, &G.mu);
	}
	s->refs--;
	return CUDA_SUCCESS;
}

static struct op *op_new(int kind)
{
	struct op *o = calloc(1, sizeof *o);
	if (o)
		o->kind = kind;
	return o;
}

/* Enqueue an empty operation and return its sequence number (0 on failure). */
static uint64_t enqueue_mark(struct stream *s)
{
	struct op *o = op_new(OP_MARK);
	if (!o)
		return 0;
	if (enqueue(s, o) != CUDA_SUCCESS) {
		op_free(o);
		return 0;
	}
	return o->seq;
}

static struct ctx *ctx_check(CUcontext c)
{
	struct ctx *x = (struct ctx *)c;
	for (int i = 0; i < G.ndev; i++)
		if (x == &G.ctx[i])
			return x;
	for (int i = 0; i < __atomic_load_n(&G.nmade, __ATOMIC_ACQUIRE); i++)
		if (x == &G.made[i])
			return __atomic_load_n(&x->magic, __ATOMIC_ACQUIRE) == CTX_MAGIC ? x : NULL;
	return NULL;
}


static struct stream *legacy_of(struct ctx *c)
{
	if (!c->legacy)
		c->legacy = stream_new(c, S_LEGACY, 0);
	return c->legacy;
}

static void ptds_release(void *arg)
{
	struct stream **a = arg;
	pthread_mutex_lock(&G.mu);
	for (int i = 0; i < MAXDEV + MAXCTX; i++)
		if (a[i]) {
			capture_discard(a[i]); /* a thread that exits capturing: its capture goes too */
			stream_retire(a[i]);
		}
	streams_reap();
	pthread_mutex_unlock(&G.mu);
	free(a);
}

static struct stream *ptds_of(struct ctx *c)
{
	if (!tls_ptds) {
		/* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
		tls_ptds = calloc(MAXDEV + MAXCTX, sizeof *tls_ptds);
		if (!tls_ptds)
			return NULL;
		pthread_setspecific(G.ptds_key, tls_ptds);
	}
	int i = c->made ? MAXDEV + c->made - 1 : c->dev; /* one per context and thread */
	if (!tls_ptds[i])
		tls_ptds[i] = stream_new(c, S_PTDS, 0);
	return tls_ptds[i];
}

/* The stream a handle names. NULL means the legacy stream, or the calling
 * thread's per-thread stream for the _ptds/_ptsz entry points. Under G.mu. */
static CUresult stream_get(CUstream h, int ptds, struct stream **out)
{
	if (!h)
		h = ptds ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
	if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
		if (!tls_ctx)
			return CUDA_ERROR_INVALID_CONTEXT;
		*out = h == CU_STREAM_LEGACY ? legacy_of(tls_ctx) : ptds_of(tls_ctx);
		return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	}
	for (struct stream *s = G.streams; s; s = s->next_all)
		if (s == (struct stream *)h && s->kind == S_USER && !s->destroyed && s->magic == STREAM_MAGIC) {
			*out = s;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_HANDLE;
}

/* stream_get for work pushed into the stream. Under G.mu. */
static CUresult stream_use(CUstream h, int ptds, struct stream **out)
{
	CUresult r = stream_get(h, ptds, out);
	return r == CUDA_SUCCESS ? legacy_usable(*out, 1) : r;
}

/* Wait for all work submitted so far to every stream of c. Under G.mu. */
static CUresult ctx_sync(struct ctx *c)
{
	for (;;) {
		struct stream *busy = NULL;
		for (struct stream *s = G.streams; s && !busy; s = s->next_all)
			if (s->ctx == c && s->completed < s->submitted && !s->finished)
				busy = s;
		if (!busy)
			return CUDA_SUCCESS;
		if (stream_wait_seq(busy, busy->submitted) != CUDA_SUCCESS)
			return CUDA_ERROR_DEINITIALIZED;
	}
}

/* ---- events ---------------------------------------------------------------------------- */

/* An interprocess event whose latest recorder died with generation gen still
 * pending is treated as complete (its context and the work in it are gone),
 * or, with TSEMU_DEAD_EVENTS=pending, never completes: CUDA leaves an event
 * of a destroyed context undefined, and a real driver may well never release
 * the waiter (ts-cudaemu-check ipc-dead asks one). */
static int ev_recorder_gone(const struct evsh *sh, uint64_t gen)
{
	pid_t r = __atomic_load_n(&sh->recorder, __ATOMIC_ACQUIRE);
	return r > 0 && r != G.pid && !G.dead_pending && __atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) < gen &&
	       !pid_alive(r);
}

/* Wait until the event's completed generation reaches gen, or its recorder
 * is gone (above). Returns -1 when the library is torn down. */
static int ev_wait(struct evsh *sh, uint64_t gen)
{
	for (;;) {
		uint32_t f = __atomic_load_n(&sh->futex, __ATOMIC_ACQUIRE);
		if (__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) >= gen)
			return 0;
		if (__atomic_load_n(&G.stopping, __ATOMIC_ACQUIRE))
			return -1;
		futex_wait(&sh->futex, f, 20000000L);
		if (ev_recorder_gone(sh, gen))
			return 0;
	}
}

static struct event *event_get(CUevent h)
{
	for (struct event *e = G.events; e; e = e->next_all)
		if (e == (struct event *)h && !e->destroyed && e->magic == EVENT_MAGIC)
			return e;
	return NULL;
}

static void event_unref(struct event *e)
{
	if (--e->refs > 0)
		return;
	if (e->fd >= 0)
		close(e->fd);
	if (e->sh) {
		if (e->flags & CU_EVENT_INTERPROCESS)
			munmap(e->sh, page_round(sizeof *e->sh));
		else
			free(e->sh);
	}
	free(e);
}

/* ---- the driver API: initialisation, devices, contexts ------------------------------ */

API CUresult cuInit(unsigned int Flags)
{
	if (G.forked)
		return CUDA_ERROR_NOT_INITIALIZED;
	ST_ADD(api_calls, 1);
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&G.once, do_config);
	if (G.trace >= 2)
		say("cuInit");
	if (G.init_rc == CUDA_SUCCESS)
		__atomic_store_n(&G.inited, 1, __ATOMIC_RELEASE);
	return G.init_rc;
}

API CUresult cuDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = DRIVER_VERSION;
	return CUDA_SUCCESS;
}

static CUresult dev_check(CUdevice d)
{
	return d >= 0 && d < G.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	ENTER("cuDeviceGet");
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count)
{
	ENTER("cuDeviceGetCount");
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = G.ndev;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	ENTER("cuDeviceGetName");
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "tsemu test device %d (CPU emulation)", dev);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	ENTER("cuDeviceTotalMem_v2");
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = G.mem_total;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
	size_t b;
	CUresult r = cuDeviceTotalMem_v2(bytes ? &b : NULL, dev);
	if (r == CUDA_SUCCESS)
		*bytes = b > UINT_MAX ? UINT_MAX : (unsigned int)b;
	return r;
}

API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	ENTER("cuDeviceGetAttribute");
	if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	int v = 0;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = INT_MAX; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
	case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 8; break;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1000000; break;
	case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 1000000; break;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 256; break;
	case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 4 << 20; break;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = dev + 1; break;
	case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: v = 1; break;
	case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
	case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: v = 1; break;
	case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 0; break;
	default: v = 0; break; /* valid, not modelled: 0 (unsupported) */
	}
	*pi = v;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	ENTER("cuDeviceGetPCIBusId");
	if (!pciBusId || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", dev + 1);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	ENTER("cuDeviceCanAccessPeer");
	if (!canAccessPeer)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev) || dev_check(peerDev))
		return CUDA_ERROR_INVALID_DEVICE;
	*canAccessPeer = dev != peerDev;
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRetain");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&G.mu);
	G.ctx[dev].refs++;
	G.ctx[dev].active = 1;
	pthread_mutex_unlock(&G.mu);
	*pctx = (CUcontext)&G.ctx[dev];
	return CUDA_SUCCESS;
}

/*
 * The primary context c goes (cuDevicePrimaryCtxReset, or the release of
 * its last retain), as on CUDA: its work is waited for, then what it owns
 * is destroyed. Its device memory (what a live process still has open
 * through IPC is lost there, counted as at exit: ipc_lost_at_exit), the IPC
 * mappings it opened, its events and its streams, whose handles are invalid
 * from then on. The handle itself stays (a later retain or use brings the
 * context back, empty), and so do the legacy and per-thread streams, which
 * tsemu keeps per context for its life. Its pinned host allocations go too
 * (unmapped: a later access faults, as on CUDA) and its host registrations
 * end (the memory is the program's). Under G.mu.
 */
static void ctx_teardown(struct ctx *c)
{
	ctx_sync(c);
	for (size_t i = G.nmem; i-- > 0;) { /* (backwards: a removal shifts only what was looked at) */
		struct mem *m = G.mems[i];
		if (m->ctx != c)
			continue;
		if (is_dev(m))
			mem_lose_with_ctx(m);
		mem_table_remove(m);
		mem_unref(m); /* the table's; an operation of another context that uses it holds its own */
	}
	for (struct event **pp = &G.events; *pp;) {
		struct event *e = *pp;
		if (e->ctx != c) {
			pp = &e->next_all;
			continue;
		}
		*pp = e->next_all;
		e->destroyed = 1;
		e->magic = 0;
		event_unref(e);
	}
	for (struct stream *s = G.streams; s; s = s->next_all)
		if (s->ctx == c && s->kind == S_USER && !s->destroyed) {
			capture_discard(s);
			stream_retire(s);
		}
	streams_reap();
	c->peers = 0;
}

API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxReset_v2");
	UNSAFE();
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&G.mu);
	ctx_teardown(&G.ctx[dev]);
	pthread_mutex_unlock(&G.mu);
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
	return cuDevicePrimaryCtxReset_v2(dev);
}

/* The release of the last retain destroys the context (ctx_teardown). */
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRelease_v2");
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&G.mu);
	CUresult r = CUDA_SUCCESS;
	if (G.ctx[dev].refs > 0) {
		if (--G.ctx[dev].refs == 0)
			ctx_teardown(&G.ctx[dev]);
	} else {
		r = CUDA_ERROR_INVALID_CONTEXT;
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return cuDevicePrimaryCtxRelease_v2(dev);
}

API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	ENTER("cuDevicePrimaryCtxGetState");
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*flags = 0;
	*active = G.ctx[dev].refs > 0;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	ENTER("cuCtxGetCurrent");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = (CUcontext)tls_ctx;
	return CUDA_SUCCESS;
}

/* "replace the top of that stack with ctx. If ctx is NULL then this will be
 * equivalent to popping the top" (cuda.h) */
API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	ENTER("cuCtxSetCurrent");
	if (!ctx) {
		ctx_pop();
		return CUDA_SUCCESS;
	}
	struct ctx *c = ctx_check(ctx);
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!tls_depth)
		return ctx_push(c);
	tls_stack[tls_depth - 1] = c;
	tls_ctx = c;
	return CUDA_SUCCESS;
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	ENTER("cuCtxPushCurrent_v2");
	struct ctx *c = ctx_check(ctx);
	return c ? ctx_push(c) : CUDA_ERROR_INVALID_CONTEXT;
}

API CUresult cuCtxPushCurrent(CUcontext ctx)
{
	return cuCtxPushCurrent_v2(ctx);
}

API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	ENTER("cuCtxPopCurrent_v2");
	struct ctx *c = ctx_pop();
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (pctx)
		*pctx = (CUcontext)c;
	return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent(CUcontext *pctx)
{
	return cuCtxPopCurrent_v2(pctx);
}

/*
 * cuCtxCreate: a context of the program's own on dev, current on the calling
 * thread from now on. _v2 is the 3.2 entry point, _v3 adds execution
 * affinity, _v4 (cuda.h's cuCtxCreate since 12.5) a parameter struct:
 * neither kind of parameter is emulated, so asking for one is refused.
 */
static CUresult ctx_make(CUcontext *pctx, CUdevice dev)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (tls_depth == CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY; /* nowhere to push it */
	pthread_mutex_lock(&G.mu);
	if (G.nmade == MAXCTX) {
		pthread_mutex_unlock(&G.mu);
		say("cuCtxCreate: more than %d contexts made in one process", MAXCTX);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct ctx *c = &G.made[G.nmade];
	*c = (struct ctx){ .dev = dev, .made = G.nmade + 1, .active = 1 };
	__atomic_store_n(&c->magic, CTX_MAGIC, __ATOMIC_RELEASE);
	__atomic_store_n(&G.nmade, G.nmade + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&G.mu);
	*pctx = (CUcontext)c;
	return ctx_push(c);
}

API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	ENTER("cuCtxCreate_v2");
	(void)flags; /* scheduling flags: nothing to schedule */
	return ctx_make(pctx, dev);
}

API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
			    CUdevice dev)
{
	ENTER("cuCtxCreate_v3");
	(void)flags;
	if (numParams < 0 || (numParams > 0 && !paramsArray))
		return CUDA_ERROR_INVALID_VALUE;
	return numParams ? CUDA_ERROR_NOT_SUPPORTED : ctx_make(pctx, dev);
}

API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
	ENTER("cuCtxCreate_v4");
	(void)flags;
	if (ctxCreateParams && (ctxCreateParams->execAffinityParams || ctxCreateParams->numExecAffinityParams ||
				ctxCreateParams->cigParams))
		return CUDA_ERROR_NOT_SUPPORTED;
	return ctx_make(pctx, dev);
}

/*
 * cuCtxDestroy of a context the program made: its work is waited for and
 * everything it owns goes, as at a primary reset (ctx_teardown), its legacy
 * stream too; its handle is invalid from then on, in every thread. Current
 * on the calling thread, it leaves it with none. A primary context is not
 * the program's to destroy.
 */
API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	ENTER("cuCtxDestroy_v2");
	UNSAFE();
	pthread_mutex_lock(&G.mu);
	struct ctx *c = ctx_check(ctx);
	if (!c || !c->made) {
		pthread_mutex_unlock(&G.mu);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	ctx_teardown(c);
	if (c->legacy) {
		stream_retire(c->legacy);
		c->legacy = NULL;
		streams_reap();
	}
	__atomic_store_n(&c->magic, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&G.mu);
	if (tls_ctx == c)
		ctx_pop(); /* "as though cuCtxPopCurrent() were called" (cuda.h) */
	return CUDA_SUCCESS;
}

API CUresult cuCtxDestroy(CUcontext ctx)
{
	return cuCtxDestroy_v2(ctx);
}

API CUresult cuCtxGetDevice(CUdevice *device)
{
	ENTER("cuCtxGetDevice");
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = tls_ctx->dev;
	return CUDA_SUCCESS;
}

/* CUDA 13: cuGetProcAddress("cuCtxGetDevice", 13000) hands out this one. */
API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
	ENTER("cuCtxGetDevice_v2");
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	struct ctx *c = ctx ? ctx_check(ctx) : tls_ctx;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = c->dev;
	return CUDA_SUCCESS;
}

/* "It is also invalid to ... synchronize a broader handle which encompasses
 * an active stream capture, such as a device or context handle". */
static CUresult ctx_sync_api(struct ctx *c)
{
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	CUresult r = capture_bars();
	for (struct capture *k = G.captures; k && r == CUDA_SUCCESS; k = k->next_all)
		if (k->ctx == c)
			r = capture_refuse(k);
	if (r == CUDA_SUCCESS)
		r = ctx_sync(c);
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* CUDA 13: cuGetProcAddress("cuCtxSynchronize", 13000) hands out this one. */
API CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	ENTER("cuCtxSynchronize_v2");
	return ctx_sync_api(ctx ? ctx_check(ctx) : tls_ctx);
}

API CUresult cuCtxSynchronize(void)
{
	ENTER("cuCtxSynchronize");
	return ctx_sync_api(tls_ctx);
}

API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	ENTER("cuCtxEnablePeerAccess");
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct ctx *p = ctx_check(peerContext);
	if (!p)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (p == tls_ctx)
		return CUDA_ERROR_INVALID_DEVICE; /* a device is not its own peer */
	pthread_mutex_lock(&G.mu);
	CUresult r = CUDA_SUCCESS;
	if (tls_ctx->peers & (1u << p->dev))
		r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	else
		tls_ctx->peers |= 1u << p->dev;
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
	ENTER("cuCtxDisablePeerAccess");
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct ctx *p = ctx_check(peerContext);
	if (!p)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	CUresult r = CUDA_SUCCESS;
	if (!(tls_ctx->peers & (1u << p->dev)))
		r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
	else
		tls_ctx->peers &= ~(1u << p->dev);
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* ---- device memory -------------------------------------------------------------------- */

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	ENTER("cuMemAlloc_v2");
	UNSAFE();
	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct ctx *c = tls_ctx;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	size_t maplen = page_round(bytesize);
	if (maplen < bytesize)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&G.mu);
	if (G.used[c->dev] + bytesize > G.mem_total || G.used[c->dev] + bytesize < bytesize) {
		pthread_mutex_unlock(&G.mu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	G.used[c->dev] += bytesize;
	uint64_t id = G.next_id++;
	pthread_mutex_unlock(&G.mu);

	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	char name[64];
	snprintf(name, sizeof name, "tsemu-dev%d-%llu", c->dev, (unsigned long long)id);
	struct mem *m = calloc(1, sizeof *m);
	int fd = memfd_create(name, MFD_CLOEXEC);
	struct stat st;
	if (!m || fd < 0 || ftruncate(fd, (off_t)(maplen + page_round(1))) < 0 || fstat(fd, &st) < 0)
		goto fail;
	m->kind = M_DEV;
	m->dev = c->dev;
	m->ctx = c;
	m->size = bytesize;
	m->maplen = maplen;
	m->fd = fd;
	m->ino = (uint64_t)st.st_ino;
	m->id = id;
	m->refs = 1;
	if ((r = map_device(fd, maplen, &m->base, &m->data)) != CUDA_SUCCESS)
		goto fail;
	pthread_mutex_lock(&G.mu);
	if (mem_insert(m) < 0) {
		pthread_mutex_unlock(&G.mu);
		munmap((void *)m->base, maplen);
		munmap(m->data, maplen);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail;
	}
	ST_ADD(allocs, 1);
	uint64_t now = __atomic_add_fetch(&G.st.alloc_bytes, bytesize, __ATOMIC_RELAXED);
	if (now > G.st.peak_alloc_bytes)
		G.st.peak_alloc_bytes = now;
	pthread_mutex_unlock(&G.mu);
	*dptr = (CUdeviceptr)m->base;
	return CUDA_SUCCESS;
fail:
	if (fd >= 0)
		close(fd);
	free(m);
	pthread_mutex_lock(&G.mu);
	G.used[c->dev] -= bytesize;
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* Like cudaFree, this waits for the device's work before it frees. */
API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	ENTER("cuMemFree_v2");
	UNSAFE();
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find((uintptr_t)dptr);
	if (!m || m->kind != M_DEV || m->base != (uintptr_t)dptr) {
		pthread_mutex_unlock(&G.mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	m->refs++;
	CUresult r = ctx_sync(m->ctx);
	if (r == CUDA_SUCCESS && mem_find((uintptr_t)dptr) != m)
		r = CUDA_ERROR_INVALID_VALUE; /* freed by another thread meanwhile */
	pid_t importer = r == CUDA_SUCCESS ? open_elsewhere(m) : 0;
	if (importer) {
		/* CUDA: "undefined behavior"; here the memory is taken for something else */
		say("cuMemFree of %p while process %d has it open through IPC: undefined behaviour on CUDA",
		    (void *)m->base, (int)importer);
		ST_ADD(ipc_freed_while_open, 1);
		mem_lose(m);
	}
	if (r == CUDA_SUCCESS) {
		mem_table_remove(m);
		ST_ADD(frees, 1);
		m->refs--; /* the table's */
	}
	mem_unref(m);
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuMemGetInfo_v2(size_t *free_, size_t *total)
{
	ENTER("cuMemGetInfo_v2");
	if (!free_ || !total)
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	*total = G.mem_total;
	*free_ = G.mem_total - G.used[tls_ctx->dev];
	pthread_mutex_unlock(&G.mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo(unsigned int *free_, unsigned int *total)
{
	size_t f, t;
	CUresult r = cuMemGetInfo_v2(free_ ? &f : NULL, total ? &t : NULL);
	if (r == CUDA_SUCCESS) {
		*free_ = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
		*total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
	}
	return r;
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	ENTER("cuMemGetAddressRange_v2");
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find((uintptr_t)dptr);
	CUresult r = CUDA_ERROR_NOT_FOUND;
	if (is_dev(m) && (uintptr_t)dptr - m->base < m->size) {
		if (pbase)
			*pbase = (CUdeviceptr)m->base;
		if (psize)
			*psize = m->size;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* The v1 (CUDA 2.x, 32-bit device pointer) entry points: an emulated device
 * pointer never fits 32 bits, so they are exported but not supported. */
API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	(void)dptr, (void)bytesize;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
	(void)dptr;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr)
{
	(void)pbase, (void)psize, (void)dptr;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
	(void)dstDevice, (void)srcHost, (void)ByteCount;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
	(void)dstHost, (void)srcDevice, (void)ByteCount;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
	(void)dstDevice, (void)srcDevice, (void)ByteCount;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount,
			       CUstream hStream)
{
	(void)dstDevice, (void)srcHost, (void)ByteCount, (void)hStream;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount, CUstream hStream)
{
	(void)dstHost, (void)srcDevice, (void)ByteCount, (void)hStream;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemcpyDtoDAsync(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
			       CUstream hStream)
{
	(void)dstDevice, (void)srcDevice, (void)ByteCount, (void)hStream;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
	(void)dstDevice, (void)uc, (void)N;
	return G.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- copies ----------------------------------------------------------------------------- */

struct side {
	char *addr;
	struct mem *m; /* device record, or pinned host record; NULL: pageable */
	int dev;       /* device ordinal, -1 for host memory */
	int pinned;
};

static CUresult side_dev(uintptr_t p, size_t n, struct side *s)
{
	struct mem *m = mem_find(p);
	if (!is_dev(m) || n > m->size || p - m->base > m->size - n)
		return CUDA_ERROR_INVALID_VALUE;
	s->addr = m->data + (p - m->base);
	s->m = m;
	s->dev = m->dev;
	s->pinned = 0;
	return CUDA_SUCCESS;
}

static CUresult side_host(uintptr_t p, size_t n, struct side *s)
{
	if (!p || p + n < p)
		return CUDA_ERROR_INVALID_VALUE;
	struct mem *m = mem_find(p);
	if (is_dev(m))
		return CUDA_ERROR_INVALID_VALUE; /* a device pointer where host memory is expected */
	s->addr = (char *)p;
	s->dev = -1;
	s->pinned = m && n <= m->size && p - m->base <= m->size - n;
	s->m = s->pinned ? m : NULL;
	return CUDA_SUCCESS;
}

static CUresult side_any(uintptr_t p, size_t n, struct side *s)
{
	return is_dev(mem_find(p)) ? side_dev(p, n, s) : side_host(p, n, s);
}

/* Does the calling thread wait for the copy? CUDA's "API synchronization
 * behavior" (cuda_runtime_api.h): synchronous calls from pinned memory to
 * the device, and from the device to any host memory, return once the copy
 * is done; device to device does not wait; host to host is always fully
 * synchronous. Async calls with pinned memory, and device to device, only
 * enqueue; device to pageable memory completes before return. Pageable to
 * device (either form) is staged: see STAGE_MAX. */
static int copy_blocks(int dir, int async, const struct side *dst, const struct side *src)
{
	switch (dir) {
	case D_H2D: return !async || !src->pinned;
	case D_D2H: return !async || !dst->pinned;
	case D_H2H: return 1;
	default: return 0;
	}
}

/* Pageable memory to the device: "a stream sync is performed before the
 * copy is initiated. The function will return once the pageable buffer has
 * been copied to the staging memory for DMA transfer to device memory, but
 * the DMA to final destination may not have completed." Up to STAGE_MAX
 * bytes (one staging buffer) the source is copied aside and the call
 * returns with the device write still queued; a larger copy goes through
 * the staging buffers piece by piece, so the call returns about when the
 * data is there: modelled as waiting for the copy. */
#define STAGE_MAX ((size_t)1 << 20)

/* Enqueue a copy of n bytes between two resolved sides on a stream (stream
 * handle h, or the default stream); wait for it where CUDA would. */
static CUresult copy_common(struct side *dst, struct side *src, size_t n, CUstream h, int ptds, int async)
{
	int dir;
	if (dst->dev >= 0 && src->dev >= 0)
		dir = dst->dev == src->dev ? D_D2D : D_PEER;
	else if (dst->dev >= 0)
		dir = D_H2D;
	else if (src->dev >= 0)
		dir = D_D2H;
	else
		dir = D_H2H;
	struct stream *s;
	CUresult r = stream_use(h, ptds, &s);
	if (r != CUDA_SUCCESS)
		return r;
	/* a synchronous call, or one that reads pageable memory at the call
	 * (after a stream sync), cannot be captured */
	if (s->cap && (!async || copy_blocks(dir, async, dst, src) || (dir == D_H2D && !src->pinned)))
		return capture_refuse(s->cap);
	struct op *o = op_new(OP_COPY);
	if (!o)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->dst = dst->addr;
	o->src = src->addr;
	o->n = n;
	o->dir = dir;
	if ((o->m[0] = dst->m))
		dst->m->refs++;
	if ((o->m[1] = src->m))
		src->m->refs++;
	int blocks = copy_blocks(dir, async, dst, src);
	if (dir == D_H2D && !src->pinned) {
		/* stream sync first (o holds its memory meanwhile) */
		uint64_t seq = s->kind == S_LEGACY ? enqueue_mark(s) : s->submitted;
		r = s->kind == S_LEGACY && !seq ? CUDA_ERROR_OUT_OF_MEMORY : stream_wait_seq(s, seq);
		if (r == CUDA_SUCCESS && s->destroyed)
			r = CUDA_ERROR_INVALID_HANDLE; /* destroyed by another thread meanwhile */
		if (r != CUDA_SUCCESS) {
			if (r != CUDA_ERROR_DEINITIALIZED)
				op_free(o);
			/* after the driver's teardown o's memory may be gone: o is left alone */
			return r; /* NOLINT(clang-analyzer-unix.Malloc) */
		}
		blocks = 1;
		if (n <= STAGE_MAX && (o->staging = malloc(n))) {
			memcpy(o->staging, src->addr, n);
			o->src = o->staging;
			blocks = 0;
		}
	}
	if ((r = enqueue(s, o)) != CUDA_SUCCESS) {
		op_free(o);
		return r;
	}
	if (blocks)
		r = stream_wait_seq(s, o->seq);
	return r;
}

enum { K_DEV = 1, K_HOST, K_ANY };

static CUresult copy_api(int dk, uintptr_t dst, int sk, uintptr_t src, size_t n, CUstream h, int ptds, int async)
{
	pthread_mutex_lock(&G.mu);
	struct side d, s;
	CUresult r = async ? CUDA_SUCCESS : capture_bars(); /* a synchronous copy is unsafe in capture */
	if (r != CUDA_SUCCESS || n == 0) { /* nothing to copy; the stream must still be valid */
		struct stream *st;
		if (r == CUDA_SUCCESS)
			r = stream_get(h, ptds, &st);
		pthread_mutex_unlock(&G.mu);
		return r;
	}
	r = dk == K_DEV ? side_dev(dst, n, &d) : dk == K_HOST ? side_host(dst, n, &d) : side_any(dst, n, &d);
	if (r == CUDA_SUCCESS)
		r = sk == K_DEV ? side_dev(src, n, &s) : sk == K_HOST ? side_host(src, n, &s) : side_any(src, n, &s);
	if (r == CUDA_SUCCESS)
		r = copy_common(&d, &s, n, h, ptds, async);
	pthread_mutex_unlock(&G.mu);
	return r;
}

#define U(p) ((uintptr_t)(p))

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	ENTER("cuMemcpyHtoD_v2");
	return copy_api(K_DEV, U(dstDevice), K_HOST, U(srcHost), ByteCount, NULL, 0, 0);
}
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	ENTER("cuMemcpyHtoD_v2_ptds");
	return copy_api(K_DEV, U(dstDevice), K_HOST, U(srcHost), ByteCount, NULL, 1, 0);
}
API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER("cuMemcpyDtoH_v2");
	return copy_api(K_HOST, U(dstHost), K_DEV, U(srcDevice), ByteCount, NULL, 0, 0);
}
API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER("cuMemcpyDtoH_v2_ptds");
	return copy_api(K_HOST, U(dstHost), K_DEV, U(srcDevice), ByteCount, NULL, 1, 0);
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER("cuMemcpyDtoD_v2");
	return copy_api(K_DEV, U(dstDevice), K_DEV, U(srcDevice), ByteCount, NULL, 0, 0);
}
API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER("cuMemcpyDtoD_v2_ptds");
	return copy_api(K_DEV, U(dstDevice), K_DEV, U(srcDevice), ByteCount, NULL, 1, 0);
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyHtoDAsync_v2");
	return copy_api(K_DEV, U(dstDevice), K_HOST, U(srcHost), ByteCount, hStream, 0, 1);
}
API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
				       CUstream hStream)
{
	ENTER("cuMemcpyHtoDAsync_v2_ptsz");
	return copy_api(K_DEV, U(dstDevice), K_HOST, U(srcHost), ByteCount, hStream, 1, 1);
}
API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyDtoHAsync_v2");
	return copy_api(K_HOST, U(dstHost), K_DEV, U(srcDevice), ByteCount, hStream, 0, 1);
}
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyDtoHAsync_v2_ptsz");
	return copy_api(K_HOST, U(dstHost), K_DEV, U(srcDevice), ByteCount, hStream, 1, 1);
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyDtoDAsync_v2");
	return copy_api(K_DEV, U(dstDevice), K_DEV, U(srcDevice), ByteCount, hStream, 0, 1);
}
API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				       CUstream hStream)
{
	ENTER("cuMemcpyDtoDAsync_v2_ptsz");
	return copy_api(K_DEV, U(dstDevice), K_DEV, U(srcDevice), ByteCount, hStream, 1, 1);
}
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	ENTER("cuMemcpy");
	return copy_api(K_ANY, U(dst), K_ANY, U(src), ByteCount, NULL, 0, 0);
}
API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	ENTER("cuMemcpy_ptds");
	return copy_api(K_ANY, U(dst), K_ANY, U(src), ByteCount, NULL, 1, 0);
}
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyAsync");
	return copy_api(K_ANY, U(dst), K_ANY, U(src), ByteCount, hStream, 0, 1);
}
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyAsync_ptsz");
	return copy_api(K_ANY, U(dst), K_ANY, U(src), ByteCount, hStream, 1, 1);
}

/* cuMemcpyPeer: asynchronous to the host, but serialised with all pending
 * and future work of the legacy streams of the current, source and
 * destination contexts. The copy runs on the destination's legacy stream
 * after the others' earlier work; the others get a marker that waits for
 * it. cuMemcpyPeerAsync just enqueues on its stream. */
static CUresult peer_api(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream h,
			 int ptds, int async)
{
	struct ctx *dc = ctx_check(dctx), *sc = ctx_check(sctx);
	if (!dc || !sc)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	struct side d, s;
	CUresult r = async ? CUDA_SUCCESS : capture_bars();
	if (r == CUDA_SUCCESS && n && (r = side_dev(U(dst), n, &d)) == CUDA_SUCCESS)
		r = side_dev(U(src), n, &s);
	if (r != CUDA_SUCCESS || async || n == 0) {
		if (r == CUDA_SUCCESS && n)
			r = copy_common(&d, &s, n, h, ptds, 1);
		else if (r == CUDA_SUCCESS) {
			struct stream *st;
			r = stream_get(h, ptds, &st);
		}
		pthread_mutex_unlock(&G.mu);
		return r;
	}
	struct stream *ls[3] = {legacy_of(dc), legacy_of(sc), tls_ctx ? legacy_of(tls_ctx) : NULL};
	for (int i = 0; i < 3 && r == CUDA_SUCCESS; i++)
		if (ls[i])
			r = legacy_usable(ls[i], 1);
	struct op *o = r == CUDA_SUCCESS ? op_new(OP_COPY) : NULL;
	if (r != CUDA_SUCCESS || !ls[0] || !ls[1] || !o) {
		free(o);
		pthread_mutex_unlock(&G.mu);
		return r != CUDA_SUCCESS ? r : CUDA_ERROR_OUT_OF_MEMORY;
	}
	o->dst = d.addr;
	o->src = s.addr;
	o->n = n;
	o->dir = d.dev == s.dev ? D_D2D : D_PEER;
	o->m[0] = d.m, d.m->refs++;
	o->m[1] = s.m, s.m->refs++;
	for (int i = 1; i < 3; i++)
		if (ls[i] && ls[i] != ls[0] && add_dep(o, ls[i], ls[i]->submitted) < 0)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS)
		r = enqueue(ls[0], o);
	if (r != CUDA_SUCCESS) {
		op_free(o);
		pthread_mutex_unlock(&G.mu);
		return r;
	}
	for (int i = 1; i < 3; i++) {
		if (!ls[i] || ls[i] == ls[0] || (i == 2 && ls[2] == ls[1]))
			continue;
		struct op *mk = op_new(OP_MARK);
		if (!mk || add_dep(mk, ls[0], o->seq) < 0 || enqueue(ls[i], mk) != CUDA_SUCCESS) {
			if (mk)
				op_free(mk);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
			  size_t ByteCount)
{
	ENTER("cuMemcpyPeer");
	return peer_api(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, 0, 0);
}
API CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			       CUcontext srcContext, size_t ByteCount)
{
	ENTER("cuMemcpyPeer_ptds");
	return peer_api(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, 1, 0);
}
API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			       CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyPeerAsync");
	return peer_api(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, 0, 1);
}
API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				    CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyPeerAsync_ptsz");
	return peer_api(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, 1, 1);
}

/* Device memory set: asynchronous to the host (device memory only). The
 * synchronous entry points are still unsafe calls in capture. */
static CUresult memset_api(CUdeviceptr dst, unsigned char v, size_t n, CUstream h, int ptds, int async)
{
	pthread_mutex_lock(&G.mu);
	struct side d = { 0 };
	struct stream *s = NULL;
	CUresult r = async ? CUDA_SUCCESS : capture_bars();
	if (r == CUDA_SUCCESS)
		r = stream_use(h, ptds, &s);
	if (r == CUDA_SUCCESS && s->cap && !async)
		r = capture_refuse(s->cap);
	if (r == CUDA_SUCCESS && n)
		r = side_dev(U(dst), n, &d);
	if (r == CUDA_SUCCESS && n) {
		struct op *o = op_new(OP_MEMSET);
		if (!o) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			o->dst = d.addr;
			o->n = n;
			o->value = v;
			o->m[0] = d.m, d.m->refs++;
			if ((r = enqueue(s, o)) != CUDA_SUCCESS)
				op_free(o);
		}
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	ENTER("cuMemsetD8_v2");
	return memset_api(dstDevice, uc, N, NULL, 0, 0);
}
API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	ENTER("cuMemsetD8_v2_ptds");
	return memset_api(dstDevice, uc, N, NULL, 1, 0);
}
API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	ENTER("cuMemsetD8Async");
	return memset_api(dstDevice, uc, N, hStream, 0, 1);
}
API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	ENTER("cuMemsetD8Async_ptsz");
	return memset_api(dstDevice, uc, N, hStream, 1, 1);
}

/* ---- pinned host memory ----------------------------------------------------------------- */

static CUresult host_add(int kind, void *p, size_t n, unsigned flags)
{
	struct mem *m = calloc(1, sizeof *m);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->kind = kind;
	m->dev = tls_ctx->dev;
	m->ctx = tls_ctx;
	m->base = U(p);
	m->data = p;
	m->size = n;
	m->fd = -1;
	m->flags = flags;
	m->refs = 1;
	m->id = G.next_id++;
	if (mem_insert(m) < 0) {
		free(m);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	ENTER("cuMemHostAlloc");
	UNSAFE();
	if (!pp || bytesize == 0 ||
	    (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)))
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	size_t len = page_round(bytesize);
	if (len < bytesize)
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&G.mu);
	CUresult r = host_add(M_HOSTALLOC, p, bytesize, Flags);
	pthread_mutex_unlock(&G.mu);
	if (r != CUDA_SUCCESS) {
		munmap(p, len);
		return r;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	return cuMemHostAlloc(pp, bytesize, 0);
}

API CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
	return cuMemHostAlloc(pp, bytesize, 0);
}

/* Like cudaFreeHost, waits for the context's work first. */
API CUresult cuMemFreeHost(void *p)
{
	ENTER("cuMemFreeHost");
	UNSAFE();
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find(U(p));
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (p && m && m->kind == M_HOSTALLOC && m->base == U(p)) {
		m->refs++;
		r = ctx_sync(m->ctx);
		if (r == CUDA_SUCCESS && mem_find(U(p)) == m) {
			mem_remove(m);
			m->refs--;
		}
		mem_unref(m);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	ENTER("cuMemHostRegister_v2");
	UNSAFE();
	if (!p || bytesize == 0 || U(p) + bytesize < U(p) ||
	    (Flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
				 CU_MEMHOSTREGISTER_READ_ONLY)))
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	CUresult r;
	struct mem *m = mem_find(U(p));
	if (is_dev(m))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (mem_overlaps(U(p), bytesize))
		r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	else
		r = host_add(M_HOSTREG, p, bytesize, Flags);
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	return cuMemHostRegister_v2(p, bytesize, Flags);
}

API CUresult cuMemHostUnregister(void *p)
{
	ENTER("cuMemHostUnregister");
	UNSAFE();
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find(U(p));
	CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	if (m && m->kind == M_HOSTREG && m->base == U(p)) {
		m->refs++;
		r = ctx_sync(m->ctx);
		if (r == CUDA_SUCCESS && mem_find(U(p)) == m) {
			mem_remove(m);
			m->refs--;
		}
		mem_unref(m);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	ENTER("cuPointerGetAttribute");
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find(U(ptr));
	if (!m || U(ptr) - m->base >= m->size) {
		pthread_mutex_unlock(&G.mu);
		return CUDA_ERROR_INVALID_VALUE; /* not allocated, mapped or registered by CUDA */
	}
	int dev = is_dev(m);
	CUresult r = CUDA_SUCCESS;
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		/* memory of the virtual-memory API or of a stream-ordered pool (PyTorch's
		 * expandable_segments, cudaMallocAsync) belongs to no context */
		*(CUcontext *)data = G.ctxless && dev ? NULL : (CUcontext)m->ctx;
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (dev)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			*(void **)data = (void *)U(ptr);
		break;
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = 0; break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = m->id; break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = m->dev; break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = m->kind == M_DEV; break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)m->base; break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = m->size; break;
	case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
	default: r = CUDA_ERROR_INVALID_VALUE; break;
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* ---- streams ------------------------------------------------------------------------------ */

API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	ENTER("cuStreamCreate");
	if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	streams_reap();
	struct stream *s = stream_new(tls_ctx, S_USER, Flags);
	pthread_mutex_unlock(&G.mu);
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*phStream = (CUstream)s;
	return CUDA_SUCCESS;
}

/* Returns at once; the stream's remaining work still runs. */
API CUresult cuStreamDestroy_v2(CUstream hStream)
{
	ENTER("cuStreamDestroy_v2");
	if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_get(hStream, 0, &s);
	if (r == CUDA_SUCCESS) {
		capture_discard(s); /* (assumed: CUDA does not say) */
		stream_retire(s);
		streams_reap();
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamDestroy(CUstream hStream)
{
	return cuStreamDestroy_v2(hStream);
}

/* "It is invalid to synchronize or query the execution status of a stream
 * which is being captured": refused in any mode. Otherwise an unsafe call.
 * Under G.mu. */
static CUresult sync_allowed(struct stream *s)
{
	return s->cap ? capture_refuse(s->cap) : capture_bars();
}

static CUresult sync_api(CUstream h, int ptds)
{
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_use(h, ptds, &s);
	if (r == CUDA_SUCCESS)
		r = sync_allowed(s);
	if (r == CUDA_SUCCESS) {
		/* On the legacy stream, synchronising means waiting for an
		 * empty operation (it carries the implicit dependencies). */
		uint64_t seq = s->kind == S_LEGACY ? enqueue_mark(s) : s->submitted;
		if (s->kind == S_LEGACY && !seq)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			r = stream_wait_seq(s, seq);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamSynchronize(CUstream hStream)
{
	ENTER("cuStreamSynchronize");
	return sync_api(hStream, 0);
}
API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	ENTER("cuStreamSynchronize_ptsz");
	return sync_api(hStream, 1);
}

static CUresult query_api(CUstream h, int ptds)
{
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_use(h, ptds, &s);
	if (r == CUDA_SUCCESS)
		r = sync_allowed(s);
	if (r == CUDA_SUCCESS && s->completed < s->submitted)
		r = CUDA_ERROR_NOT_READY;
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamQuery(CUstream hStream)
{
	ENTER("cuStreamQuery");
	return query_api(hStream, 0);
}
API CUresult cuStreamQuery_ptsz(CUstream hStream)
{
	ENTER("cuStreamQuery_ptsz");
	return query_api(hStream, 1);
}

/* An event wait node in the capture s is in; its wait is resolved at each launch. */
static CUresult capture_wait_node(struct stream *s, struct event *e)
{
	struct op *o = op_new(OP_WAITEV);
	if (!o)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->ev = e;
	e->refs++;
	CUresult r = capture_add(s, o);
	if (r != CUDA_SUCCESS)
		op_free(o);
	return r;
}

/*
 * A wait that involves a capture, by CUDA's cross-stream rules (one stream
 * per capture here). A capturing stream may wait on an event recorded
 * earlier in its own capture (in-stream order), or on any event with
 * CU_EVENT_WAIT_EXTERNAL (an event wait node, waiting at each launch for
 * the event's latest record then); on one recorded outside it, the
 * dependency would cross the capture's boundary (ISOLATION), on one of
 * another capture it would merge the two (MERGE): the captures are
 * invalidated. A stream outside any capture may not use
 * CU_EVENT_WAIT_EXTERNAL ("invalid outside of stream capture"); waiting on
 * an event of an open capture would join it (not modelled), on one last
 * recorded in a capture that has ended is refused (assumed: no work stands
 * behind it). 1: handled, the result in *r; 0: an ordinary wait. Under G.mu.
 */
static int capture_wait(struct stream *s, struct event *e, unsigned flags, CUresult *r)
{
	struct capture *c = s->cap, *ec = e->cap_id ? capture_by_id(e->cap_id) : NULL;
	int external = (flags & CU_EVENT_WAIT_EXTERNAL) != 0;
	if (!c) {
		if (!external && !e->cap_id)
			return 0;
		*r = external ? CUDA_ERROR_INVALID_VALUE : ec ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_CAPTURED_EVENT;
		return 1;
	}
	if (c->invalid) {
		*r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	} else if (external) {
		*r = capture_wait_node(s, e);
	} else if (e->cap_id == c->id || (!e->cap_id && !__atomic_load_n(&e->sh->recorded, __ATOMIC_ACQUIRE))) {
		*r = CUDA_SUCCESS; /* in-stream order; or an event never recorded: no work to wait for */
	} else {
		if (ec)
			ec->invalid = 1;
		c->invalid = 1;
		*r = ec ? CUDA_ERROR_STREAM_CAPTURE_MERGE : CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
	}
	return 1;
}

/* Later work on the stream waits for the event's latest record (as of
 * this call) to complete, in this process or, for an imported
 * interprocess event, in the exporter. */
static CUresult wait_api(CUstream h, CUevent ev, unsigned flags, int ptds)
{
	if (flags & ~1u) /* CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL */
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	struct event *e = event_get(ev);
	CUresult r = e ? stream_use(h, ptds, &s) : CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS && !capture_wait(s, e, flags, &r)) {
		ST_ADD(stream_waits, 1);
		uint64_t gen = __atomic_load_n(&e->sh->recorded, __ATOMIC_ACQUIRE);
		if (gen > __atomic_load_n(&e->sh->done, __ATOMIC_ACQUIRE)) {
			struct op *o = op_new(OP_WAITEV);
			if (!o) {
				r = CUDA_ERROR_OUT_OF_MEMORY;
			} else {
				o->ev = e, e->refs++;
				o->gen = gen;
				if ((r = enqueue(s, o)) != CUDA_SUCCESS)
					op_free(o);
			}
		}
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	ENTER("cuStreamWaitEvent");
	return wait_api(hStream, hEvent, Flags, 0);
}
API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	ENTER("cuStreamWaitEvent_ptsz");
	return wait_api(hStream, hEvent, Flags, 1);
}

/* The stream runs fn(user) on the host when the work before it is done, and
 * the work after it waits for fn to return. Not in a capture (host nodes are
 * not modelled): refused there, the capture left as it was. */
static CUresult hostfn_api(CUstream h, CUhostFn fn, void *user, int ptds)
{
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_use(h, ptds, &s);
	if (r == CUDA_SUCCESS && s->cap)
		r = CUDA_ERROR_NOT_SUPPORTED;
	if (r == CUDA_SUCCESS) {
		struct op *o = op_new(OP_HOSTFN);
		if (!o) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			o->fn = fn, o->user = user;
			if ((r = enqueue(s, o)) != CUDA_SUCCESS)
				op_free(o);
		}
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	ENTER("cuLaunchHostFunc");
	return hostfn_api(hStream, fn, userData, 0);
}
API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
	ENTER("cuLaunchHostFunc_ptsz");
	return hostfn_api(hStream, fn, userData, 1);
}

/* ---- events ------------------------------------------------------------------------------ */

static struct event *event_new(unsigned flags)
{
	struct event *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->magic = EVENT_MAGIC;
	e->flags = flags;
	e->ctx = tls_ctx;
	e->fd = -1;
	e->refs = 1;
	e->id = G.next_id++;
	return e;
}

static struct evsh *evsh_map(int fd)
{
	void *p = mmap(NULL, page_round(sizeof(struct evsh)), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	/* cppcheck-suppress memleak ; MAP_FAILED is no mapping, p is returned otherwise */
	return p == MAP_FAILED ? NULL : p;
}

API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	ENTER("cuEventCreate");
	unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
	if (!phEvent || (Flags & ~all) ||
	    ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&G.mu);
	struct event *e = event_new(Flags);
	pthread_mutex_unlock(&G.mu);
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (Flags & CU_EVENT_INTERPROCESS) {
		char name[64];
		struct stat st;
		snprintf(name, sizeof name, "tsemu-event-%llu", (unsigned long long)e->id);
		e->fd = memfd_create(name, MFD_CLOEXEC);
		if (e->fd < 0 || ftruncate(e->fd, (off_t)page_round(sizeof *e->sh)) < 0 || fstat(e->fd, &st) < 0 ||
		    !(e->sh = evsh_map(e->fd))) {
			if (e->fd >= 0)
				close(e->fd);
			free(e);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		e->ino = (uint64_t)st.st_ino;
	} else if (!(e->sh = calloc(1, sizeof *e->sh))) {
		free(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->sh->magic = EVSH_MAGIC;
	e->sh->version = IPC_VERSION;
	pthread_mutex_lock(&G.mu);
	e->next_all = G.events;
	G.events = e;
	pthread_mutex_unlock(&G.mu);
	*phEvent = (CUevent)e;
	return CUDA_SUCCESS;
}

/* In a capture, a record runs nothing: the event now stands for the
 * captured work, to fork or join streams of the capture on CUDA. */
static CUresult record_api(CUevent ev, CUstream h, int ptds)
{
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	struct event *e = event_get(ev);
	CUresult r = e ? stream_use(h, ptds, &s) : CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS && s->ctx != e->ctx)
		r = CUDA_ERROR_INVALID_HANDLE; /* event and stream of different contexts */
	if (r == CUDA_SUCCESS && s->cap) {
		if (s->cap->invalid)
			r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		else
			e->cap_id = s->cap->id;
	} else if (r == CUDA_SUCCESS) {
		e->cap_id = 0;
		struct op *o = op_new(OP_RECORD);
		if (!o) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			o->ev = e, e->refs++;
			o->gen = __atomic_add_fetch(&e->sh->recorded, 1, __ATOMIC_ACQ_REL);
			__atomic_store_n(&e->sh->recorder, (int32_t)G.pid, __ATOMIC_RELEASE);
			ST_ADD(event_records, 1);
			if ((r = enqueue(s, o)) != CUDA_SUCCESS)
				op_free(o);
		}
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	ENTER("cuEventRecord");
	return record_api(hEvent, hStream, 0);
}
API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	ENTER("cuEventRecord_ptsz");
	return record_api(hEvent, hStream, 1);
}

/* An event last recorded in a capture stands for no work that runs: it may
 * not be queried or waited for, in any capture mode (its capture, if still
 * open, is invalidated). Otherwise these are unsafe calls. Under G.mu. */
static CUresult event_waitable(struct event *e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!e->cap_id)
		return capture_bars();
	struct capture *c = capture_by_id(e->cap_id);
	if (c)
		c->invalid = 1;
	return CUDA_ERROR_CAPTURED_EVENT;
}

API CUresult cuEventQuery(CUevent hEvent)
{
	ENTER("cuEventQuery");
	pthread_mutex_lock(&G.mu);
	struct event *e = event_get(hEvent);
	CUresult r = event_waitable(e);
	if (r == CUDA_SUCCESS) {
		uint64_t gen = __atomic_load_n(&e->sh->recorded, __ATOMIC_ACQUIRE);
		r = __atomic_load_n(&e->sh->done, __ATOMIC_ACQUIRE) >= gen || ev_recorder_gone(e->sh, gen)
			    ? CUDA_SUCCESS
			    : CUDA_ERROR_NOT_READY; /* (as a wait for it ends: ev_wait) */
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuEventSynchronize(CUevent hEvent)
{
	ENTER("cuEventSynchronize");
	pthread_mutex_lock(&G.mu);
	struct event *e = event_get(hEvent);
	CUresult r = event_waitable(e);
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&G.mu);
		return r;
	}
	e->refs++;
	uint64_t gen = __atomic_load_n(&e->sh->recorded, __ATOMIC_ACQUIRE);
	pthread_mutex_unlock(&G.mu);
	int rc = ev_wait(e->sh, gen);
	pthread_mutex_lock(&G.mu);
	event_unref(e);
	pthread_mutex_unlock(&G.mu);
	return rc < 0 ? CUDA_ERROR_DEINITIALIZED : CUDA_SUCCESS;
}

/* Destroying an event with work pending is allowed: it is released when
 * that work is done. */
API CUresult cuEventDestroy_v2(CUevent hEvent)
{
	ENTER("cuEventDestroy_v2");
	pthread_mutex_lock(&G.mu);
	struct event *e = event_get(hEvent);
	if (!e) {
		pthread_mutex_unlock(&G.mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	for (struct event **pp = &G.events; *pp; pp = &(*pp)->next_all)
		if (*pp == e) {
			*pp = e->next_all;
			break;
		}
	e->destroyed = 1;
	e->magic = 0;
	event_unref(e);
	pthread_mutex_unlock(&G.mu);
	return CUDA_SUCCESS;
}

API CUresult cuEventDestroy(CUevent hEvent)
{
	return cuEventDestroy_v2(hEvent);
}

API CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	ENTER("cuEventElapsedTime_v2");
	if (!pMilliseconds)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct event *a = event_get(hStart), *b = event_get(hEnd);
	CUresult r = CUDA_SUCCESS;
	if (!a || !b || (a->flags & CU_EVENT_DISABLE_TIMING) || (b->flags & CU_EVENT_DISABLE_TIMING) ||
	    !a->sh->recorded || !b->sh->recorded)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (a->sh->done < a->sh->recorded || b->sh->done < b->sh->recorded)
		r = CUDA_ERROR_NOT_READY;
	else
		*pMilliseconds = (float)(((double)b->sh->done_ns - (double)a->sh->done_ns) / 1e6);
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

/* ---- stream capture and graphs -------------------------------------------------------------- */

static CUresult begin_api(CUstream h, int ptds, CUstreamCaptureMode mode)
{
	if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_get(h, ptds, &s);
	if (r == CUDA_SUCCESS && s->kind == S_LEGACY)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* "may not be initiated if stream is CU_STREAM_LEGACY" */
	else if (r == CUDA_SUCCESS && s->cap)
		r = CUDA_ERROR_ILLEGAL_STATE;
	struct capture *c = NULL;
	if (r == CUDA_SUCCESS && (!(c = calloc(1, sizeof *c)) || !(c->g = calloc(1, sizeof *c->g))))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS) {
		c->g->magic = GRAPH_MAGIC;
		c->id = G.next_id++;
		c->mode = mode;
		c->thread = pthread_self();
		c->ctx = s->ctx;
		c->blocking = blocking(s);
		c->next_all = G.captures;
		G.captures = c;
		__atomic_add_fetch(&G.ncaptures, 1, __ATOMIC_RELEASE);
		s->cap = c;
	} else if (c) {
		free(c);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	ENTER("cuStreamBeginCapture_v2");
	return begin_api(hStream, 0, mode);
}
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	ENTER("cuStreamBeginCapture_v2_ptsz");
	return begin_api(hStream, 1, mode);
}

/* The capture's graph, or (invalidated) NULL and CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
static CUresult end_api(CUstream h, int ptds, CUgraph *phGraph)
{
	if (!phGraph)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_get(h, ptds, &s);
	struct capture *c = r == CUDA_SUCCESS ? s->cap : NULL;
	if (r == CUDA_SUCCESS && !c)
		r = CUDA_ERROR_ILLEGAL_STATE;
	else if (c && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
		r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
	if (r == CUDA_SUCCESS) {
		*phGraph = NULL;
		if (c->invalid) {
			r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		} else {
			c->g->next_all = G.graphs;
			G.graphs = c->g;
			*phGraph = (CUgraph)c->g;
			c->g = NULL; /* the program's now */
		}
		capture_discard(s);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	ENTER("cuStreamEndCapture");
	return end_api(hStream, 0, phGraph);
}
API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	ENTER("cuStreamEndCapture_ptsz");
	return end_api(hStream, 1, phGraph);
}

static const CUgraphEdgeData no_edge_data[1];

/*
 * A stream's capture status; while ACTIVE also its id, graph and the node
 * the next one would depend on (the last captured). The legacy stream
 * beside a blocking capture: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "the
 * blocking stream capture is not invalidated".
 */
static CUresult info_api(CUstream h, int ptds, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
			 const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps)
{
	if (!status || (edges && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct stream *s;
	CUresult r = stream_get(h, ptds, &s);
	if (r == CUDA_SUCCESS)
		r = legacy_usable(s, 0);
	if (r == CUDA_SUCCESS) {
		const struct capture *c = s->cap;
		int on = c && !c->invalid, last = on && c->g->tail;
		*status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
		    : c->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
		if (id)
			*id = on ? c->id : 0;
		if (graph)
			*graph = on ? (CUgraph)c->g : NULL;
		if (deps)
			*deps = last ? &c->g->last : NULL;
		if (edges)
			*edges = last ? no_edge_data : NULL;
		if (ndeps)
			*ndeps = last ? 1 : 0;
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	ENTER("cuStreamIsCapturing");
	return info_api(hStream, 0, captureStatus, NULL, NULL, NULL, NULL, NULL);
}
API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	ENTER("cuStreamIsCapturing_ptsz");
	return info_api(hStream, 1, captureStatus, NULL, NULL, NULL, NULL, NULL);
}
/* The version CUDA 13's cuda.h declares as cuStreamGetCaptureInfo. */
API CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
				       CUgraph *graph_out, const CUgraphNode **dependencies_out,
				       const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
	ENTER("cuStreamGetCaptureInfo_v3");
	return info_api(hStream, 0, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
			numDependencies_out);
}
API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					    cuuint64_t *id_out, CUgraph *graph_out,
					    const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out,
					    size_t *numDependencies_out)
{
	ENTER("cuStreamGetCaptureInfo_v3_ptsz");
	return info_api(hStream, 1, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
			numDependencies_out);
}

API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	ENTER("cuThreadExchangeStreamCaptureMode");
	if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	CUstreamCaptureMode old = tls_capmode;
	tls_capmode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

static struct graph *graph_get(const void *h, uint32_t magic)
{
	for (struct graph *g = G.graphs; g; g = g->next_all)
		if (g == (const struct graph *)h && g->magic == magic)
			return g;
	return NULL;
}

/* A copy of node o, its memory and event held again; for a launch, an
 * event wait waits for the event's latest record as of now. */
static struct op *node_clone(const struct op *o, int launch)
{
	struct op *c = op_new(o->kind);
	if (!c)
		return NULL;
	c->dst = o->dst;
	c->src = o->src;
	c->n = o->n;
	c->dir = o->dir;
	c->value = o->value;
	for (int i = 0; i < 2; i++)
		if ((c->m[i] = o->m[i]))
			c->m[i]->refs++;
	if ((c->ev = o->ev)) {
		c->ev->refs++;
		c->gen = launch ? __atomic_load_n(&o->ev->sh->recorded, __ATOMIC_ACQUIRE) : 0;
	}
	return c;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	ENTER("cuGraphInstantiateWithFlags");
	unsigned long long all = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
				 CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
	if (!phGraphExec || (flags & ~all))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	const struct graph *g = graph_get(hGraph, GRAPH_MAGIC);
	struct graph *x = g ? calloc(1, sizeof *x) : NULL;
	CUresult r = !g ? CUDA_ERROR_INVALID_VALUE : !x ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
	for (const struct op *o = r == CUDA_SUCCESS ? g->head : NULL; o && r == CUDA_SUCCESS; o = o->next) {
		struct op *c = node_clone(o, 0);
		if (c)
			graph_append(x, c);
		else
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (r == CUDA_SUCCESS) {
		x->magic = GEXEC_MAGIC;
		x->next_all = G.graphs;
		G.graphs = x;
		*phGraphExec = (CUgraphExec)x;
	} else if (x) {
		graph_free(x);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* The executable graph's nodes, in order, on the stream: a copy reads its
 * source when it runs, not when the graph was captured. */
static CUresult launch_api(CUgraphExec hGraphExec, CUstream h, int ptds)
{
	pthread_mutex_lock(&G.mu);
	const struct graph *x = graph_get(hGraphExec, GEXEC_MAGIC);
	struct stream *s;
	CUresult r = x ? stream_use(h, ptds, &s) : CUDA_ERROR_INVALID_VALUE;
	for (const struct op *o = r == CUDA_SUCCESS ? x->head : NULL; o && r == CUDA_SUCCESS; o = o->next) {
		struct op *c = node_clone(o, 1);
		if (!c)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else if ((r = enqueue(s, c)) != CUDA_SUCCESS)
			op_free(c);
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	ENTER("cuGraphLaunch");
	return launch_api(hGraphExec, hStream, 0);
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	ENTER("cuGraphLaunch_ptsz");
	return launch_api(hGraphExec, hStream, 1);
}

/* A graph's launches in flight run to their end: they hold what they use. */
static CUresult graph_destroy(const void *h, uint32_t magic)
{
	pthread_mutex_lock(&G.mu);
	struct graph *g = graph_get(h, magic);
	if (g) {
		for (struct graph **pp = &G.graphs; *pp; pp = &(*pp)->next_all)
			if (*pp == g) {
				*pp = g->next_all;
				break;
			}
		graph_free(g);
	}
	pthread_mutex_unlock(&G.mu);
	return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	ENTER("cuGraphExecDestroy");
	return graph_destroy(hGraphExec, GEXEC_MAGIC);
}

API CUresult cuGraphDestroy(CUgraph hGraph)
{
	ENTER("cuGraphDestroy");
	return graph_destroy(hGraph, GRAPH_MAGIC);
}

/* ---- IPC ---------------------------------------------------------------------------------- */

static void handle_fill(struct ipc_handle *h, char kind, int dev, int fd, uint64_t ino, uint64_t size, uint64_t id)
{
	memset(h, 0, sizeof *h);
	memcpy(h->magic, IPC_MAGIC, 4);
	h->kind = (uint8_t)kind;
	h->dev = (uint8_t)dev;
	h->version = IPC_VERSION;
	h->pid = (int32_t)G.pid;
	h->fd = fd;
	h->uid = (uint32_t)getuid();
	h->ino = ino;
	h->size = size;
	h->id = id;
}

/* Open the exporter's memfd through /proc. The caller checked the handle. */
static int handle_open(const struct ipc_handle *h, size_t minsize)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_ino != h->ino || (size_t)st.st_size < minsize ||
	    st.st_uid != getuid()) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Only the base of a cuMemAlloc allocation can be exported. */
API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	ENTER("cuIpcGetMemHandle");
	if (!pHandle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find(U(dptr));
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (m && m->kind == M_DEV && m->base == U(dptr)) {
		struct ipc_handle h;
		handle_fill(&h, 'M', m->dev, m->fd, m->ino, m->size, m->id);
		memset(pHandle, 0, sizeof *pHandle);
		memcpy(pHandle->reserved, &h, sizeof h);
		ST_ADD(ipc_mem_exports, 1);
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

static CUresult handle_check(const char *raw, char kind, struct ipc_handle *h)
{
	memcpy(h, raw, sizeof *h);
	if (memcmp(h->magic, IPC_MAGIC, 4) || h->kind != (uint8_t)kind || h->version != IPC_VERSION || h->pid <= 0 ||
	    h->fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* Opening a handle in the process that exported it fails with "invalid
	 * device context" (CUDA_ERROR_INVALID_CONTEXT; the runtime's
	 * cudaErrorDeviceUninitialized, 201), as real CUDA does. */
	if (h->pid == (int32_t)G.pid)
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

/*
 * CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS on another device's handle enables
 * peer access "as if the user called cuCtxEnablePeerAccess" (cuda.h): the
 * program sees it, its own enable then answers ALREADY_ENABLED. Done
 * before the mapping (real CUDA enables access to map); a failed open
 * leaves it, as a failed map may. Called with G.mu.
 */
static void lazy_peer_access(uint32_t dev, unsigned int Flags)
{
	if ((Flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) && (int)dev != tls_ctx->dev && (int)dev < G.ndev)
		tls_ctx->peers |= 1u << dev;
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	ENTER("cuIpcOpenMemHandle_v2");
	UNSAFE();
	if (!pdptr || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct ipc_handle h;
	CUresult r = handle_check(handle.reserved, 'M', &h);
	if (r != CUDA_SUCCESS)
		return r;
	/* (the exporter's device need not be visible here, as documented) */
	if (h.size == 0 || h.dev >= MAXDEV)
		return CUDA_ERROR_INVALID_VALUE;
	/* Already open in this context: one more reference, same pointer. */
	pthread_mutex_lock(&G.mu);
	lazy_peer_access(h.dev, Flags);
	for (size_t i = 0; i < G.nmem; i++) {
		struct mem *m = G.mems[i];
		if (m->kind == M_IPC && m->ctx == tls_ctx && m->peer_pid == h.pid && m->peer_id == h.id &&
		    m->ino == h.ino) {
			m->opens++;
			ST_ADD(ipc_mem_opens, 1);
			*pdptr = (CUdeviceptr)m->base;
			pthread_mutex_unlock(&G.mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&G.mu);
	size_t maplen = page_round(h.size);
	int fd = handle_open(&h, maplen + page_round(1));
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE; /* exporter gone, or the allocation freed */
	struct mem *m = calloc(1, sizeof *m);
	if (!m) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m->kind = M_IPC;
	m->dev = h.dev;
	m->ctx = tls_ctx;
	m->size = h.size;
	m->maplen = maplen;
	m->fd = -1;
	m->ino = h.ino;
	m->refs = 1;
	m->opens = 1;
	m->peer_pid = h.pid;
	m->peer_id = h.id;
	r = map_device(fd, maplen, &m->base, &m->data);
	if (r == CUDA_SUCCESS)
		importer_join(m, fd);
	close(fd);
	if (r != CUDA_SUCCESS) {
		free(m);
		return r;
	}
	pthread_mutex_lock(&G.mu);
	m->id = G.next_id++;
	if (mem_insert(m) < 0) {
		m->refs = 1;
		mem_unref(m);
		pthread_mutex_unlock(&G.mu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	ST_ADD(ipc_mem_opens, 1);
	pthread_mutex_unlock(&G.mu);
	*pdptr = (CUdeviceptr)m->base;
	return CUDA_SUCCESS;
}

API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

/* Drops one open; the last one unmaps (after the context's work). */
API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	ENTER("cuIpcCloseMemHandle");
	UNSAFE();
	pthread_mutex_lock(&G.mu);
	struct mem *m = mem_find(U(dptr));
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (m && m->kind == M_IPC && m->base == U(dptr)) {
		r = CUDA_SUCCESS;
		ST_ADD(ipc_mem_closes, 1);
		if (--m->opens == 0) {
			m->refs++;
			r = ctx_sync(m->ctx);
			if (mem_find(U(dptr)) == m) {
				mem_remove(m);
				m->refs--;
			}
			mem_unref(m);
		}
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

API CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
	ENTER("cuIpcGetEventHandle");
	if (!pHandle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&G.mu);
	struct event *e = event_get(event);
	CUresult r = CUDA_ERROR_INVALID_HANDLE;
	if (e && (!(e->flags & CU_EVENT_INTERPROCESS) || e->imported || e->fd < 0)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (e) {
		struct ipc_handle h;
		handle_fill(&h, 'E', e->ctx ? e->ctx->dev : 0, e->fd, e->ino, page_round(sizeof *e->sh), e->id);
		memset(pHandle, 0, sizeof *pHandle);
		memcpy(pHandle->reserved, &h, sizeof h);
		ST_ADD(ipc_event_exports, 1);
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&G.mu);
	return r;
}

/* The imported event behaves like a local CU_EVENT_DISABLE_TIMING event
 * whose state is the exporter's. (Opening it in the exporting process is
 * refused like a memory handle: assumed, the documentation is silent.) */
API CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
	ENTER("cuIpcOpenEventHandle");
	if (!phEvent)
		return CUDA_ERROR_INVALID_VALUE;
	if (!tls_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct ipc_handle h;
	CUresult r = handle_check(handle.reserved, 'E', &h);
	if (r != CUDA_SUCCESS)
		return r;
	int fd = handle_open(&h, page_round(sizeof(struct evsh)));
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct evsh *sh = evsh_map(fd);
	close(fd);
	if (!sh)
		return CUDA_ERROR_MAP_FAILED;
	if (sh->magic != EVSH_MAGIC) {
		munmap(sh, page_round(sizeof *sh));
		return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_lock(&G.mu);
	struct event *e = event_new(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
	if (!e) {
		pthread_mutex_unlock(&G.mu);
		munmap(sh, page_round(sizeof *sh));
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->sh = sh;
	e->imported = 1;
	e->peer_pid = h.pid;
	e->ino = h.ino;
	e->next_all = G.events;
	G.events = e;
	ST_ADD(ipc_event_opens, 1);
	pthread_mutex_unlock(&G.mu);
	*phEvent = (CUevent)e;
	return CUDA_SUCCESS;
}

/* ---- errors -------------------------------------------------------------------------------- */

API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	switch (error) {
#define X(cu, rt, msg) \
	case cu: *pStr = msg; return CUDA_SUCCESS;
		TSEMU_ERRORS(X)
#undef X
	default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
}

API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	switch (error) {
#define X(cu, rt, msg) \
	case cu: *pStr = #cu; return CUDA_SUCCESS;
		TSEMU_ERRORS(X)
#undef X
	default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
}

/* ---- cuGetProcAddress ------------------------------------------------------------------------ */

/* Base name, the CUDA version that introduced this variant, per-thread
 * variant or not, the symbol and the function. cuGetProcAddress picks, for
 * a base name, the newest variant not newer than the version asked for
 * (a per-thread one when asked and available), as the real driver does. */
struct proc {
	const char *name;
	int version, ptds;
	const char *sym;
	void *fn;
};

#define PR(base, ver, fn) {#base, ver, 0, #fn, (void *)(fn)}
#define PT(base, ver, fn) {#base, ver, 1, #fn, (void *)(fn)}

static const struct proc procs[] = {
	PR(cuInit, 2000, cuInit),
	PR(cuDriverGetVersion, 2020, cuDriverGetVersion),
	PR(cuDeviceGet, 2000, cuDeviceGet),
	PR(cuDeviceGetCount, 2000, cuDeviceGetCount),
	PR(cuDeviceGetName, 2000, cuDeviceGetName),
	PR(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
	PR(cuDeviceTotalMem, 2000, cuDeviceTotalMem),
	PR(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
	PR(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId),
	PR(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer),
	PR(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
	PR(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease),
	PR(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
	PR(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),
	PR(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset),
	PR(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
	PR(cuCtxCreate, 3020, cuCtxCreate_v2),
	PR(cuCtxCreate, 11040, cuCtxCreate_v3),
	PR(cuCtxCreate, 12050, cuCtxCreate_v4),
	PR(cuCtxDestroy, 2000, cuCtxDestroy),
	PR(cuCtxDestroy, 4000, cuCtxDestroy_v2),
	PR(cuCtxPushCurrent, 2000, cuCtxPushCurrent),
	PR(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
	PR(cuCtxPopCurrent, 2000, cuCtxPopCurrent),
	PR(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
	PR(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
	PR(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
	PR(cuCtxGetDevice, 2000, cuCtxGetDevice),
	PR(cuCtxGetDevice, 13000, cuCtxGetDevice_v2),
	PR(cuCtxSynchronize, 2000, cuCtxSynchronize),
	PR(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),
	PR(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess),
	PR(cuCtxDisablePeerAccess, 4000, cuCtxDisablePeerAccess),
	PR(cuMemAlloc, 2000, cuMemAlloc),
	PR(cuMemAlloc, 3020, cuMemAlloc_v2),
	PR(cuMemFree, 2000, cuMemFree),
	PR(cuMemFree, 3020, cuMemFree_v2),
	PR(cuMemGetInfo, 2000, cuMemGetInfo),
	PR(cuMemGetInfo, 3020, cuMemGetInfo_v2),
	PR(cuMemGetAddressRange, 2000, cuMemGetAddressRange),
	PR(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
	PR(cuMemcpyHtoD, 2000, cuMemcpyHtoD),
	PR(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
	PT(cuMemcpyHtoD, 7000, cuMemcpyHtoD_v2_ptds),
	PR(cuMemcpyDtoH, 2000, cuMemcpyDtoH),
	PR(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
	PT(cuMemcpyDtoH, 7000, cuMemcpyDtoH_v2_ptds),
	PR(cuMemcpyDtoD, 2000, cuMemcpyDtoD),
	PR(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
	PT(cuMemcpyDtoD, 7000, cuMemcpyDtoD_v2_ptds),
	PR(cuMemcpyHtoDAsync, 2000, cuMemcpyHtoDAsync),
	PR(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2),
	PT(cuMemcpyHtoDAsync, 7000, cuMemcpyHtoDAsync_v2_ptsz),
	PR(cuMemcpyDtoHAsync, 2000, cuMemcpyDtoHAsync),
	PR(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2),
	PT(cuMemcpyDtoHAsync, 7000, cuMemcpyDtoHAsync_v2_ptsz),
	PR(cuMemcpyDtoDAsync, 3000, cuMemcpyDtoDAsync),
	PR(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2),
	PT(cuMemcpyDtoDAsync, 7000, cuMemcpyDtoDAsync_v2_ptsz),
	PR(cuMemcpy, 4000, cuMemcpy),
	PT(cuMemcpy, 7000, cuMemcpy_ptds),
	PR(cuMemcpyAsync, 4000, cuMemcpyAsync),
	PT(cuMemcpyAsync, 7000, cuMemcpyAsync_ptsz),
	PR(cuMemcpyPeer, 4000, cuMemcpyPeer),
	PT(cuMemcpyPeer, 7000, cuMemcpyPeer_ptds),
	PR(cuMemcpyPeerAsync, 4000, cuMemcpyPeerAsync),
	PT(cuMemcpyPeerAsync, 7000, cuMemcpyPeerAsync_ptsz),
	PR(cuMemsetD8, 2000, cuMemsetD8),
	PR(cuMemsetD8, 3020, cuMemsetD8_v2),
	PT(cuMemsetD8, 7000, cuMemsetD8_v2_ptds),
	PR(cuMemsetD8Async, 3020, cuMemsetD8Async),
	PT(cuMemsetD8Async, 7000, cuMemsetD8Async_ptsz),
	PR(cuMemHostAlloc, 2020, cuMemHostAlloc),
	PR(cuMemFreeHost, 2000, cuMemFreeHost),
	PR(cuMemAllocHost, 2000, cuMemAllocHost),
	PR(cuMemAllocHost, 3020, cuMemAllocHost_v2),
	PR(cuMemHostRegister, 4000, cuMemHostRegister),
	PR(cuMemHostRegister, 6050, cuMemHostRegister_v2),
	PR(cuMemHostUnregister, 4000, cuMemHostUnregister),
	PR(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
	PR(cuStreamCreate, 2000, cuStreamCreate),
	PR(cuStreamDestroy, 2000, cuStreamDestroy),
	PR(cuStreamDestroy, 4000, cuStreamDestroy_v2),
	PR(cuStreamSynchronize, 2000, cuStreamSynchronize),
	PT(cuStreamSynchronize, 7000, cuStreamSynchronize_ptsz),
	PR(cuStreamQuery, 2000, cuStreamQuery),
	PT(cuStreamQuery, 7000, cuStreamQuery_ptsz),
	PR(cuStreamWaitEvent, 3020, cuStreamWaitEvent),
	PT(cuStreamWaitEvent, 7000, cuStreamWaitEvent_ptsz),
	PR(cuLaunchHostFunc, 10000, cuLaunchHostFunc),
	PT(cuLaunchHostFunc, 10000, cuLaunchHostFunc_ptsz),
	PR(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2),
	PT(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz),
	PR(cuStreamEndCapture, 10000, cuStreamEndCapture),
	PT(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz),
	PR(cuStreamIsCapturing, 10000, cuStreamIsCapturing),
	PT(cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz),
	PR(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3),
	PT(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3_ptsz),
	PR(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode),
	PR(cuGraphInstantiate, 12000, cuGraphInstantiateWithFlags),
	PR(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags),
	PR(cuGraphLaunch, 10000, cuGraphLaunch),
	PT(cuGraphLaunch, 10000, cuGraphLaunch_ptsz),
	PR(cuGraphExecDestroy, 10000, cuGraphExecDestroy),
	PR(cuGraphDestroy, 10000, cuGraphDestroy),
	PR(cuEventCreate, 2000, cuEventCreate),
	PR(cuEventRecord, 2000, cuEventRecord),
	PT(cuEventRecord, 7000, cuEventRecord_ptsz),
	PR(cuEventSynchronize, 2000, cuEventSynchronize),
	PR(cuEventQuery, 2000, cuEventQuery),
	PR(cuEventDestroy, 2000, cuEventDestroy),
	PR(cuEventDestroy, 4000, cuEventDestroy_v2),
	PR(cuEventElapsedTime, 2000, cuEventElapsedTime),
	PR(cuEventElapsedTime, 12080, cuEventElapsedTime_v2),
	PR(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
	PR(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle),
	PR(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
	PR(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
	PR(cuIpcGetEventHandle, 4010, cuIpcGetEventHandle),
	PR(cuIpcOpenEventHandle, 4010, cuIpcOpenEventHandle),
	PR(cuGetErrorString, 6000, cuGetErrorString),
	PR(cuGetErrorName, 6000, cuGetErrorName),
	PR(cuGetProcAddress, 11030, cuGetProcAddress),
	PR(cuGetProcAddress, 12000, cuGetProcAddress_v2),
};

static int denied(const char *name)
{
	if (!G.deny)
		return 0;
	char key[128];
	int n = snprintf(key, sizeof key, ",%s,", name);
	return n > 0 && (size_t)n < sizeof key && strstr(G.deny, key) != NULL;
}

/* Works before cuInit (and in a forked child: it only looks up a name). */
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *symbolStatus)
{
	ST_ADD(getproc_lookups, 1);
	pthread_once(&G.once, do_config); /* trace, deny list */
	if (!symbol || !pfn || cudaVersion <= 0 ||
	    (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
		return CUDA_ERROR_INVALID_VALUE;
	/* "If the specified CUDA version is greater than the driver version,
	 * the API will return CUDA_ERROR_INVALID_VALUE." */
	if (cudaVersion > DRIVER_VERSION)
		return CUDA_ERROR_INVALID_VALUE;
	int want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	const struct proc *best = NULL, *best_pt = NULL;
	int found = 0;
	if (!denied(symbol))
		for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
			const struct proc *p = &procs[i];
			if (strcmp(p->name, symbol))
				continue;
			found = 1;
			if (p->version > cudaVersion)
				continue;
			if (p->ptds) {
				if (!best_pt || p->version > best_pt->version)
					best_pt = p;
			} else if (!best || p->version > best->version) {
				best = p;
			}
		}
	const struct proc *pick = want_ptds && best_pt ? best_pt : best;
	*pfn = pick ? pick->fn : NULL;
	if (symbolStatus)
		*symbolStatus = pick ? CU_GET_PROC_ADDRESS_SUCCESS
			      : found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	if (G.trace >= 1)
		say("cuGetProcAddress(\"%s\", %d, %#llx) -> %s", symbol, cudaVersion, (unsigned long long)flags,
		    pick ? pick->sym : "NULL");
	/* Not found, or too old for this version: success with a NULL pointer,
	 * as documented in CUDA 13's cuda.h. */
	return CUDA_SUCCESS;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- teardown ---------------------------------------------------------------------------------- */

/* At exit (not in a forked child): counters out, workers stopped (queued
 * work is abandoned, as when a context is destroyed), everything freed. */
__attribute__((destructor)) static void tsemu_fini(void)
{
	if (G.forked || !__atomic_load_n(&G.inited, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&G.mu);
	for (size_t i = 0; i < G.nmem; i++) /* the context goes: so does its memory, open elsewhere or not */
		mem_lose_with_ctx(G.mems[i]);
	pthread_mutex_unlock(&G.mu);
	write_stats();
	pthread_mutex_lock(&G.mu);
	__atomic_store_n(&G.stopping, 1, __ATOMIC_RELEASE);
	for (struct stream *s = G.streams; s; s = s->next_all)
		pthread_cond_signal(&s->cv);
	pthread_cond_broadcast(&G.done);
	for (;;) { /* wait for every started worker to end */
		struct stream *running = NULL;
		for (struct stream *s = G.streams; s && !running; s = s->next_all)
			if (s->started && !s->finished)
				running = s;
		if (!running)
			break;
		pthread_cond_wait(&G.done, &G.mu);
	}
	/* What a thread still blocked in a call refers to (refs above the
	 * owner's) is left alone: it wakes up to CUDA_ERROR_DEINITIALIZED. */
	for (struct stream **pp = &G.streams; *pp;) {
		struct stream *s = *pp;
		if (s->started)
			pthread_join(s->th, NULL);
		s->started = 0;
		if (s->refs > 1) {
			pp = &s->next_all;
			continue;
		}
		*pp = s->next_all;
		pthread_cond_destroy(&s->cv);
		free(s);
	}
	for (int i = 0; i < MAXDEV; i++)
		G.ctx[i].legacy = NULL;
	while (G.captures) { /* open captures and graphs hold events and memory */
		struct capture *c = G.captures;
		G.captures = c->next_all;
		graph_free(c->g);
		free(c);
	}
	while (G.graphs) {
		struct graph *g = G.graphs;
		G.graphs = g->next_all;
		graph_free(g);
	}
	while (G.events) {
		struct event *e = G.events;
		G.events = e->next_all;
		event_unref(e);
	}
	for (size_t i = 0; i < G.nmem; i++)
		mem_unref(G.mems[i]);
	free(G.mems);
	G.mems = NULL;
	G.nmem = G.capmem = 0;
	free(G.deny);
	G.deny = NULL;
	if (tls_ptds) {
		pthread_setspecific(G.ptds_key, NULL);
		free(tls_ptds);
		tls_ptds = NULL;
	}
	pthread_key_delete(G.ptds_key); /* threads exiting later run no destructor */
	pthread_mutex_unlock(&G.mu);
}

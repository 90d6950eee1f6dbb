/* SPDX-License-Identifier: MIT */
/*
 * ts-segtool: make and damage session segments for tests (links the core,
 * not the shim). See usage() for the commands.
 */
#include "gpuring.h"
#include "ring.h"
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "ts-segtool"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " join NAME [--depth N] [--timeout-ms N] [--hold-ms N]\n"
		"       " PROG " corrupt NAME magic|version|checksum|truncate|depth|uid|garbage\n"
		"       " PROG " plant NAME [--mode OCTAL] [--uid UID] [--fifo]\n"
		"       " PROG " gpu-corrupt FILE depth|inflate N\n"
		"\n"
		"  join     join session NAME (creating it), print \"joined slot=S role=R\",\n"
		"           heartbeat every timeout/4 until --hold-ms passes (default: until\n"
		"           stdin reaches EOF) or SIGTERM/SIGINT, then leave and exit 0.\n"
		"           Defaults: depth 4, timeout 1000 ms.\n"
		"  corrupt  damage NAME's existing segment in place:\n"
		"             magic     flip a bit of the magic number\n"
		"             version   another layout version (checksum kept consistent)\n"
		"             checksum  wrong header checksum\n"
		"             truncate  shrink the file to 100 bytes\n"
		"             depth     out-of-range depth (checksum kept consistent)\n"
		"             uid       another owner uid in the header (checksum consistent)\n"
		"             garbage   valid header, nonsense shared state: producer index,\n"
		"                       member pid, slot writer/state, batch npos out of range\n"
		"  plant    create a well-formed, memberless segment at NAME's path with\n"
		"           file mode OCTAL (default 0600), optionally chowned to UID, or a\n"
		"           FIFO with --fifo: simulates foreign or unsafe segments\n"
		"  gpu-corrupt  damage the GPU ring table FILE (a /dev/shm path) in place, as\n"
		"           a buggy or hostile peer would:\n"
		"             depth N    set its depth to N\n"
		"             inflate N  multiply the size of every published buffer record by\n"
		"                        N (>= 2); prints \"inflated COUNT\"\n"
		"\n"
		"Exit status: 0 done, 1 failed, 2 usage error.\n");
}

static int usage_error(const char *msg, const char *arg)
{
	fprintf(stderr, PROG ": %s%s\n", msg, arg ? arg : "");
	usage(stderr);
	return 2;
}

static int parse_u32(const char *s, unsigned base, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, (int)base);
	if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-')
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int seg_path(const char *name, char *path, size_t n)
{
	if (ts_segment_path(path, n, getuid(), name) != 0) {
		fprintf(stderr, PROG ": invalid session name '%s'\n", name);
		return -1;
	}
	return 0;
}

/* ---- join ---------------------------------------------------------------- */

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
	stop = 1;
}

/*
 * Beat until told to stop. The stop signals are blocked except inside
 * ppoll(), so one arriving between the check and the wait is not lost.
 */
static void hold(struct ts_session *s, uint32_t period_ms, long hold_ms)
{
	struct sigaction sa = {.sa_handler = on_stop};
	sigset_t block, waitmask;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &waitmask);
	sigdelset(&waitmask, SIGTERM);
	sigdelset(&waitmask, SIGINT);
	uint64_t end = ts_prim_monotonic_ns() + (uint64_t)(hold_ms < 0 ? 0 : hold_ms) * 1000000u;
	struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
	while (!stop) {
		uint64_t now = ts_prim_monotonic_ns();
		if (hold_ms >= 0 && now >= end)
			break;
		uint64_t wait_ns = (uint64_t)period_ms * 1000000u;
		if (hold_ms >= 0 && end - now < wait_ns)
			wait_ns = end - now;
		struct timespec ts = {.tv_sec = (time_t)(wait_ns / 1000000000u),
				      .tv_nsec = (long)(wait_ns % 1000000000u)};
		int n = ppoll(&pfd, hold_ms < 0 ? 1 : 0, &ts, &waitmask);
		if (n > 0) {
			char buf[256];
			ssize_t r = read(STDIN_FILENO, buf, sizeof(buf));
			if (r <= 0 && !(r < 0 && errno == EINTR))
				break; /* EOF (or stdin unusable) */
		}
		ts_session_tick(s);
	}
}

static int cmd_join(int argc, char **argv)
{
	struct ts_session_params p = {.depth = 4, .timeout_ms = 1000};
	long hold_ms = -1;
	for (int i = 1; i < argc; i++) {
		uint32_t v;
		if (i + 1 >= argc || parse_u32(argv[i + 1], 10, &v) != 0)
			return usage_error("join: bad or missing value for ", argv[i]);
		if (!strcmp(argv[i], "--depth"))
			p.depth = v;
		else if (!strcmp(argv[i], "--timeout-ms"))
			p.timeout_ms = v;
		else if (!strcmp(argv[i], "--hold-ms"))
			hold_ms = v;
		else
			return usage_error("join: unknown option ", argv[i]);
		i++;
	}
	struct ts_session s;
	int ret = ts_session_join(&s, argv[0], &p);
	if (ret) {
		fprintf(stderr, PROG ": join %s: %s%s%s\n", argv[0], strerror(-ret),
			s.why[0] ? ": " : "", s.why);
		return 1;
	}
	enum ts_role role = ts_session_tick(&s);
	printf("joined slot=%d role=%s\n", s.self, role == TS_ROLE_PRODUCER ? "producer" : "consumer");
	fflush(stdout);
	hold(&s, p.timeout_ms / 4 ? p.timeout_ms / 4 : 1, hold_ms);
	ts_session_leave(&s);
	return 0;
}

/* ---- corrupt ------------------------------------------------------------- */

static void garble(struct ts_segment *seg)
{
	atomic_store(&seg->producer, ts_producer_word(7, 200));
	atomic_store(&seg->members[5].pid, 4000000000u);
	atomic_store(&seg->members[6].pid, (uint32_t)getpid());
	atomic_store(&seg->members[6].attach, 1);
	atomic_store(&seg->members[6].read_seq, UINT64_MAX);
	atomic_store(&seg->ring.slots[0].word, ts_slot_word(TS_SLOT_PUBLISHED, 100, 1, 3));
	atomic_store(&seg->ring.slots[1].word, ts_slot_word(TS_SLOT_PUBLISHED, 1, 1, 4));
	seg->ring.meta[0][1].npos = 1000;
	atomic_store(&seg->ring.slots[2].word, ts_slot_word(3, 1, 1, 5));
	seg->st.depth = TS_MAX_DEPTH; /* so every slot above is shown */
	seg->st.checksum = ts_static_checksum(&seg->st);
}

static int damage(struct ts_segment *seg, const char *how)
{
	struct ts_static *st = &seg->st;
	if (!strcmp(how, "magic"))
		st->magic ^= 1;
	else if (!strcmp(how, "checksum"))
		st->checksum ^= 0xdeadbeefu;
	else if (!strcmp(how, "version") || !strcmp(how, "depth") || !strcmp(how, "uid")) {
		if (how[0] == 'v')
			st->layout_version = TS_LAYOUT_VERSION + 100;
		else if (how[0] == 'd')
			st->depth = TS_MAX_DEPTH + 1;
		else
			st->uid = st->uid == 65534 ? 65533 : 65534;
		st->checksum = ts_static_checksum(st);
	} else if (!strcmp(how, "garbage"))
		garble(seg);
	else
		return -1;
	return 0;
}

static int cmd_corrupt(int argc, char **argv)
{
	char path[TS_PATH_MAX];
	if (argc != 2)
		return usage_error("corrupt: NAME and one of magic|version|checksum|truncate|depth|uid|garbage", NULL);
	if (seg_path(argv[0], path, sizeof(path)))
		return 1;
	int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) != 0) {
		fprintf(stderr, PROG ": %s: %s\n", path, strerror(errno));
		return 1;
	}
	int ret = 1;
	if (!strcmp(argv[1], "truncate")) {
		ret = ftruncate(fd, 100) == 0 ? 0 : 1;
		if (ret)
			fprintf(stderr, PROG ": truncate %s: %s\n", path, strerror(errno));
	} else if ((size_t)sb.st_size < sizeof(struct ts_segment)) {
		fprintf(stderr, PROG ": %s: too small to damage (%lld bytes)\n", path, (long long)sb.st_size);
	} else {
		void *m = mmap(NULL, sizeof(struct ts_segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			fprintf(stderr, PROG ": mmap %s: %s\n", path, strerror(errno));
		} else {
			ret = damage(m, argv[1]) == 0 ? 0 : usage_error("corrupt: unknown damage ", argv[1]);
			munmap(m, sizeof(struct ts_segment));
		}
	}
	close(fd);
	return ret;
}

/* ---- plant --------------------------------------------------------------- */

static int plant_segment(int fd, const char *name)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t p = page > 0 ? (size_t)page : 4096;
	size_t size = (sizeof(struct ts_segment) + p - 1) / p * p;
	if (ftruncate(fd, (off_t)size) != 0)
		return -errno;
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	struct ts_session_params params = {.depth = 4, .timeout_ms = 1000};
	ts_segment_init(m, size, name, getuid(), &params);
	munmap(m, size);
	return 0;
}

static int cmd_plant(int argc, char **argv)
{
	char path[TS_PATH_MAX];
	uint32_t mode = 0600, uid = (uint32_t)-1;
	int fifo = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--fifo")) {
			fifo = 1;
		} else if (!strcmp(argv[i], "--mode") && i + 1 < argc && !parse_u32(argv[i + 1], 8, &mode) &&
			   mode <= 07777) {
			i++;
		} else if (!strcmp(argv[i], "--uid") && i + 1 < argc && !parse_u32(argv[i + 1], 10, &uid)) {
			i++;
		} else {
			return usage_error("plant: bad argument ", argv[i]);
		}
	}
	if (seg_path(argv[0], path, sizeof(path)))
		return 1;
	int ret = 0, fd = -1;
	if (fifo)
		ret = mkfifo(path, (mode_t)mode) == 0 ? 0 : -errno;
	else if ((fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		ret = -errno;
	else
		ret = plant_segment(fd, argv[0]);
	/* Set the mode explicitly: the umask must not soften the test. */
	if (ret == 0 && chmod(path, (mode_t)mode) != 0)
		ret = -errno;
	if (ret == 0 && uid != (uint32_t)-1 && chown(path, (uid_t)uid, (gid_t)-1) != 0)
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (ret) {
		fprintf(stderr, PROG ": plant %s: %s\n", path, strerror(-ret));
		return 1;
	}
	return 0;
}

/* ---- gpu-corrupt ---------------------------------------------------------- */

static int cmd_gpu_corrupt(int argc, char **argv)
{
	uint32_t n;
	if (argc != 3 || (strcmp(argv[1], "depth") && strcmp(argv[1], "inflate")) || parse_u32(argv[2], 10, &n))
		return usage_error("gpu-corrupt needs FILE, depth|inflate and N", NULL);
	bool inflate = !strcmp(argv[1], "inflate");
	if (inflate && n < 2)
		return usage_error("inflate needs N >= 2", NULL);
	int fd = open(argv[0], O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	struct stat sb;
	struct ts_gpu_table *t = MAP_FAILED;
	if (fd >= 0 && fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(*t))
		t = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	if (t == MAP_FAILED || t->magic != TS_GPU_MAGIC) {
		fprintf(stderr, PROG ": %s: not a GPU ring table\n", argv[0]);
		return 1;
	}
	if (!inflate) {
		__atomic_store_n(&t->depth, n, __ATOMIC_RELAXED);
	} else {
		unsigned count = 0;
		for (unsigned b = 0; b < TS_GPU_MAX_BUFS; b++)
			if (ts_gpu_uniq_is_identity(atomic_load(&t->bufs[b].uniq))) { /* a published record, not a claim */
				__atomic_store_n(&t->bufs[b].size, t->bufs[b].size * n, __ATOMIC_RELAXED);
				count++;
			}
		printf("inflated %u\n", count);
	}
	munmap(t, (size_t)sb.st_size);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		usage(stdout);
		return 0;
	}
	if (argc < 3)
		return usage_error("missing command or NAME", NULL);
	if (!strcmp(argv[1], "join"))
		return cmd_join(argc - 2, argv + 2);
	if (!strcmp(argv[1], "corrupt"))
		return cmd_corrupt(argc - 2, argv + 2);
	if (!strcmp(argv[1], "plant"))
		return cmd_plant(argc - 2, argv + 2);
	if (!strcmp(argv[1], "gpu-corrupt"))
		return cmd_gpu_corrupt(argc - 2, argv + 2);
	return usage_error("unknown command ", argv[1]);
}

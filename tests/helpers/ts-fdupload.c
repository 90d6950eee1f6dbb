/* ts-fdupload: a loader's shape without a loader, for shim/native.c. A
 * forked worker makes shared-memory objects and passes each to the main
 * process by descriptor (SCM_RIGHTS, one message each), as PyTorch-style
 * loaders do; the main process maps each and uploads something with
 * cudaMemcpy, then reads it back and checks every byte.
 *
 *   ts-fdupload KIND CONTENT UPLOAD N [recvmmsg] [default]
 *     KIND     memfd | posix | file   (memfd_create, shm_open + unlink, a
 *                                      file in $TMPDIR or /tmp: not shared memory)
 *     CONTENT  random | zeros         (what the worker writes into each)
 *     UPLOAD   object | copy | other  (the mapping itself, a malloc'd copy
 *                                      of it, a buffer of other bytes)
 *     N        objects passed, each followed by one upload
 *     recvmmsg the main process takes each descriptor with recvmmsg,
 *              not recvmsg
 *     default  uploads are cudaMemcpyDefault copies, not HostToDevice
 *
 * Links nothing CUDA: dlopen()s libcudart.so.13 (LD_LIBRARY_PATH=build/emu).
 * Prints "uploaded N" and exits 0 when every byte came back as sent; 1 when
 * one did not; 2 on a usage or set-up error. */
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define OBJ_BYTES (64u << 10)

static void die(const char *what)
{
	fprintf(stderr, "ts-fdupload: %s\n", what);
	exit(2);
}

static void fill(unsigned char *p, size_t n, unsigned seed, int zeros)
{
	uint32_t x = seed * 2654435761u + 7;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = zeros ? 0 : (unsigned char)(x >> 16);
	}
}

static int make_object(const char *kind, unsigned i)
{
	char name[64];
	int fd;
	if (!strcmp(kind, "memfd")) {
		fd = memfd_create("ts-fdupload", MFD_CLOEXEC);
	} else if (!strcmp(kind, "posix")) {
		snprintf(name, sizeof(name), "/ts-fdupload.%d.%u", (int)getpid(), i);
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd >= 0)
			shm_unlink(name);
	} else {
		const char *dir = getenv("TMPDIR");
		snprintf(name, sizeof(name), "%.40s/ts-fdupload.XXXXXX", dir && *dir ? dir : "/tmp");
		fd = mkstemp(name);
		if (fd >= 0)
			unlink(name);
	}
	if (fd < 0 || ftruncate(fd, OBJ_BYTES) != 0)
		die("cannot make an object");
	return fd;
}

static void send_fd(int sock, int fd)
{
	char ctl[CMSG_SPACE(sizeof(int))] = {0};
	char byte = 'b';
	struct iovec iov = {&byte, 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(sock, &mh, 0) != 1)
		die("sendmsg");
}

static int recv_fd(int sock, int mmsg)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	char byte;
	struct iovec iov = {&byte, 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
	if (mmsg) {
		struct mmsghdr one = {.msg_hdr = mh};
		if (recvmmsg(sock, &one, 1, MSG_CMSG_CLOEXEC, NULL) != 1 || one.msg_len != 1)
			die("recvmmsg");
		mh = one.msg_hdr;
	} else if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != 1) {
		die("recvmsg");
	}
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	if (!cm || cm->cmsg_type != SCM_RIGHTS)
		die("no descriptor came");
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

static void worker(int sock, const char *kind, int zeros, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int fd = make_object(kind, i);
		unsigned char *p = mmap(NULL, OBJ_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			die("mmap (worker)");
		fill(p, OBJ_BYTES, i, zeros);
		munmap(p, OBJ_BYTES);
		send_fd(sock, fd);
		close(fd);
	}
	_exit(0);
}

int main(int argc, char **argv)
{
	int mmsg = 0, dflt = 0, bad_arg = argc < 5;
	for (int a = 5; a < argc; a++) {
		if (!strcmp(argv[a], "recvmmsg"))
			mmsg = 1;
		else if (!strcmp(argv[a], "default"))
			dflt = 1;
		else
			bad_arg = 1;
	}
	if (bad_arg)
		die("usage: ts-fdupload memfd|posix|file random|zeros object|copy|other N [recvmmsg] [default]");
	const char *kind = argv[1], *upload = argv[3];
	int zeros = !strcmp(argv[2], "zeros");
	unsigned n = (unsigned)strtoul(argv[4], NULL, 10);
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		die("socketpair");
	pid_t child = fork(); /* before CUDA is initialised, as loaders fork their workers */
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(sv[0]);
		worker(sv[1], kind, zeros, n);
	}
	close(sv[1]);

	void *rt = dlopen("libcudart.so.13", RTLD_NOW);
	if (!rt)
		die("cannot load libcudart.so.13");
	__typeof__(cudaMalloc) *Malloc = (__typeof__(cudaMalloc) *)dlsym(rt, "cudaMalloc");
	__typeof__(cudaMemcpy) *Memcpy = (__typeof__(cudaMemcpy) *)dlsym(rt, "cudaMemcpy");
	if (!Malloc || !Memcpy)
		die("libcudart lacks cudaMalloc or cudaMemcpy");
	void *dev = NULL;
	unsigned char *copy = malloc(OBJ_BYTES), *back = malloc(OBJ_BYTES);
	if (Malloc(&dev, OBJ_BYTES) != cudaSuccess || !copy || !back)
		die("cannot allocate");

	int bad = 0;
	for (unsigned i = 0; i < n; i++) {
		int fd = recv_fd(sv[0], mmsg);
		unsigned char *obj = mmap(NULL, OBJ_BYTES, PROT_READ, MAP_SHARED, fd, 0);
		if (obj == MAP_FAILED)
			die("mmap");
		close(fd);
		const unsigned char *src = obj;
		if (!strcmp(upload, "copy")) {
			memcpy(copy, obj, OBJ_BYTES);
			src = copy;
		} else if (!strcmp(upload, "other")) {
			fill(copy, OBJ_BYTES, 1000 + i, 0);
			src = copy;
		}
		if (Memcpy(dev, src, OBJ_BYTES, dflt ? cudaMemcpyDefault : cudaMemcpyHostToDevice) != cudaSuccess ||
		    Memcpy(back, dev, OBJ_BYTES, cudaMemcpyDeviceToHost) != cudaSuccess || memcmp(back, src, OBJ_BYTES))
			bad++;
		munmap(obj, OBJ_BYTES);
	}
	int status;
	waitpid(child, &status, 0);
	if (bad)
		fprintf(stderr, "ts-fdupload: %d uploads came back changed\n", bad);
	printf("uploaded %u\n", n);
	return bad ? 1 : 0;
}

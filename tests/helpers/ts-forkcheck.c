/* SPDX-License-Identifier: MIT */
/*
 * ts-forkcheck MODE [ARG]: a program whose threads are inside the shim (or
 * the dynamic linker) when it forks, run with the shim preloaded by
 * tests/scenarios/forks.sh. The scenario makes the slow part slow (it
 * holds the flock of the segment the call waits for, or gives a library
 * whose constructor sleeps); this program says in what order things ended.
 *
 *   feedclose  a thread opens feed "fk" (tsshim_feed_open waits for the
 *              session's lock); meanwhile the main thread forks, and the
 *              child calls tsshim_feed_close(0) and exits, as Python's
 *              atexit does in a forked child. Prints "child-close returned"
 *              or "child-close hung" (the child is killed after 2 s).
 *   joinfork   a thread calls tsshim_join (it waits for the session's
 *              lock); meanwhile the main thread forks. Prints
 *              "fork-before-join" when fork() returned while the join was
 *              still waiting, "fork-after-join" when fork() waited for it.
 *   vfork LIB  a thread dlopen()s LIB (its constructor is slow); meanwhile
 *              the main thread vforks, and the child calls dup2 and _exit,
 *              as Python's subprocess does. Prints "vfork-before-dlopen"
 *              or "vfork-after-dlopen" (the child waited for the dynamic
 *              linker's lock, and its parent with it).
 *   killheld SEGMENT
 *              joins (tsshim_join), forks a child that sleeps 20 s, then
 *              takes the flock of SEGMENT through the shim's own descriptor
 *              of it, as a join or leave does, prints "locked CHILD-PID"
 *              and waits to be killed (by the scenario, holding the lock).
 *
 * Exit 0 when it could run the mode (whatever the order), 2 otherwise.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static _Atomic int thread_done;
static const char *lib;

static void *feed_thread(void *arg)
{
	(void)arg;
	int (*open_feed)(const char *, const char *, uint64_t) =
		(int (*)(const char *, const char *, uint64_t))dlsym(RTLD_DEFAULT, "tsshim_feed_open");
	if (open_feed)
		(void)open_feed("fk", "forkcheck", 100);
	atomic_store(&thread_done, 1);
	return NULL;
}

static void *join_thread(void *arg)
{
	(void)arg;
	int (*join)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "tsshim_join");
	if (join)
		(void)join();
	atomic_store(&thread_done, 1);
	return NULL;
}

static void *dlopen_thread(void *arg)
{
	(void)arg;
	(void)dlopen(lib, RTLD_NOW);
	atomic_store(&thread_done, 1);
	return NULL;
}

/* The child's exit within 2 s: 1, or 0 (then killed). */
static int child_exits(pid_t p)
{
	for (int i = 0; i < 100; i++) {
		if (waitpid(p, NULL, WNOHANG) == p)
			return 1;
		usleep(20000);
	}
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	return 0;
}

/* The shim's descriptor of the file at `path` among ours (by inode: a creator's names its temporary name), or -1. */
static int fd_of(const char *path)
{
	struct stat want, sb;
	if (stat(path, &want) != 0)
		return -1;
	for (int fd = 0; fd < 1024; fd++)
		if (fstat(fd, &sb) == 0 && sb.st_ino == want.st_ino && sb.st_dev == want.st_dev)
			return fd;
	return -1;
}

static int kill_held(const char *seg)
{
	int (*join)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "tsshim_join");
	if (!join || join() != 0) {
		fprintf(stderr, "ts-forkcheck: tsshim_join failed\n");
		return 2;
	}
	pid_t c = fork();
	if (c == 0) {
		sleep(20);
		_exit(0);
	}
	int fd = fd_of(seg);
	if (c < 0 || fd < 0 || flock(fd, LOCK_EX) != 0) {
		fprintf(stderr, "ts-forkcheck: no descriptor of %s to lock\n", seg);
		return 2;
	}
	printf("locked %d\n", (int)c);
	fflush(stdout);
	pause();
	return 0;
}

int main(int argc, char **argv)
{
	alarm(60);
	if (argc == 3 && !strcmp(argv[1], "killheld"))
		return kill_held(argv[2]);
	if (argc < 2 || (!strcmp(argv[1], "vfork") && argc < 3)) {
		fprintf(stderr, "usage: ts-forkcheck feedclose|joinfork|vfork LIB\n");
		return 2;
	}
	const char *mode = argv[1];
	void *(*fn)(void *) = !strcmp(mode, "feedclose") ? feed_thread : !strcmp(mode, "joinfork") ? join_thread
				: !strcmp(mode, "vfork")    ? dlopen_thread : NULL;
	if (!fn || (fn != dlopen_thread && !dlsym(RTLD_DEFAULT, "tsshim_join"))) {
		fprintf(stderr, "ts-forkcheck: unknown mode, or the shim is not preloaded\n");
		return 2;
	}
	lib = argc > 2 ? argv[2] : NULL;
	pthread_t t;
	if (pthread_create(&t, NULL, fn, NULL))
		return 2;
	usleep(300000); /* the thread is waiting by now */
	if (atomic_load(&thread_done)) {
		fprintf(stderr, "ts-forkcheck: the thread did not wait: nothing to check\n");
		return 2;
	}
	if (fn == feed_thread) {
		pid_t p = fork();
		if (p == 0) {
			void (*close_feed)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "tsshim_feed_close");
			close_feed(0);
			_exit(0);
		}
		printf("child-close %s\n", p > 0 && child_exits(p) ? "returned" : "hung");
	} else if (fn == join_thread) {
		pid_t p = fork();
		if (p == 0)
			_exit(0);
		int waited = atomic_load(&thread_done);
		waitpid(p, NULL, 0);
		printf("%s\n", waited ? "fork-after-join" : "fork-before-join");
	} else {
		pid_t p = vfork();
		if (p == 0) {
			dup2(1, 100);
			_exit(0);
		}
		int waited = atomic_load(&thread_done);
		waitpid(p, NULL, 0);
		printf("%s\n", waited ? "vfork-after-dlopen" : "vfork-before-dlopen");
	}
	fflush(stdout);
	pthread_join(t, NULL);
	return 0;
}

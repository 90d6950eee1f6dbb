/* SPDX-License-Identifier: MIT */
/*
 * Sessions: one shared segment per (user, session name), members, election.
 *
 * Joining and leaving take an flock on the segment's file for a few
 * microseconds (released by the kernel if the holder dies); election and
 * heartbeats are lock-free so that a stopped process can never hold the
 * others back. The segment appears under its final name only once it is
 * fully initialised (created under a temporary name, then link()ed).
 */
#ifndef TSSHIM_CORE_SESSION_H
#define TSSHIM_CORE_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "layout.h"
#include "prim.h"

#define TS_SEG_PREFIX "tsshim."
#define TS_PATH_MAX   256

struct ts_session_params {
	uint32_t depth;      /* used only when creating */
	uint32_t timeout_ms; /* used only when creating */
	const char *label;   /* used only when creating; NULL for none */
};

/* A process's handle on a session. */
struct ts_session {
	struct ts_segment *seg;
	size_t map_size;
	int fd;
	int self;            /* member index, -1 when not a member */
	struct ts_ident me;
	uint64_t timeout_ns; /* the session's timeout as joined: a wait bounded by it uses this copy */
	char name[TS_NAME_MAX];
	char path[TS_PATH_MAX];
	char why[160];       /* reason for the last failed join */
};

enum ts_role { TS_ROLE_NONE = 0, TS_ROLE_PRODUCER = 1, TS_ROLE_CONSUMER = 2 };

enum ts_member_health { TS_MEMBER_FREE, TS_MEMBER_LIVE, TS_MEMBER_STALE, TS_MEMBER_DEAD };

static inline uint32_t ts_producer_epoch(uint64_t w) { return (uint32_t)(w >> 32); }
/* Member index named by a producer word; -1 for none or out of range (hostile word). */
static inline int ts_producer_index(uint64_t w)
{
	uint32_t i = (uint32_t)w;
	return i == 0 || i > TS_MAX_MEMBERS ? -1 : (int)i - 1;
}
static inline uint64_t ts_producer_word(uint32_t epoch, int index)
{
	return (uint64_t)epoch << 32 | (uint32_t)(index + 1);
}

/* Names: 1..63 chars of [A-Za-z0-9._-], not starting with '.' or '-'. */
int ts_session_name_valid(const char *name);
/* "/dev/shm/tsshim.<uid>.<name>" */
int ts_segment_path(char *buf, size_t n, uid_t uid, const char *name);

/* Join (creating the segment if needed); become producer if there is none. */
int ts_session_join(struct ts_session *s, const char *name, const struct ts_session_params *p);
/* Leave: hand producership on, free our slot; the last member out removes the segment. */
void ts_session_leave(struct ts_session *s);
/* Forget the mapping without touching shared state (forked child, tests). */
void ts_session_forget(struct ts_session *s);
/*
 * In a forked child: close the child's copies of every session descriptor
 * of the process. A flock belongs to the open file, which fork shares: a
 * child keeping the copy would keep a lock its parent held when it was
 * killed, for as long as the child lives. The sessions' mappings stay; the
 * child never locks, joins or leaves for its parent.
 */
void ts_session_atfork_child(void);
/*
 * Is fd a session descriptor of this process? The program never got its
 * number from an open of its own: a close of it is one of a range of
 * numbers closed blindly (a daemon's loop up to its descriptor limit), which
 * the shim answers as without it (EBADF) instead of losing its lock file,
 * then closing, at its exit or in a forked child, whatever the program has
 * opened in that number since. Lock-free (close hooks ask it).
 */
int ts_session_holds_fd(int fd);
/* The session descriptors in [first, last], in order; at most max. */
unsigned ts_session_fds_in(unsigned first, unsigned last, int *out, unsigned max);

/*
 * One heartbeat: refresh our timestamp, then if the producer is missing,
 * dead or silent for longer than the timeout, try to take over (exactly one
 * contender wins). Returns our role afterwards.
 */
enum ts_role ts_session_tick(struct ts_session *s);
enum ts_role ts_session_role(const struct ts_session *s);
/* Members other than us that are alive (or only silent for now): 0 when we are alone. */
unsigned ts_session_others(const struct ts_session *s);
/*
 * A producer that stops producing for a while (a data feed between two
 * epochs) says so; idle=0 clears it. Any member may clear, only the
 * producer sets.
 */
void ts_session_set_idle(struct ts_session *s, int idle);
/*
 * A producer that waits in another session (a job blocked in one DataLoader
 * feed while it produces another) marks this one idle while it is away
 * (away=1: 1 when it marked it; a mark there already, an epoch's end's,
 * keeps its time), and clears that mark when back (away=0: only a mark that
 * names us). Two jobs each producing the loader the other waits on took over
 * neither, and waited on each other for ever.
 */
int ts_session_idle_while_away(struct ts_session *s, int away);
/*
 * Become producer if the producer has been idle for idle_min_ns or there is
 * none (1: we are producer now, 0: not). One contender wins.
 */
int ts_session_take_idle(struct ts_session *s, uint64_t idle_min_ns);

/* Health of a member slot as seen now. */
enum ts_member_health ts_member_health(const struct ts_segment *seg, unsigned idx, uint64_t now_ns);

/* Present and not dead: live, or only silent for now (a stopped process may still act when it wakes). */
static inline int ts_member_alive(enum ts_member_health h)
{
	return h == TS_MEMBER_LIVE || h == TS_MEMBER_STALE;
}

/*
 * The session's timeout, read once and held to the range validation
 * allowed: the field was checked when the segment was mapped, but a peer
 * may rewrite it since, and every wait bounded by it must stay bounded
 * (0 would make every member stale, UINT32_MAX a wait of 49 days).
 */
static inline uint64_t ts_timeout_ns(const struct ts_segment *seg)
{
	uint32_t v = __atomic_load_n(&seg->st.timeout_ms, __ATOMIC_RELAXED);
	v = v < TS_TIMEOUT_MIN_MS ? TS_TIMEOUT_MIN_MS : v > TS_TIMEOUT_MAX_MS ? TS_TIMEOUT_MAX_MS : v;
	return (uint64_t)v * 1000000ull;
}

/*
 * How long a producer waits on a reader that is alive but not reading (its
 * process stopped, in a debugger, or just not iterating) before it evicts
 * it: ten timeouts, at least 5 s. Dead readers are evicted at once.
 */
static inline uint64_t ts_stall_for(uint64_t timeout_ns)
{
	uint64_t t = timeout_ns * 10;
	return t > 5000000000ull ? t : 5000000000ull;
}

static inline uint64_t ts_stall_ns(const struct ts_segment *seg)
{
	return ts_stall_for(ts_timeout_ns(seg));
}

/*
 * Validation of a mapped segment of `size` bytes (possibly hostile): 0 or
 * -EBADMSG / -EPROTO (other layout/build) / -EACCES (other user), with a
 * human-readable reason.
 */
int ts_segment_validate(const struct ts_segment *seg, size_t size, uid_t uid, char *why, size_t whylen);
/* Initialise a fresh segment image (creator and tests). */
void ts_segment_init(struct ts_segment *seg, size_t size, const char *name, uid_t uid,
		     const struct ts_session_params *p);
uint32_t ts_static_checksum(const struct ts_static *st);

/* Read-only mapping for inspection; never changes the segment. */
struct ts_view {
	const struct ts_segment *seg;
	size_t map_size;
	char path[TS_PATH_MAX];
	char name[TS_NAME_MAX];
};
int ts_view_open(struct ts_view *v, const char *path, char *why, size_t whylen);
void ts_view_close(struct ts_view *v);

/* Enumerate the caller's segments: calls fn(path, name, arg) for each. */
int ts_session_list(void (*fn)(const char *path, const char *name, void *arg), void *arg);

/*
 * Remove the segment at `path` if every member is dead (or there are none):
 * 1 removed, 0 left alone (live members), -errno on error.
 */
int ts_session_remove_if_stale(const char *path);
/* Remove temporary files left by creators that died mid-creation. */
int ts_clean_temp_files(void);

#endif

#!/usr/bin/env python3
"""Fault injection for PyTorch jobs sharing a DataLoader (issue 7, item 1).

Each round starts 2-3 real PyTorch jobs (tests/py/share_job.py: different
seeds, models, batch sizes and worker counts; one tsshim session) and, once
all are training, hits them with random faults at random moments:

  kill   SIGKILL                      the job dies; the others go on
  stop   SIGSTOP for 0.3-2.5 s, SIGCONT   a silent member (a stopped producer
                                      is replaced, and learns it when it wakes)
  int    SIGINT                       KeyboardInterrupt in the job
  term   SIGTERM

At least one job is never killed (someone must finish and be the last out).
Then each round is checked:

  no hang    every job ends within --round-timeout seconds
  exits      unharmed and stopped jobs exit 0; killed ones by their signal
  data       tests/py/share_verify.py passes on all records: every sample a
             real image with its own label, one stream across the jobs, no
             sample twice within an epoch (killed jobs checked up to where
             their record ends)
  nothing left   no tsshim object of the round's session in /dev/shm once all
             jobs are gone

--train: rounds of 3 same-seed tsshim-train jobs on the CUDA test device in
exact mode (their decodes shared through the cache) under the same faults;
every job that ends normally must have trained on exactly what it trains on
alone (trained_checksum of a reference run without the shim).

Prints a line per round and a last line
  stress: R runs, F faults injected, S jobs survived their fault, X failures
and exits 1 if any failure (0 otherwise).
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.environ.get("TS_PYTHON", "/usr/bin/python3")  # TS_PYTHON: another Python with torch
JOB = os.path.join(ROOT, "tests", "py", "share_job.py")
VERIFY = os.path.join(ROOT, "tests", "py", "share_verify.py")
SHM = "/dev/shm"


def batches_recorded(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if '"batch":' in line)
    except OSError:
        return 0


def finished(path):
    """Has the job written its last record line (its work is done)?"""
    try:
        with open(path) as f:
            return '"done":true' in f.read()
    except OSError:
        return False


def leftovers(session):
    return sorted(n for n in os.listdir(SHM) if n.startswith("tsshim") and ("." + session) in n)


def plan(rng, njobs):
    """[(job, kind, at_s, stop_s)]: 1-2 faults; job 0..njobs-1; one job never dies."""
    spared = rng.randrange(njobs)
    faults = []
    for _ in range(rng.choice((1, 1, 2))):
        kind = rng.choice(("kill", "kill", "stop", "int", "term"))
        victims = [j for j in range(njobs) if kind == "stop" or j != spared]
        victims = [j for j in victims if all(f[0] != j for f in faults)] or victims
        faults.append((rng.choice(victims), kind, rng.uniform(0.2, 2.5), rng.uniform(0.3, 2.5)))
    return faults


def train_cmd(args, record=None):
    cmd = [os.path.join(args.build, "tsshim-train"), "--device", "cuda", "--workers", "2", "--batch", "16",
           "--seed", "7", "--epochs", "3", "--size", "64", "--step-ms", "80", os.path.join(args.data, "train")]
    return cmd[:1] + (["--record", record] if record else []) + cmd[1:]


def train_env(args):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(args.build, "emu"))
    env.pop("LD_PRELOAD", None)
    return env


def checksum(text):
    for line in text.splitlines():
        if "trained_checksum=" in line:
            return line.split("trained_checksum=")[1].split()[0]
    return None


SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "int": signal.SIGINT, "term": signal.SIGTERM}


def inject(jobs, faults, timeout, failures, missed):
    """Send each fault at its time (from now), SIGCONT stopped jobs after their
    pause, wait for every job; a job still running after `timeout` s hung.
    missed(j): the job's work is done, a fault now would hit nothing."""
    t0 = time.monotonic()
    pending = sorted(faults, key=lambda f: f[2])
    stopped = []
    while time.monotonic() < t0 + timeout:
        now = time.monotonic() - t0
        while pending and pending[0][2] <= now:
            j, kind, _, stop_s = pending.pop(0)
            p = jobs[j]["p"]
            if p.poll() is not None or missed(j):
                continue  # it finished first: the fault missed
            jobs[j]["fault"] = kind
            # a job that dies of a signal cleans nothing: with no other job left
            # to, its feed stays in /dev/shm (README, Limitations)
            jobs[j]["alone"] = all(o["p"].poll() is not None for i, o in enumerate(jobs) if i != j)
            p.send_signal(SIGNALS[kind])
            if kind == "stop":
                stopped.append((j, now + stop_s))
        for j, until in list(stopped):
            if now >= until:
                jobs[j]["p"].send_signal(signal.SIGCONT)
                stopped.remove((j, until))
        if not pending and not stopped and all(job["p"].poll() is not None for job in jobs):
            break
        time.sleep(0.01)
    for j, job in enumerate(jobs):
        if job["p"].poll() is None:
            failures.append("job %d (%s) hung: still running after %d s" % (j, job["desc"], timeout))
            job["p"].kill()
            job["p"].wait()
        job["err"].close()


def processes_of(session):
    """Live processes started for the session's jobs: the jobs' and, after a
    job was killed, its orphaned DataLoader workers (spawned ones run the
    shim and are members until their watchdog sees the job gone, up to 5 s
    later). Found by the TSSHIM_SESSION they inherit."""
    mark = ("TSSHIM_SESSION=%s\0" % session).encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if mark in f.read() + b"\0":
                    found.append(int(pid))
        except OSError:
            pass
    return found


def check_left(session, failures, jobs):
    """Nothing of the session may be left in /dev/shm once every job is gone,
    its workers included, unless a job died of a signal after every other
    job had exited: nobody was left to clean up after it (the documented
    limitation). A process of the session still there 15 s after its jobs
    ended is a failure (it is killed, and what it leaves is not counted
    again). Orphaned DataLoader workers see their job gone within 5 s:
    share_job.py gives them a watchdog that knows the job's pid (before, a
    worker spawned as its job was killed waited for ever, PyTorch's own
    watchdog having taken init for the job)."""
    deadline = time.monotonic() + 15
    while processes_of(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    stuck = processes_of(session)
    for pid in stuck:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if stuck:
        failures.append("processes of the session still running 15 s after its jobs, killed: %s" % stuck)
    time.sleep(0.2)
    left = leftovers(session)
    if not left:
        return
    alone = [j for j, job in enumerate(jobs) if job.get("alone") and (job["p"].returncode or 0) < 0]
    if alone and not stuck:
        print("#   note: job %d died of a signal after every other job had exited; left in /dev/shm, "
              "as documented: %s" % (alone[0], " ".join(left[:4])), flush=True)
    elif not stuck:
        failures.append("left in /dev/shm: %s" % " ".join(left[:4]))
    for n in left:
        try:
            os.unlink(os.path.join(SHM, n))
        except OSError:
            pass


def describe(faults):
    return ", ".join("%s job %d at %.1fs%s" % (k, j, at, " for %.1fs" % st if k == "stop" else "")
                     for j, k, at, st in faults)


def run_round(args, rnd, rng, tmp):
    if args.train:
        return run_train_round(args, rnd, rng, tmp)
    session = "stress-%d-%d" % (os.getpid(), rnd)
    njobs = rng.choice((2, 3, 3))
    d = os.path.join(tmp, "r%d" % rnd)
    os.makedirs(d)
    env = dict(os.environ, LD_PRELOAD=args.lib, TSSHIM_SESSION=session, TSSHIM_LOG="info")
    env.pop("TSSHIM_MODE", None)
    jobs = []
    for j in range(njobs):
        bs = rng.choice((16, 32, 48, 64))
        workers = rng.choice((0, 2, 2))
        cmd = [PY, JOB, "--root", args.data, "--record", os.path.join(d, "%d.jsonl" % j),
               "--seed", str(j + 1), "--model", "abc"[j % 3], "--batch-size", str(bs),
               "--workers", str(workers), "--epochs", "3", "--sleep", "0.1",
               "--barrier", "%s:%d" % (os.path.join(d, "go"), njobs)]
        err = open(os.path.join(d, "%d.err" % j), "w")
        jobs.append({"p": subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err),
                     "err": err, "desc": "bs=%d workers=%d" % (bs, workers), "fault": None})
    faults = plan(rng, njobs)
    failures = []
    start = time.monotonic()
    # faults count from the moment every job is training
    while time.monotonic() - start < 90 and not all(
            batches_recorded(os.path.join(d, "%d.jsonl" % j)) for j in range(njobs)):
        if any(job["p"].poll() is not None for job in jobs):
            break
        time.sleep(0.02)
    inject(jobs, faults, args.round_timeout, failures,
           missed=lambda j: finished(os.path.join(d, "%d.jsonl" % j)))
    injected = sum(1 for job in jobs if job["fault"])
    survived = 0
    for j, job in enumerate(jobs):
        rc, kind = job["p"].returncode, job["fault"]
        want = {None: (0,), "stop": (0,), "kill": (-9,), "term": (-15,), "int": (-2, 1, 130)}[kind]
        if kind == "int" and finished(os.path.join(d, "%d.jsonl" % j)):
            want = (0, -2, 1, 130)  # the interrupt came as it was exiting: Python ignores it then
        if rc not in want:
            tail = open(os.path.join(d, "%d.err" % j)).read()[-600:].replace("\n", " | ")
            failures.append("job %d (%s, fault %s) exit %s, expected %s: %s" % (j, job["desc"], kind, rc, want, tail))
        elif kind == "stop":
            survived += 1
    if kind_any(jobs, ("kill", "int", "term")):
        survived += sum(1 for job in jobs if job["fault"] is None and job["p"].returncode == 0)
    recs = [os.path.join(d, "%d.jsonl" % j) for j in range(njobs)]
    v = subprocess.run([PY, VERIFY, "--root", args.data, "--cache", args.table] + recs,
                       capture_output=True, text=True)
    if v.returncode != 0:
        failures.append("verifier: " + " | ".join(l for l in v.stdout.splitlines() if not l.startswith("note"))[:900])
    check_left(session, failures, jobs)
    return njobs, injected, survived, failures, describe(faults), [job["desc"] for job in jobs]


def run_train_round(args, rnd, rng, tmp):
    """3 same-seed tsshim-train jobs on the test device in exact mode (their JPEG
    decodes shared through the cache): a survivor trains on exactly what it
    trains on alone (trained_checksum), whoever dies mid-fill."""
    session = "stress-%d-%d" % (os.getpid(), rnd)
    d = os.path.join(tmp, "r%d" % rnd)
    os.makedirs(d)
    env = dict(train_env(args), LD_PRELOAD=args.lib, TSSHIM_SESSION=session, TSSHIM_MODE="exact")
    njobs = 3
    jobs = []
    for j in range(njobs):
        out = open(os.path.join(d, "%d.out" % j), "w")
        jobs.append({"p": subprocess.Popen(train_cmd(args), env=env, stdout=out, stderr=subprocess.STDOUT),
                     "err": out, "desc": "tsshim-train", "fault": None})
    faults = plan(rng, njobs)
    failures = []
    inject(jobs, faults, args.round_timeout, failures, missed=lambda j: False)
    survived = 0
    for j, job in enumerate(jobs):
        rc, kind = job["p"].returncode, job["fault"]
        text = open(os.path.join(d, "%d.out" % j)).read()
        want = {None: (0,), "stop": (0,), "kill": (-9,), "term": (143, -15), "int": (130, -2)}[kind]
        if rc not in want:
            failures.append("job %d (fault %s) exit %s, expected %s: %s" % (j, kind, rc, want,
                                                                           text[-400:].replace("\n", " | ")))
        elif rc == 0:
            got = checksum(text)
            if got != args.reference:
                failures.append("job %d (fault %s) trained on other data: checksum %s, alone %s"
                                % (j, kind, got, args.reference))
            elif kind or any(job2["fault"] in ("kill", "int", "term") for job2 in jobs):
                survived += 1
    check_left(session, failures, jobs)
    return njobs, sum(1 for job in jobs if job["fault"]), survived, failures, describe(faults), ["tsshim-train"] * njobs


def kind_any(jobs, kinds):
    return any(job["fault"] in kinds for job in jobs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="tsshim-mkdata dataset root")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libtsshim.so"),
                    help="LD_PRELOAD for the jobs (default build/libtsshim.so)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None, help="fault plan seed (default: random, printed)")
    ap.add_argument("--round-timeout", type=int, default=120, help="seconds before a job counts as hung")
    ap.add_argument("--table", default=None, help="share_verify table cache (default: in the temp dir)")
    ap.add_argument("--train", action="store_true",
                    help="rounds of 3 same-seed tsshim-train jobs in exact mode on the test device instead")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="where tsshim-train and emu/ are")
    args = ap.parse_args()
    if args.train:  # what a job trains on alone, without the shim
        ref = subprocess.run(train_cmd(args), env=train_env(args), capture_output=True, text=True)
        args.reference = checksum(ref.stdout)
        if ref.returncode != 0 or not args.reference:
            sys.exit("stress: the reference tsshim-train run failed: %s" % (ref.stdout + ref.stderr)[-500:])
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="tsshim-stress.")
    args.table = args.table or os.path.join(tmp, "table.json")
    print("stress: seed %d, %d rounds, records in %s" % (seed, args.rounds, tmp), flush=True)
    runs = faults = survived = nfail = 0
    for rnd in range(args.rounds):
        njobs, inj, surv, failures, desc, jobs = run_round(args, rnd, rng, tmp)
        runs += 1
        faults += inj
        survived += surv
        nfail += len(failures)
        print("round %d: %d jobs (%s); %s: %s" % (rnd, njobs, "; ".join(jobs), desc,
                                                 "ok" if not failures else "FAILED"), flush=True)
        for f in failures:
            print("  FAIL " + f, flush=True)
    print("stress: %d runs, %d faults injected, %d jobs survived their fault or outlived a killed one, "
          "%d failures" % (runs, faults, survived, nfail))
    if nfail == 0:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()

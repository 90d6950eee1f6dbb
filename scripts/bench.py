#!/usr/bin/env python3
"""tsshim benchmark: the same collocated jobs without the shim and with it.

Runs each configuration's jobs together, once without the shim (A) and once
with it (B), interleaved A B A B ... for --repeats rounds, and reports per
configuration and variant: total CPU seconds (user + sys of every process,
loader workers included: wait4 of each job; Python and torch start-up
included), wall seconds and aggregate samples/s while training (from the
moment every job has started up and built its loaders, a barrier in the
job, to the last job's end), peak memory (sum over jobs of each job's peak RSS, its workers
included), and for the emulated-GPU jobs the bytes copied host to device
(the emulator's counters). Ratios are B/A per round; the median and the
spread (min..max) are printed.

Configurations (job counts by --jobs):
  socketK   K PyTorch jobs (tests/py/share_job.py: ImageFolder, 2 workers,
            tiny models a/b/c), seeds 1..K: with the shim they share one
            DataLoader (TSSHIM_MODE=socket)
  exact3    3 same-seed PyTorch jobs; with the shim TSSHIM_MODE=exact (their
            models a/b/c draw differently from torch's generator before the
            loader does, so their epochs differ: their JPEG decodes are
            shared, each job runs its own loader)
  exact3lr  3 same-seed jobs of one model, learning rates 0.1/0.03/0.01 (a
            sweep), TSSHIM_MODE=exact: their epochs are the same, so whole
            batches are shared (one job runs its loader)
  starved3  socket3 with every job pinned to one core (taskset): the jobs
            want more CPU than they get, so samples/s is the figure
  gpu3      3 tsshim-train --device cuda --tsshim jobs on the CUDA test
            device (emulated GPU), socket mode: host-to-device bytes (without
            the shim --tsshim changes nothing: the API symbol is weak)
  gpu3py    socket3's PyTorch jobs uploading each batch to the CUDA test
            device (share_job.py --emu-cuda: by ctypes, as x.cuda() does;
            Debian's torch has no CUDA): host-to-device bytes
  tiny1     one PyTorch job alone (tests/py/tiny_job.py: 10,000 batches of 4
            in-memory samples of 16 floats, no workers): what the layer costs
            a batch where making one costs next to nothing (the brief: a job
            alone costs within noise; it publishes only an epoch's first
            TSSHIM_DEPTH batches)

Pass-through overhead: tsshim-overhead (4 KiB pread and open+read+close of a
non-dataset file, a non-batch cudaMemcpyAsync on the test device) and
`python3 -c pass` (the start-up bootstrap), plain and shim interleaved.

Output: a table, build/bench/results.json, build/bench/bench.png (when
matplotlib is installed) and a last line
  RESULT cpu_ratio_socket3=X throughput_ratio_socket3=Y cpu_ratio_exact3=Z h2d_ratio_socket3=W
         cpu_ratio_alone_tiny=V (tiny1's CPU after start-up)
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
JOB = os.path.join(ROOT, "tests", "py", "share_job.py")


def log(msg):
    print(msg, flush=True)


class Run:
    """One configuration variant, run once: its jobs start together."""

    def __init__(self, name, variant, cpu, wall, samples, rss_mb, h2d=None, startup=0.0):
        self.name, self.variant = name, variant
        self.cpu, self.wall, self.samples, self.rss_mb, self.h2d = cpu, wall, samples, rss_mb, h2d
        self.startup = startup  # CPU the jobs spent starting up (interpreter, torch), not sharable

    @property
    def cpu_train(self):
        return self.cpu - self.startup

    @property
    def rate(self):
        return self.samples / self.wall if self.wall > 0 else 0.0


def run_jobs(cmds, env, tmp, barrier=None):
    """Start every command, wait for all: (cpu s, wall s, summed peak RSS MB, outputs).
    With a barrier directory, wall counts from the moment every job reached it
    (torch imported, loaders built): the time the jobs spend training."""
    procs = []
    t0 = time.monotonic()
    for i, cmd in enumerate(cmds):
        out = open(os.path.join(tmp, "job%d.out" % i), "w+")
        procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    while barrier and time.monotonic() - t0 < 120:
        if len(os.listdir(barrier)) >= len(cmds) if os.path.isdir(barrier) else False:
            t0 = time.monotonic()
            break
        if any(p.poll() is not None for p, _ in procs):
            break
        time.sleep(0.002)
    cpu = rss = 0.0
    outputs = []
    for p, out in procs:
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        cpu += ru.ru_utime + ru.ru_stime
        rss += ru.ru_maxrss / 1024.0
        out.seek(0)
        text = out.read()
        out.close()
        if p.returncode != 0:
            raise SystemExit("bench: a job failed (exit %d): %s\n%s" % (p.returncode, " ".join(cmds[0]), text[-2000:]))
        outputs.append(text)
    return cpu, time.monotonic() - t0, rss, outputs


SWEEP_LR = ("0.1", "0.03", "0.01")


def torch_jobs(args, k, seeds, barrier, pin=False, emu=None, sweep=False):
    """sweep: one model, learning rates SWEEP_LR (a learning-rate sweep), else models a/b/c"""
    cmds = []
    for i in range(k):
        model = ["--model", "a", "--lr", SWEEP_LR[i % 3]] if sweep else ["--model", "abc"[i % 3]]
        cmd = [PY, JOB, "--root", args.data, "--seed", str(seeds[i])] + model + [
               "--batch-size", "64", "--workers", str(args.workers), "--epochs", str(args.epochs),
               "--transform", args.transform,
               "--barrier", "%s:%d" % (barrier, k)] + (["--emu-cuda", emu] if emu else [])
        cmds.append((["taskset", "-c", "0"] if pin else []) + cmd)
    return cmds


def run_torch(args, name, k, shim, mode, same_seed=False, pin=False, gpu=False, rnd=0, sweep=False):
    tmp = tempfile.mkdtemp(prefix="tsshim-bench.")
    try:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        if shim:
            env.update(LD_PRELOAD=args.lib, TSSHIM_MODE=mode, TSSHIM_SESSION="bench-%d-%s-%d" % (os.getpid(), name, rnd))
        emu = stats = None
        if gpu:
            emu = os.path.join(args.build, "emu", "libcudart.so.13")
            stats = os.path.join(tmp, "emu.stats")
            env.update(LD_LIBRARY_PATH=os.path.dirname(emu), TSEMU_DEVICES="1", TSEMU_STATS=stats)
        seeds = [1] * k if same_seed else list(range(1, k + 1))
        go = os.path.join(tmp, "go")
        cpu, wall, rss, outs = run_jobs(torch_jobs(args, k, seeds, go, pin, emu, sweep), env, tmp, barrier=go)
        samples = sum(int(m.group(1)) for o in outs for m in re.finditer(r"^job: .*samples=(\d+)", o, re.M))
        startup = sum(float(m.group(1)) for o in outs for m in re.finditer(r"^job: .*startup_cpu_s=([\d.]+)", o, re.M))
        h2d = None
        if stats:
            with open(stats) as f:
                h2d = sum(json.loads(line).get("h2d_bytes", 0) for line in f if line.strip())
        return Run(name, "shim" if shim else "plain", cpu, wall, samples, rss, h2d, startup=startup)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_gpu(args, name, k, shim, rnd=0):
    tmp = tempfile.mkdtemp(prefix="tsshim-bench.")
    try:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env["LD_LIBRARY_PATH"] = os.path.join(args.build, "emu")
        if shim:
            env.update(LD_PRELOAD=args.lib, TSSHIM_MODE="socket", TSSHIM_SESSION="bench-%d-%s-%d" % (os.getpid(), name, rnd))
        stats = os.path.join(tmp, "emu.stats")
        env["TSEMU_STATS"] = stats
        train = os.path.join(args.build, "tsshim-train")
        cmds = [[train, "--device", "cuda", "--tsshim", "--workers", "2", "--batch", "32", "--seed", str(i + 1),
                 "--epochs", "1", "--size", "112", os.path.join(args.data, "train")] for i in range(k)]
        cpu, wall, rss, outs = run_jobs(cmds, env, tmp)
        h2d = 0
        with open(stats) as f:
            for line in f:
                h2d += json.loads(line).get("h2d_bytes", 0)
        samples = sum(int(m.group(1)) for o in outs for m in re.finditer(r"samples[=:](\d+)", o))
        return Run(name, "shim" if shim else "plain", cpu, wall, samples, rss, h2d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_tiny(args, name, shim, rnd=0):
    tmp = tempfile.mkdtemp(prefix="tsshim-bench.")
    try:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        if shim:
            env.update(LD_PRELOAD=args.lib, TSSHIM_MODE="socket", TSSHIM_SESSION="bench-%d-%s-%d" % (os.getpid(), name, rnd))
        go = os.path.join(tmp, "go")
        cmd = [PY, os.path.join(ROOT, "tests", "py", "tiny_job.py"), "--barrier", go + ":1"]
        cpu, wall, rss, outs = run_jobs([cmd], env, tmp, barrier=go)
        samples = sum(int(m.group(1)) for o in outs for m in re.finditer(r"^job: .*samples=(\d+)", o, re.M))
        startup = sum(float(m.group(1)) for o in outs for m in re.finditer(r"^job: .*startup_cpu_s=([\d.]+)", o, re.M))
        return Run(name, "shim" if shim else "plain", cpu, wall, samples, rss, startup=startup)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def overhead(args, rounds=5, starts=20):
    """Pass-through cost, plain vs shim, interleaved: tsshim-overhead's per-call
    figures (medians of `rounds` runs) and Python start-up (median of `starts`)."""
    tool = os.path.join(args.build, "tsshim-overhead")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = os.path.join(args.build, "emu")
    shim_env = dict(env, LD_PRELOAD=args.lib, TSSHIM_SESSION="bench-%d-overhead" % os.getpid())
    res = {"plain": {}, "shim": {}}
    for _ in range(rounds):
        for var, e in (("plain", env), ("shim", shim_env)):
            out = subprocess.run([tool, "--calls", "100000", "--rounds", "3"], env=e, capture_output=True,
                                 text=True, check=True).stdout
            for k, v in re.findall(r"(\w+)_ns=([\d.]+|nan)", out):
                res[var].setdefault(k, []).append(float(v))
    for _ in range(starts):
        for var, e in (("plain", env), ("shim", shim_env)):
            t0 = time.monotonic()
            subprocess.run([PY, "-c", "pass"], env=e, check=True)
            res[var].setdefault("python_start", []).append((time.monotonic() - t0) * 1e9)
    out = {}
    for k in res["plain"]:
        a, b = statistics.median(res["plain"][k]), statistics.median(res["shim"][k])
        out[k] = {"plain_ns": a, "shim_ns": b, "extra_ns": b - a}
    return out


def overhead_table(o):
    names = {"pread": "4 KiB pread, non-dataset file", "open_close": "open+read+close, non-dataset file",
             "memcpy_async": "cudaMemcpyAsync, not a batch (test device)",
             "python_start": "python3 -c pass (bootstrap loaded)"}
    lines = ["%-44s %12s %12s %12s" % ("pass-through call", "plain", "shim", "extra")]
    for k, v in o.items():
        unit, div = ("ms", 1e6) if k == "python_start" else ("ns", 1.0)
        lines.append("%-44s %9.1f %s %9.1f %s %9.1f %s" % (names.get(k, k), v["plain_ns"] / div, unit,
                                                          v["shim_ns"] / div, unit, v["extra_ns"] / div, unit))
    return "\n".join(lines)


def configs(args):
    out = []
    for k in args.jobs:
        out.append(("socket%d" % k, lambda shim, r, k=k: run_torch(args, "socket%d" % k, k, shim, "socket", rnd=r)))
    if not args.only_socket:
        out.append(("exact3", lambda shim, r: run_torch(args, "exact3", 3, shim, "exact", same_seed=True, rnd=r)))
        out.append(("exact3lr", lambda shim, r: run_torch(args, "exact3lr", 3, shim, "exact", same_seed=True, rnd=r,
                                                          sweep=True)))
        out.append(("starved3", lambda shim, r: run_torch(args, "starved3", 3, shim, "socket", pin=True, rnd=r)))
        out.append(("tiny1", lambda shim, r: run_tiny(args, "tiny1", shim, rnd=r)))
        if os.path.exists(os.path.join(args.build, "emu", "libcudart.so.13")):
            out.append(("gpu3", lambda shim, r: run_gpu(args, "gpu3", 3, shim, rnd=r)))
            out.append(("gpu3py", lambda shim, r: run_torch(args, "gpu3py", 3, shim, "socket", gpu=True, rnd=r)))
    if args.only:
        keep = set(args.only.split(","))
        out = [c for c in out if c[0] in keep]
        if not out:
            raise SystemExit("bench: --only %s names no configuration" % args.only)
    return out


def summary(runs):
    """Per configuration: medians per variant and the B/A ratios per round."""
    res = {}
    for name in dict.fromkeys(r.name for r in runs):
        a = [r for r in runs if r.name == name and r.variant == "plain"]
        b = [r for r in runs if r.name == name and r.variant == "shim"]
        entry = {}
        for var, rs in (("plain", a), ("shim", b)):
            entry[var] = {k: statistics.median(getattr(r, k) for r in rs)
                          for k in ("cpu", "cpu_train", "startup", "wall", "rate", "rss_mb")}
            entry[var]["samples"] = rs[0].samples
            if rs[0].h2d is not None:
                entry[var]["h2d_bytes"] = statistics.median(r.h2d for r in rs)
            entry[var]["runs"] = [dict(cpu=r.cpu, startup=r.startup, wall=r.wall, rate=r.rate, rss_mb=r.rss_mb, h2d=r.h2d)
                                  for r in rs]
        ratios = {}
        for key in ("cpu", "cpu_train", "wall", "rate", "rss_mb") + (("h2d",) if a[0].h2d is not None else ()):
            rr = [getattr(y, key) / getattr(x, key) for x, y in zip(a, b) if getattr(x, key)]
            if rr:
                ratios[key] = {"median": statistics.median(rr), "min": min(rr), "max": max(rr)}
        entry["ratio"] = ratios
        res[name] = entry
    return res


def table(res):
    lines = ["%-9s %-6s %9s %9s %8s %10s %9s %8s" % ("config", "", "CPU s", "start-up", "wall s", "samples/s",
                                                      "peak MB", "H2D MB")]
    for name, e in res.items():
        for var in ("plain", "shim"):
            v = e[var]
            h2d = "%.1f" % (v["h2d_bytes"] / 1e6) if "h2d_bytes" in v else "-"
            lines.append("%-9s %-6s %9.2f %9.2f %8.2f %10.1f %9.0f %8s" % (
                name, var, v["cpu"], v["startup"], v["wall"], v["rate"], v["rss_mb"], h2d))
        r = e["ratio"]
        fmt = lambda k: "%.2f (%.2f..%.2f)" % (r[k]["median"], r[k]["min"], r[k]["max"]) if k in r else "-"  # noqa: E731
        lines.append("%-9s %-6s cpu %s  (after start-up %s)  wall %s  samples/s %s%s" % (
            "", "ratio", fmt("cpu"), fmt("cpu_train"), fmt("wall"), fmt("rate"),
            ("  h2d " + fmt("h2d")) if "h2d" in r else ""))
    return "\n".join(lines)


def plot(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("bench: matplotlib not installed (scripts/install-deps.sh --bench): no plot")
        return False
    ks = sorted(int(n[6:]) for n in res if re.fullmatch(r"socket\d+", n))
    if not ks:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for var, style in (("plain", "o-"), ("shim", "s-")):
        label = "without sharing" if var == "plain" else "with tsshim"
        ax1.plot(ks, [res["socket%d" % k][var]["cpu"] for k in ks], style, label=label)
        ax2.plot(ks, [res["socket%d" % k][var]["rate"] for k in ks], style, label=label)
    ax1.set(xlabel="collocated PyTorch jobs", ylabel="CPU seconds (all processes)", xticks=ks, ylim=(0, None))
    ax2.set(xlabel="collocated PyTorch jobs", ylabel="samples/s (all jobs)", xticks=ks, ylim=(0, None))
    ax1.legend()
    ax1.set_title("CPU spent")
    ax2.set_title("throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", required=True, help="tsshim-mkdata dataset root")
    ap.add_argument("--repeats", type=int, default=3, help="A/B rounds per configuration (default 3)")
    ap.add_argument("--jobs", default="1,2,3", help="job counts of the socket configurations (default 1,2,3)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--transform", default="train224",
                    help="share_job.py --transform (default train224: RandomResizedCrop(224), flip)")
    ap.add_argument("--only-socket", action="store_true", help="only the socketK configurations")
    ap.add_argument("--only", default="", help="only these configurations (comma-separated names, e.g. gpu3)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the pass-through overhead measurement")
    ap.add_argument("--out", default=None, help="output directory (default BUILD/bench)")
    args = ap.parse_args()
    args.jobs = [int(x) for x in args.jobs.split(",") if x]
    args.lib = os.path.join(args.build, "libtsshim.so")
    out = args.out or os.path.join(args.build, "bench")
    os.makedirs(out, exist_ok=True)

    runs = []
    cfgs = configs(args)
    total = len(cfgs) * args.repeats * 2
    n = 0
    for rnd in range(args.repeats):
        for name, fn in cfgs:
            for shim in (False, True):
                n += 1
                r = fn(shim, rnd)
                runs.append(r)
                log("bench: [%d/%d] %-9s %-5s cpu %6.2f s  wall %6.2f s  %7.1f samples/s%s" % (
                    n, total, name, r.variant, r.cpu, r.wall, r.rate,
                    "  h2d %.1f MB" % (r.h2d / 1e6) if r.h2d is not None else ""))
    res = summary(runs)
    over = None
    if not args.no_overhead:
        log("bench: pass-through overhead (tsshim-overhead, python3 -c pass), plain and shim interleaved")
        over = overhead(args)
    machine = {"cpus": os.cpu_count(), "uname": " ".join(os.uname()), "date": time.strftime("%Y-%m-%d %H:%M")}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"machine": machine, "args": {k: v for k, v in vars(args).items()}, "results": res,
                   "overhead": over}, f, indent=1)
    log("")
    log(table(res))
    if over:
        log("")
        log(overhead_table(over))
    if plot(res, os.path.join(out, "bench.png")):
        log("bench: plot %s" % os.path.join(out, "bench.png"))
    log("bench: results %s" % os.path.join(out, "results.json"))

    def med(name, key):
        r = res.get(name, {}).get("ratio", {}).get(key)
        return "%.3f" % r["median"] if r else "nan"
    log("RESULT cpu_ratio_socket3=%s throughput_ratio_socket3=%s cpu_ratio_exact3=%s h2d_ratio_socket3=%s "
        "cpu_ratio_alone_tiny=%s" % (med("socket3", "cpu"), med("starved3", "rate"), med("exact3", "cpu"),
                                     med("gpu3", "h2d"), med("tiny1", "cpu_train")))


if __name__ == "__main__":
    main()

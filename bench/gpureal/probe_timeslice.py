#!/usr/bin/env python3
"""The go/no-go probe of per-context time slices (bench/gpureal/probe-timeslice.sh;
docs/gpu.md, "Per-context time slices").

Runs the standard pair of make bench-gpu-real (workloads/ls.py and workloads/batch.py,
their JSON-lines protocol) as plain processes, no agent, no cgroups:

  ls           LS, no shim                     batch        batch, no shim
  ls-default   LS, shim without a slice        batch-<us>   batch, shim, slice <us>
               (reports its contexts only)                  (one per --batch-slices)
  ls-long      LS, shim, slice --ls-long

all started at once, then these phases of --phase seconds, one after another:
ls alone; batch alone; batch-<us> alone (each); ls + batch (the driver's own
time-slicing); ls-default + batch-<us> and ls-long + batch-<us> (each).

It prints LS p50/p99 against LS alone, batch matmuls/s against batch alone and against
the time-sliced pair, what each shim process reported (slices asked, status, read
back), whether the shim was mapped into each process (/proc/<pid>/maps), and a verdict:
"no-go" when LS p99 with batch short and LS long stays at or above 2x alone (the
firmware ignores the value), "inconclusive" when the shim saw no context or the driver
did not take the slice, else "go". Everything goes to <out>/probe-timeslice.json too.
"""
import argparse
import glob
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time

NO_GO_RATIO = 2.0


class Proc:
    """One stand-in process and its events."""

    def __init__(self, role, argv, env):
        self.role = role
        self.events = queue.Queue()
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        self.stderr = []
        self.ready = None
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self.events.put({"event": "exit"})

    def _err(self):
        for line in self.p.stderr:
            self.stderr.append(line.rstrip())
            del self.stderr[:-20]

    def send(self, cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def wait(self, kind, timeout):
        end = time.time() + timeout
        while True:
            left = end - time.time()
            if left <= 0:
                raise RuntimeError("%s: no %s event within %.0f s; stderr: %s"
                                   % (self.role, kind, timeout, " | ".join(self.stderr[-5:])))
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev.get("event") == kind:
                return ev
            if ev.get("event") in ("error", "exit"):
                raise RuntimeError("%s: %s before %s; stderr: %s"
                                   % (self.role, ev, kind, " | ".join(self.stderr[-5:])))

    def stop(self):
        try:
            self.send({"cmd": "quit"})
            self.p.stdin.close()
            self.p.wait(timeout=20)
        except Exception:  # noqa: whatever state it is in, it goes
            self.p.kill()


def quantile(sorted_values, q):
    """Nearest-rank quantile, as bench/gpureal's stats.go."""
    if not sorted_values:
        return 0.0
    k = int(math.ceil(q * len(sorted_values))) - 1
    return sorted_values[min(max(k, 0), len(sorted_values) - 1)]


def ls_stats(res, skip, phase):
    lat = sorted(l for t, l in zip(res["sched"], res["lat_ms"]) if skip <= t < phase)
    first = sorted(l for t, l in zip(res["sched"], res["lat_ms"]) if skip <= t < skip + 1)
    return {"requests": len(lat), "unsent": res.get("unsent", 0), "p50Ms": quantile(lat, 0.5),
            "p99Ms": quantile(lat, 0.99), "firstSecondP99Ms": quantile(first, 0.99)}


def batch_stats(res, skip, phase):
    n = sum(1 for t in res["syncs"] if skip <= t < phase) * res["every"]
    return {"matmuls": n, "perSecond": n / max(phase - skip, 1e-9)}


def parse_report_line(line):
    """A shim report line (koordlet/gpu/timeslice parses it strictly; here only read)."""
    parts = line.split(" ")
    if not parts or parts[0] != "tsg/1":
        return None
    out = {}
    for p in parts[1:]:
        k, _, v = p.partition("=")
        out[k] = v
    return out


def read_reports(d):
    lines = []
    for f in sorted(glob.glob(os.path.join(d, "tsg-*.log"))):
        with open(f, errors="replace") as fh:
            lines.extend(l.rstrip("\n") for l in fh.read(1 << 20).splitlines())
    return lines


def summarise_reports(lines, slice_us):
    evs = [e for e in (parse_report_line(l) for l in lines) if e]
    s = {"events": len(evs), "modes": {}, "asked": slice_us, "setOK": 0, "readBackEqual": 0,
         "appSets": [], "statuses": [], "readBack": []}
    for e in evs:
        s["modes"][e.get("mode")] = s["modes"].get(e.get("mode"), 0) + 1
        if e.get("ev") == "app-set":
            s["appSets"].append(e.get("app"))
        if e.get("mode") != "set":
            continue
        s["statuses"].append("rc=%s status=%s" % (e.get("rc"), e.get("status")))
        s["readBack"].append("%s (rc=%s status=%s)" % (e.get("rb"), e.get("rbrc"), e.get("rbstatus")))
        if e.get("rc") == "0" and e.get("status") == "0x0":
            s["setOK"] += 1
        if e.get("rb") == e.get("asked"):
            s["readBackEqual"] += 1
    s["driver"] = sorted({e.get("drv") for e in evs})
    return s


def mapped(pid, shim):
    try:
        with open("/proc/%d/maps" % pid) as f:
            return os.path.basename(shim) in f.read()
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", required=True, help="libunderstory-tsg.so")
    ap.add_argument("--extra-preload", default="", help="a library preloaded after the shim (tests: the fake driver)")
    ap.add_argument("--workloads", default="bench/gpureal/workloads")
    ap.add_argument("--out", required=True, help="directory for the reports and probe-timeslice.json")
    ap.add_argument("--phase", type=float, default=10.0, help="seconds per phase")
    ap.add_argument("--skip", type=float, default=1.0, help="seconds at each phase's start left out of the figures")
    ap.add_argument("--batch-slices", default="100", help="batch slices in us, comma-separated")
    ap.add_argument("--ls-long", type=int, default=10000, help="LS's long slice in us")
    ap.add_argument("--ready-timeout", type=float, default=240.0)
    ap.add_argument("--python", default=sys.executable,
                    help="the stand-ins' interpreter (default: this one's binary, not a wrapper script that "
                    "would run under the shim too)")
    ap.add_argument("--fake", action="store_true", help="a dry run without a GPU: the verdict says so")
    ap.add_argument("--ls-args", default="", help="extra arguments of ls.py")
    ap.add_argument("--batch-args", default="", help="extra arguments of batch.py")
    a = ap.parse_args()
    slices = [int(s) for s in a.batch_slices.split(",") if s.strip()]
    skip = min(a.skip, a.phase / 2)
    shim = os.path.abspath(a.shim)
    preload = shim + (":" + os.path.abspath(a.extra_preload) if a.extra_preload else "")
    os.makedirs(a.out, exist_ok=True)

    base = {k: v for k, v in os.environ.items()
            if not k.startswith("UNDERSTORY_TSG_") and k != "LD_PRELOAD"}
    base["PYTHONUNBUFFERED"] = "1"
    base["PYTHONDONTWRITEBYTECODE"] = "1"

    def spec(role, script, slice_us, args):
        env = dict(base)
        if slice_us is not None:
            d = os.path.join(a.out, "tsg-" + role)
            os.makedirs(d, exist_ok=True)
            for f in glob.glob(os.path.join(d, "tsg-*.log")):
                os.remove(f)
            env["LD_PRELOAD"] = preload
            env["UNDERSTORY_TSG_REPORT"] = os.path.abspath(d)
            if slice_us > 0:
                env["UNDERSTORY_TSG_TIMESLICE_US"] = str(slice_us)
        return role, [a.python, "-u", os.path.join(a.workloads, script)] + args.split(), env, slice_us

    specs = [spec("ls", "ls.py", None, a.ls_args), spec("ls-default", "ls.py", 0, a.ls_args),
             spec("ls-long", "ls.py", a.ls_long, a.ls_args), spec("batch", "batch.py", None, a.batch_args)]
    specs += [spec("batch-%d" % s, "batch.py", s, a.batch_args) for s in slices]

    procs = {}
    result = {"fake": a.fake, "phaseSeconds": a.phase, "skipSeconds": skip, "batchSlicesUs": slices, "lsLongUs": a.ls_long,
              "processes": {}, "phases": [], "reports": {}}
    t0 = time.time()
    try:
        for role, argv, env, _ in specs:
            procs[role] = Proc(role, argv, env)
        for role, _, _, slice_us in specs:
            r = procs[role].wait("ready", a.ready_timeout)
            procs[role].ready = r
            result["processes"][role] = {"pid": r.get("pid"), "device": r.get("device"), "torch": r.get("torch"),
                                         "warmMs": r.get("warm_ms"), "shim": slice_us is not None,
                                         "sliceUs": slice_us or None, "shimMapped": mapped(r.get("pid", 0), shim)}
        print("probe-timeslice: %d processes ready after %.1f s" % (len(procs), time.time() - t0), flush=True)

        plan = [("ls alone", ["ls"]), ("batch alone", ["batch"])]
        plan += [("batch %d us alone" % s, ["batch-%d" % s]) for s in slices]
        plan += [("pair, driver default", ["ls", "batch"])]
        for s in slices:
            plan += [("pair, batch %d us, LS default" % s, ["ls-default", "batch-%d" % s]),
                     ("pair, batch %d us, LS %d us" % (s, a.ls_long), ["ls-long", "batch-%d" % s])]
        for name, roles in plan:
            start = time.time() + 0.5
            for r in roles:
                procs[r].send({"cmd": "run", "phase": name, "start": start, "end": start + a.phase, "mode": "run"})
            ph = {"name": name, "roles": roles}
            for r in roles:
                res = procs[r].wait("result", a.phase + 60)
                if r.startswith("ls"):
                    ph["ls"] = ls_stats(res, skip, a.phase)
                    ph["lsRole"] = r
                else:
                    ph["batch"] = batch_stats(res, skip, a.phase)
                    ph["batchRole"] = r
            result["phases"].append(ph)
            print("probe-timeslice: %s done" % name, flush=True)
    finally:
        for p in procs.values():
            p.stop()

    for role, _, _, slice_us in specs:
        if slice_us is None:
            continue
        lines = read_reports(os.path.join(a.out, "tsg-" + role))
        result["reports"][role] = {"lines": lines[:200], "summary": summarise_reports(lines, slice_us or None)}

    def ratio(x, y):
        return x / y if y else None

    by = {p["name"]: p for p in result["phases"]}
    ls_alone = by["ls alone"]["ls"]["p99Ms"]
    batch_alone = by["batch alone"]["batch"]["perSecond"]
    sliced = by["pair, driver default"]["batch"]["perSecond"]
    for p in result["phases"]:
        if "ls" in p:
            p["lsP99VsAlone"] = ratio(p["ls"]["p99Ms"], ls_alone)
            p["lsFirstSecondP99VsAlone"] = ratio(p["ls"]["firstSecondP99Ms"], ls_alone)
        if "batch" in p:
            p["batchVsAlone"] = ratio(p["batch"]["perSecond"], batch_alone)
            p["batchVsTimeSliced"] = ratio(p["batch"]["perSecond"], sliced)

    # The verdict, on the first batch slice with LS long.
    s0 = slices[0]
    key = by["pair, batch %d us, LS %d us" % (s0, a.ls_long)]
    rep = result["reports"]["batch-%d" % s0]["summary"]
    if rep["events"] == 0:
        verdict = ("inconclusive: the shim saw no channel-group allocation in batch (shim mapped: %s): the "
                   "CUDA driver's ioctls did not reach it" % result["processes"]["batch-%d" % s0]["shimMapped"])
    elif rep["setOK"] == 0:
        verdict = "inconclusive: the driver did not take batch's slice (%s)" % ", ".join(rep["statuses"][:3])
    elif key["lsP99VsAlone"] is None or key["batchVsTimeSliced"] is None:
        verdict = "inconclusive: LS or batch alone measured nothing"
    elif key["lsP99VsAlone"] >= NO_GO_RATIO:
        verdict = ("no-go: LS p99 %.2fx alone with batch at %d us and LS at %d us: the firmware ignores the "
                   "value (plan B, the launch gate)" % (key["lsP99VsAlone"], s0, a.ls_long))
    else:
        verdict = ("go: LS p99 %.2fx alone (first second %.2fx) with batch at %d us and LS at %d us; batch "
                   "%.0f%% of its time-sliced throughput" % (key["lsP99VsAlone"], key["lsFirstSecondP99VsAlone"],
                                                          s0, a.ls_long, 100 * key["batchVsTimeSliced"]))
    if a.fake:
        verdict = "FAKE RUN, no GPU, not a result: " + verdict
    result["verdict"] = verdict

    print()
    def show(fmt, v, scale=1):
        return fmt % (v * scale) if v is not None else "-"

    print("%-36s %9s %9s %9s %10s %7s %8s" % ("phase", "LS p50", "LS p99", "p99/alone", "batch/s", "/alone",
                                              "/sliced"))
    for p in result["phases"]:
        ls = p.get("ls", {})
        b = p.get("batch", {})
        print("%-36s %9s %9s %9s %10s %7s %8s" % (
            p["name"],
            show("%.2f ms", ls.get("p50Ms")), show("%.2f ms", ls.get("p99Ms")), show("%.2fx", p.get("lsP99VsAlone")),
            show("%.1f", b.get("perSecond")), show("%.0f%%", p.get("batchVsAlone"), 100),
            show("%.0f%%", p.get("batchVsTimeSliced"), 100)))
    print()
    for role, info in result["processes"].items():
        print("%-12s pid %-7s shim %-5s mapped %-5s slice %s" % (role, info["pid"], info["shim"], info["shimMapped"],
                                                                info["sliceUs"]))
    for role, rep in result["reports"].items():
        s = rep["summary"]
        print("report %-12s %d events, modes %s, driver %s, set OK %d, read back equal %d, read back %s, "
              "application's own sets %s" % (role, s["events"], s["modes"], s["driver"], s["setOK"],
                                              s["readBackEqual"], s["readBack"][:4], s["appSets"][:4]))
    print()
    print("verdict: " + verdict)
    with open(os.path.join(a.out, "probe-timeslice.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

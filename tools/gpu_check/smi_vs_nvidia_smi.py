#!/usr/bin/env python3
"""slipstream-smi against nvidia-smi on a lent GPU, while a gpu_quick run trains.

Starts `slipstream run --preset gpu_quick`, waits until slipstream-smi shows it running, then
reads the GPU rows both tools print (name, memory used, utilisation, power) back to back, a few
times, and checks they agree: the same name, memory within 5 % (or 256 MiB), power within 30 %,
utilisation within 35 points (each tool samples its own window). The run's own row must show
the run on cuda:0 with its device memory. The table, dmon and every reading go to
OUT/smi_vs_nvidia_smi.txt; the verdicts to stdout. Exit 0 when everything agrees.

  tools/gpu_check/smi_vs_nvidia_smi.py BUILD_BIN_DIR OUT_DIR [slipstream run args...]
"""
import csv
import io
import os
import signal
import subprocess
import sys
import tempfile
import time

FIELDS = "name,memory.used,utilization.gpu,power.draw"


def query(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(" ".join(cmd) + " failed: " + out.stderr.strip())
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out.stdout)) if row]


def number(text):
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def main():
    bindir, outdir, run_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    smi = os.path.join(bindir, "slipstream-smi")
    stats = tempfile.mkdtemp(prefix="smi-check-")
    env = dict(os.environ, SLIPSTREAM_STATS_DIR=stats)
    log = open(os.path.join(outdir, "smi_vs_nvidia_smi.txt"), "w")
    run = subprocess.Popen(
        [os.path.join(bindir, "slipstream"), "run", "--preset", "gpu_quick", "--set",
         "run.steps=100000", "--set", "run.epochs=1000", "--set", "run.log_every=200"] + run_args,
        env=env, stdout=log, stderr=subprocess.STDOUT)
    failures = []

    def verdict(ok, what):
        print(("PASS " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    try:
        deadline = time.time() + 180
        row = None
        rows = []
        while time.time() < deadline and row is None:
            time.sleep(1)
            # smi reads the records where the run publishes them: the run's environment.
            rows = query([smi, "--query-run=pid,state,device,step,device_memory",
                          "--format=csv,noheader,nounits"], env) if run.poll() is None else []
            for r in rows:
                if r[0] == str(run.pid) and r[1] == "running" and (number(r[3]) or 0) >= 20:
                    row = r
        verdict(row is not None, "slipstream-smi shows the run training (step >= 20)")
        if row is None:
            print("  the run (pid %d) %s; smi's last rows: %s; %s holds %s" % (
                run.pid, "is running" if run.poll() is None else "exited %s" % run.returncode,
                rows, stats, os.listdir(stats)))
            return 1
        verdict(row[2] == "cuda:0", "the run's device is cuda:0 (%s)" % row[2])
        verdict((number(row[4]) or 0) > 0, "the run's device memory is shown (%s MiB)" % row[4])
        for name, cmd in (("table", [smi]), ("dmon", [smi, "dmon", "-c", "2"])):
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            log.write("\n== slipstream-smi %s\n%s" % (name, out.stdout))
            verdict(out.returncode == 0, "slipstream-smi %s exits 0" % name)
        agree = {"name": 0, "memory": 0, "power": 0, "util": 0}
        samples = 5
        for _ in range(samples):
            ours = query([smi, "--query-gpu=" + FIELDS, "--format=csv,noheader,nounits"], env)
            theirs = query(["nvidia-smi", "--query-gpu=" + FIELDS, "--format=csv,noheader,nounits"])
            log.write("\nslipstream-smi %s\nnvidia-smi     %s\n" % (ours, theirs))
            if not ours or not theirs:
                verdict(False, "both tools print a GPU row (slipstream-smi %s, nvidia-smi %s)" %
                        (ours, theirs))
                return 1
            a, b = ours[0], theirs[0]
            agree["name"] += a[0] == b[0]
            m1, m2 = number(a[1]), number(b[1])
            agree["memory"] += m1 is not None and m2 is not None and \
                abs(m1 - m2) <= max(256, 0.05 * m2)
            u1, u2 = number(a[2]), number(b[2])
            agree["util"] += u1 is not None and u2 is not None and abs(u1 - u2) <= 35
            p1, p2 = number(a[3]), number(b[3])
            agree["power"] += p1 is not None and p2 is not None and abs(p1 - p2) <= 0.3 * p2
            time.sleep(1)
        for k, n in agree.items():
            # Readings are taken a moment apart: most samples must agree, not every one.
            verdict(n >= samples - 1, "%s agrees with nvidia-smi in %d of %d samples" % (k, n, samples))
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=120)
            except subprocess.TimeoutExpired:
                run.kill()
        log.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

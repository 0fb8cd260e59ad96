"""Run a command and report its peak anonymous memory (RssAnon, sampled every 5 ms from
/proc), not counting file-backed pages (memory maps of the corpus), with its wall time.

    python scripts/peak_memory.py -- python -m packtool pack c -L 4096 -o p -q
"""

from __future__ import annotations

import subprocess
import sys
import time


def rss_anon_kb(pid: int) -> int:
    """The process's anonymous resident memory and that of its children, in KiB."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def measure(cmd: list[str]) -> tuple[int, float, int]:
    """(peak anonymous KiB, seconds, exit code) of ``cmd``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, rss_anon_kb(proc.pid))
        time.sleep(0.005)
    return peak, time.perf_counter() - t0, proc.returncode


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    peak, seconds, rc = measure(args)
    print(f"peak anonymous memory {peak / 1024:,.1f} MiB, {seconds:.2f} s, exit {rc}")
    sys.exit(rc)

"""How much of this machine's wall time a busy process actually gets: run before timing anything.

    python docs/bench/machine_stalls.py [--seconds 8] [--threshold-ms 5]

A pure-Python loop does the same small piece of work (about 0.1 ms) over and over and records
every gap between two pieces longer than ``--threshold-ms``. On an idle machine there are next
to none; on a virtual machine whose host preempts or throttles its CPUs, the loop stops for
100-700 ms at a time. The guest does not see those stops as steal time: on an otherwise idle
guest they count as the process's own CPU time (``time.process_time``), so neither wall nor CPU
time of a run measures the code, only the median of many short repetitions does (the benches'
alternated ratios). Beside other work of the guest the loop also waits for a core: run it alone.

Printed: the wall time, the process's CPU time, the time lost in gaps and their share, the
number of gaps and the longest. A share above a few per cent makes every wall-clock target of
the issues (the main job's seconds, the suite's minutes) a reading of the machine.
"""

from __future__ import annotations

import argparse
import time


def stalls(seconds: float, threshold: float) -> tuple[float, float, list[float]]:
    """``(wall, cpu, gaps)``: the loop's wall and CPU seconds and every gap above ``threshold``."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    prev, end, gaps = wall0, wall0 + seconds, []
    while prev < end:
        total = 0
        for i in range(2000):
            total += i
        now = time.perf_counter()
        if now - prev > threshold:
            gaps.append(now - prev)
        prev = now
    return time.perf_counter() - wall0, time.process_time() - cpu0, gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threshold-ms", type=float, default=5.0)
    args = parser.parse_args()
    wall, cpu, gaps = stalls(args.seconds, args.threshold_ms / 1e3)
    lost = sum(gaps)
    print(
        f"wall {wall:.2f} s, CPU {cpu:.2f} s; {len(gaps)} gaps over {args.threshold_ms:g} ms lost {lost:.2f} s "
        f"({100 * lost / wall:.0f}% of the wall time), the longest {1e3 * max(gaps, default=0.0):.0f} ms"
    )


if __name__ == "__main__":
    main()

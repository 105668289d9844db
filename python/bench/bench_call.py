"""Added cost of a wrapped tool call inside a transaction versus calling the function directly.

    python python/bench/bench_call.py [--calls-per-tx 100] [--rounds 200]

Measures, with time.perf_counter_ns over many repetitions (best of 5 runs, per call):
  direct     the plain function;
  reversible the same function declared @tidegate.tool(effect="reversible", compensate=...)
             called inside an open transaction (begin/commit excluded; reported separately);
  gated      a gated tool (recorded and queued; the function runs at commit, excluded here);
  tx         begin + one reversible call + commit, per transaction (in-memory engine).
Measure the release wheel (`TIDEGATE_WHEEL_PROFILE=release TIDEGATE_PYTHON_MAIN=0 bash
python/run-tests.sh` installs it into .venv/ without running the tests); the test run installs a
dev build, which is slower per call.
Goals: issue 6 set <= 5 us of added cost per wrapped call; issue 31 sets <= 2 us, and <= 6 us
for begin + one call + commit.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import tidegate


def work(order_id: str, amount: int) -> dict:
    return {"order": order_id, "amount": amount}


def undo(result, order_id, **_):
    return None


def best(runs):
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls-per-tx", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    n, rounds = a.calls_per_tx, a.rounds

    tg = tidegate.open()
    rev = tidegate.tool(work, scope=lambda order_id, **_: f"retail:order:{order_id}", effect="reversible",
                        compensate=undo, name="work_rev")
    gated = tidegate.tool(work, scope=lambda order_id, **_: f"retail:order:{order_id}", effect="gated",
                          name="work_gated")

    def direct_run() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            for i in range(n):
                work("W1", i)
        return (time.perf_counter_ns() - t0) / (rounds * n)

    def wrapped_run(tool) -> float:
        total = 0
        for _ in range(rounds):
            tx = tg.begin("bench", may_touch=["retail:order:W1"])
            with tx._as_current():
                t0 = time.perf_counter_ns()
                for i in range(n):
                    tool("W1", i)
                total += time.perf_counter_ns() - t0
            tx.commit()
        return total / (rounds * n)

    def tx_run() -> float:
        m = rounds * 5
        t0 = time.perf_counter_ns()
        for i in range(m):
            with tg.transaction("bench", may_touch=["retail:order:W1"]):
                rev("W1", i)
        return (time.perf_counter_ns() - t0) / m

    wrapped_run(rev)  # warm up
    d = [direct_run() for _ in range(a.repeat)]
    r = [wrapped_run(rev) for _ in range(a.repeat)]
    g = [wrapped_run(gated) for _ in range(a.repeat)]
    t = [tx_run() for _ in range(a.repeat)]
    tg.check_integrity()
    print(f"python {platform.python_version()} on {platform.machine()}, {n} calls per transaction, "
          f"{rounds} transactions per run, best of {a.repeat} (median in brackets)")
    print(f"direct call                   {best(d) / 1000:8.3f} us  ({statistics.median(d) / 1000:.3f})")
    print(f"reversible tool in a tx       {best(r) / 1000:8.3f} us  ({statistics.median(r) / 1000:.3f})")
    print(f"gated tool in a tx (queued)   {best(g) / 1000:8.3f} us  ({statistics.median(g) / 1000:.3f})")
    print(f"added per reversible call     {(best(r) - best(d)) / 1000:8.3f} us  (goal <= 2 us)")
    print(f"added per gated call          {(best(g) - best(d)) / 1000:8.3f} us")
    print(f"transaction: begin+call+commit {best(t) / 1000:7.3f} us  ({statistics.median(t) / 1000:.3f}; goal <= 6 us)")


if __name__ == "__main__":
    main()

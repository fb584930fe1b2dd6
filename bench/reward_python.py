#!/usr/bin/env python3
"""Benchmark of the swelake_reward wheel from Python, against the reference's Python reward, on
the same cases in the same run (what a verl or TRL reward loop pays per answer).

Sides, each over every case of the corpus (repeated --repeat times):
  reference      the SWE-RL reward in Python: `swerl.core.reward` of a facebookresearch/swe-rl
                 checkout when --reference SRC names its src/ directory, else bench/reward_baseline.py
                 (the same algorithm with python3's difflib and the unidiff package), one thread
  per call       swelake_reward.calculate_search_replace_reward / calculate_reward_unidiff,
                 one call per case, one thread
  score_cases/1  the batch call on 1 thread
  score_cases/N  the batch call on --threads threads (GIL released)
Every side's values are checked against the corpus's expected values (the reference's).

Usage (in a venv with the wheel, unidiff installed; tests/it/python.rs makes one):
  python bench/reward_python.py [--cases tests/data/parity/reward_cases.jsonl.gz]
                                [--repeat 3] [--threads 2] [--reference SWE_RL/src]
"""
import argparse
import gzip
import json
import os
import sys
import time

import swelake_reward as sr

HERE = os.path.dirname(os.path.abspath(__file__))


def reference_scorer(src):
    if src:
        sys.path.insert(0, src)
        from swerl.core.reward import calculate_reward_unidiff, calculate_search_replace_reward

        def score(c):
            if c["kind"] == "search_replace":
                return calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[0]
            return calculate_reward_unidiff(c["oracle_patches"], c["pred_patches"])[0]

        return "swerl.core.reward (" + src + ")", score
    sys.path.insert(0, HERE)
    import reward_baseline

    return "bench/reward_baseline.py", reward_baseline.score


def per_call(c):
    if c["kind"] == "search_replace":
        return sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[0]
    return sr.calculate_reward_unidiff(c["oracle_patches"], c["pred_patches"])[0]


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=os.path.join(HERE, "..", "tests", "data", "parity", "reward_cases.jsonl.gz"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference", default=None, help="src/ of a facebookresearch/swe-rl checkout")
    a = ap.parse_args()
    opener = gzip.open if a.cases.endswith(".gz") else open
    with opener(a.cases, "rt", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f if line.strip()]
    cases = corpus * a.repeat
    name, ref = reference_scorer(a.reference)

    sides = []
    values, dt = timed(lambda: [ref(c) for c in cases])
    sides.append((f"reference: {name}, 1 thread", values, dt))
    values, dt = timed(lambda: [per_call(c) for c in cases])
    sides.append(("swelake_reward, one call per case, 1 thread", values, dt))
    values, dt = timed(lambda: sr.score_cases(cases, num_threads=1))
    sides.append(("swelake_reward.score_cases, 1 thread", values, dt))
    values, dt = timed(lambda: sr.score_cases(cases, num_threads=a.threads))
    sides.append((f"swelake_reward.score_cases, {a.threads} threads", values, dt))

    base = sides[0][2]
    print(f"{len(cases)} cases ({len(corpus)} x {a.repeat}) from {a.cases}")
    print(f"{'side':<55} {'cases/s':>10} {'vs reference':>13} {'off expected':>13}")
    for label, values, dt in sides:
        off = sum(1 for v, c in zip(values, cases) if abs(v - c["expected"]) > 1e-9)
        print(f"{label:<55} {len(cases) / dt:>10.1f} {base / dt:>12.1f}x {off:>13}")
        if off:
            sys.exit(f"{label}: {off} values differ from the reference's")


if __name__ == "__main__":
    main()

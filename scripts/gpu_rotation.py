#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The rotation of scripts/gpu-check.sh: which GPU test cases and speed rows a GPU run takes when
not all of them fit its few minutes. The state file (docs/gpu-runs/rotation.tsv, committed after
each GPU run) has one line per case: name, when it last ran (UTC), its result and seconds. A run
takes the cases that ran longest ago (never-run first), as many as fit the budget by their last
duration (an unknown one counts as --guess seconds).

  gpu_rotation.py pick   --state F --budget S [--guess S] [--limit N] < CANDIDATES
      CANDIDATES: one case name a line. Prints the chosen names, oldest first.
  gpu_rotation.py update --state F --out F2 --when ISO < RESULTS
      RESULTS: lines "name<TAB>result<TAB>seconds". Writes the updated state to F2 (F unchanged
      where F2 differs).
  gpu_rotation.py gtest  < GTEST_OUTPUT
      RESULTS lines from a gtest run's output ([ OK ], [ FAILED ], [ SKIPPED ] lines; a case
      that started and never ended, cut off by the tier's time limit, is "cut" and counts as
      --cut seconds, the time it had at least, so that the next pick plans for it).
  gpu_rotation.py list < GTEST_LIST_TESTS
      "Suite.Case" names from --gtest_list_tests output.
Standard library only: it runs on the GPU machine's python3 and on the CI machine's."""
import argparse
import re
import sys

HEADER = "# case\tlast run (UTC)\tresult\tseconds\n"


def read_state(path):
    state = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4:
                    state[parts[0]] = (parts[1], parts[2], float(parts[3]))
    except FileNotFoundError:
        pass
    return state


def pick(args):
    state = read_state(args.state)
    names = [n.strip() for n in sys.stdin if n.strip()]
    # Never run first (""), then oldest; names break ties so the order is stable.
    order = sorted(names, key=lambda n: (state.get(n, ("",))[0], n))
    left, chosen = args.budget, []
    for n in order:
        cost = state[n][2] if n in state else args.guess
        if cost > left:
            continue  # too long for what is left: a shorter one may still fit
        chosen.append(n)
        left -= cost
        if args.limit and len(chosen) >= args.limit:
            break
    print("\n".join(chosen))


def update(args):
    state = read_state(args.state)
    for line in sys.stdin:
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 3:
            state[parts[0]] = (args.when, parts[1], float(parts[2]))
    with open(args.out, "w") as f:
        f.write(HEADER)
        for n in sorted(state):
            when, result, secs = state[n]
            f.write(f"{n}\t{when}\t{result}\t{secs:.1f}\n")


def list_tests(_args):
    suite = ""
    for line in sys.stdin:
        if not line.strip() or line.startswith("Running main"):
            continue
        name = line.split("#")[0].rstrip()
        if not line.startswith(" "):
            suite = name
        else:
            print(suite + name.strip())


def gtest(args):
    started = []
    done = set()
    for line in sys.stdin:
        m = re.match(r"\[ RUN      \] (\S+)", line)
        if m:
            started.append(m[1])
            continue
        m = re.match(r"\[\s+(OK|FAILED|SKIPPED)\s+\] (\S+) \((\d+) ms\)", line)
        if m and m[2] not in done:
            done.add(m[2])
            result = {"OK": "pass", "FAILED": "FAIL", "SKIPPED": "skip"}[m[1]]
            print(f"{m[2]}\t{result}\t{int(m[3]) / 1000:.1f}")
    for n in started:
        if n not in done:
            print(f"{n}\tcut\t{args.cut:.1f}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pick")
    a.add_argument("--state", required=True)
    a.add_argument("--budget", type=float, required=True)
    a.add_argument("--guess", type=float, default=5.0)
    a.add_argument("--limit", type=int, default=0)
    a = sub.add_parser("update")
    a.add_argument("--state", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--when", required=True)
    a = sub.add_parser("gtest")
    a.add_argument("--cut", type=float, default=60.0)
    sub.add_parser("list")
    args = p.parse_args()
    {"pick": pick, "update": update, "gtest": gtest, "list": list_tests}[args.cmd](args)


if __name__ == "__main__":
    main()

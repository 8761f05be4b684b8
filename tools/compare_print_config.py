"""Compares `seedq train --print-config` of two seedq checkouts for every env
of the learning suite and both agents, and prints every value that differs.

    python tools/compare_print_config.py BEFORE_TREE AFTER_TREE

Each tree is a checkout (a `git worktree add DIR COMMIT` of the commit to
compare); its seedq runs with PYTHONPATH pointing into it, from the python
running this script. A field the mapping below moved is compared under its
new name; a field only the older has is a difference, one only the newer
has is listed as added (it did not exist before). Exit status 1 when any
value of a field that existed differs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

from seedq.bench.references import SUITE
from seedq.config import dotted_fields

# The learning suite's envs (vector envs, Discrete and Box; MinAtar;
# dm_control; Atari pixels), as this checkout's suite names them.
ENVS = tuple(SUITE)
AGENTS = ("vtrace", "r2d2")
# Old dotted field name -> new one, for fields that moved or were renamed.
MOVED: dict[str, str] = {}
# A fixed run directory: the default one holds a timestamp and a pid.
LOGDIR = "print-config-run"


def print_config(tree: str, env: str, agent: str) -> dict | str:
    """The flattened config the tree's `seedq train` prints, or its error line."""
    env_vars = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-m", "seedq", "train", "--env", env, "--agent", agent, "--logdir", LOGDIR,
         "--print-config"],
        capture_output=True, text=True, env=env_vars, cwd=os.path.abspath(tree), timeout=300,
    )
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        return f"exit {done.returncode}: {lines[-1] if lines else ''}"
    return dotted_fields(json.loads(done.stdout))


def differences(before: dict | str, after: dict | str) -> tuple[list[str], list[str]]:
    """(one line per field that existed and differs, "name: before -> after";
    one per field added since, "name = value")."""
    if isinstance(before, str) or isinstance(after, str):
        return ([] if before == after else [f"(whole run): {before!r} -> {after!r}"]), []
    before = {MOVED.get(k, k): v for k, v in before.items()}
    changed = [f"{name}: {before[name]!r} -> {after.get(name, '(no such field)')!r}"
               for name in sorted(before) if name not in after or before[name] != after[name]]
    added = [f"{name} = {after[name]!r}" for name in sorted(set(after) - set(before))]
    return changed, added


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="checkout of the older seedq")
    parser.add_argument("after", help="checkout of the newer seedq")
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated env ids")
    parser.add_argument("--jobs", type=int, default=2, help="seedq processes at a time")
    args = parser.parse_args()
    cases = [(env, agent) for env in args.envs.split(",") for agent in AGENTS]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        before = pool.map(lambda case: print_config(args.before, *case), cases)
        after = pool.map(lambda case: print_config(args.after, *case), cases)
        results = list(zip(cases, before, after))
    differing = 0
    for (env, agent), old, new in results:
        changed, added = differences(old, new)
        differing += bool(changed)
        fields = "" if isinstance(new, str) else f", {len(new)} fields"
        print(f"{env} --agent {agent}: {'differs' if changed else 'same'}{fields}"
              + (f" ({len(added)} added: {', '.join(added)})" if added else ""))
        for line in changed:
            print(f"    {line}")
    print(f"{differing} of {len(results)} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())

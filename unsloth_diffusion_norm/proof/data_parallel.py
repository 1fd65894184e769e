"""Data-parallel runs on real processes: the plugin, Unsloth's DiffusionTrainer and the tiny model,
launched with torchrun or `accelerate launch` (Gloo on CPU: the Trainer / accelerate code path that
NCCL takes on GPUs).

Every rank trains and records its windows (clean batches, RNG state, gradients, parameters). After
training the ranks exchange what they saw, and each rank judges its own gradients and parameters
against the oracle over all ranks' data with the same masks (`ranks`). One launch runs many cases,
because a launch (process start plus `import unsloth`) costs far more than a case.

    python -m unsloth_diffusion_norm.proof.data_parallel [--ranks 2 3] [--nodes N] [--json FILE]   # prints the table

--nodes 2: each launch as two torchrun agents on 127.0.0.1 (--nnodes 2, static rendezvous), one per node,
so LOCAL_RANK differs from RANK as on a multi-node job (--ranks must then be multiples of N).
"""

import argparse
import json
import sys

from . import tables
from .dp_cases import CASES
from .ranks import launch

# The main table's columns: one row per case.
HEADER = [
    "case",
    "ranks",
    "masked tokens per micro-batch, by rank (windows split by /)",
    "loss",
    "reference",
    "max grad error per rank",
    "max param error",
    "worst / tol",
    "count collectives per window",
    "within tolerance",
]


def render(results):
    """One row per case: counts per rank, loss vs reference, worst errors over ranks and windows; then the
    resumed, the upstream-compared and the evaluated cases, each in a table of its own where there are any."""
    lines = tables.markdown(HEADER, [_row(name, rows) for name, rows in by_case(results).items()])
    for extra in (_resumed(results), _compared(results), _evaluated(results)):
        if extra:
            lines += ["", *extra]
    return "\n".join(lines)


def by_case(results):
    """{case: its ranks' results, by rank}, in the order the cases first appear."""
    found = {}
    for r in sorted(results, key=lambda r: r["rank"]):  # (stable: the cases keep their order)
        found.setdefault(r["case"], []).append(r)
    return found


def _row(name, rows):
    """A case's row of the main table, over its ranks' results (by rank)."""
    first = rows[0]
    counts = " / ".join(" ".join(f"r{k}:{c}" for k, c in enumerate(window)) for window in first["counts"])
    loss = " / ".join(f"{x:.6f}" for x in first["logged_loss"])
    reference = " / ".join(f"{x:.6f}" for x in first["reference_loss"])
    grads = " ".join(f"{r['grad_error']:.1e}" for r in rows)
    params = max(r["param_error"] for r in rows)
    worst = max(r["worst"] for r in rows)
    collectives = sorted({tuple(r["collectives"]) for r in rows})
    ok = all(r["ok"] for r in rows)
    return [
        name,
        first["ranks"],
        counts,
        loss,
        reference,
        grads,
        f"{params:.1e}",
        f"{worst:.3g}",
        " ".join(map(str, collectives[0])) if len(collectives) == 1 else collectives,
        "yes" if ok else "NO",
    ]


def _resumed(results):
    """The resume cases: each rank's difference to the uninterrupted run (no lines: none resumed)."""
    resumed = [r for r in results if r.get("resume_difference") is not None]
    if not resumed:
        return []
    return tables.markdown(
        ["case", "rank", "max abs parameter difference, resumed vs uninterrupted run"],
        [[r["case"], r["rank"], f"{r['resume_difference']:.3g}"] for r in resumed],
    )


def _compared(results):
    """A natively fixed release: the plugin's default against Unsloth's own path, per case over ranks."""
    compared = {}
    for r in results:
        if r.get("upstream_difference") is not None:
            compared[r["case"]] = max(compared.get(r["case"], 0.0), r["upstream_difference"])
    if not compared:
        return []
    return tables.markdown(
        [
            "case (default settings)",
            "max abs parameter difference to Unsloth's own run (unpatched), over ranks",
        ],
        [[case, f"{difference:.3g}"] for case, difference in compared.items()],
    )


def _evaluated(results):
    """The evaluated cases: rank 0's evaluation loss, the oracle's and the unpatched release's."""
    evaluated = [r for r in results if r.get("eval_loss") is not None and r["rank"] == 0]
    if not evaluated:
        return []
    return tables.markdown(
        ["case", "eval loss (rank 0)", "oracle", "unpatched release"],
        [
            [r["case"], f"{r['eval_loss']:.6f}", f"{r['eval_reference']:.6f}", f"{r['eval_unpatched']:.6f}"]
            for r in evaluated
        ],
    )


def plan(ranks):
    """The cases of one launch; those that rewrite transformers.Trainer for good go last. Block diffusion only where
    the plugin trains it (a release it patches or fixes the rest of)."""
    from ..detect import unsloth_version
    from ..registry import NATIVE, PATCHED
    from .fixtures import expected_mode

    trains_block = unsloth_version() is not None and expected_mode() in (PATCHED, NATIVE)
    names = [name for name, case in CASES.items() if case.ranks == ranks and (trains_block or case.block() is None)]
    return sorted(names, key=lambda name: CASES[name].unsloth_ga_trainer)


# One launch per size; both launchers users reach for are exercised.
PLAN = {2: ("torchrun", plan(2)), 3: ("accelerate", plan(3))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=sorted(PLAN), help="launch sizes to run")
    parser.add_argument(
        "--nodes", type=int, default=1, help="torchrun agents (nodes) per launch, on this machine (default 1)"
    )
    parser.add_argument("--json", help="write every rank's results here")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error(f"--nodes must be at least 1, not {args.nodes}")
    if any(ranks % args.nodes for ranks in args.ranks):
        parser.error(f"--ranks must be multiples of --nodes {args.nodes}")
    results = []
    for ranks in args.ranks:
        launcher, names = PLAN[ranks]
        if args.nodes > 1:
            launcher = "torchrun"
        results += launch(ranks, names, launcher, nodes=args.nodes)
    from ..detect import unsloth_version
    from . import oracle

    command = {"torchrun": "torchrun", "accelerate": "accelerate launch"}
    launched = ", ".join(f"{ranks} ranks with {command[PLAN[ranks][0]]}" for ranks in args.ranks)
    if args.nodes > 1:
        launched = ", ".join(
            f"{ranks} ranks as {args.nodes} nodes x {ranks // args.nodes} (torchrun agents, static rendezvous "
            "at 127.0.0.1)"
            for ranks in args.ranks
        )
    print(f"Unsloth {unsloth_version()}; {launched}; Gloo on CPU; {oracle.describe_tolerance()}\n")
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if succeeded(results) else 1


def succeeded(results):
    """Every patched case within tolerance on every rank; every unpatched control misses."""
    for r in results:
        if CASES[r["case"]].patched != r["ok"]:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())

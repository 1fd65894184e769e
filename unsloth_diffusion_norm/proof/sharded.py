"""Sharded data parallel on real processes: FSDP2 through accelerate, DeepSpeed ZeRO-2 and ZeRO-3, each
launched the way users launch it and judged per rank by the oracle (the runs of `data_parallel`).

    python -m unsloth_diffusion_norm.proof.sharded [--engines fsdp2 zero2 zero3] [--json FILE]

| engine | launched with | gradients | judged on every rank |
|---|---|---|---|
| fsdp2 | `accelerate launch --config_file` (FSDP, version 2) | reduce-scattered DTensor shards | loss, every whole gradient (`full_tensor()`), every parameter after the step |
| zero2 | `torchrun`, `deepspeed=` in the training arguments | partitioned; the engine steps inside `backward` | loss, every whole gradient (`safe_get_full_grad` as the engine's step begins), every parameter after it |
| zero3 | `accelerate launch --config_file` (DeepSpeed, a ZeRO-3 JSON) | partitioned, parameters too | the same, parameters gathered (`GatheredParameters`) |

The engines, and the CPU-only pieces that enable them in the proof harness, are in `engines`.
"""

import argparse
import json
import sys

from . import data_parallel, ranks, tables
from .dp_cases import SHARDED as CASES
from .engines import ENGINES, deepspeed_available


def launch(engine_name, names=None, timeout=900):
    return ranks.launch(2, names or list(CASES), engine=ENGINES[engine_name], timeout=timeout)


def summary(results):
    """Case x engine: worst error / tolerance on each rank (loss, every whole gradient, every parameter)."""
    engines = [name for name in ENGINES if any(r.get("engine") == name for r in results)]
    cell = {}
    for r in results:
        cell.setdefault((r["case"], r["engine"]), {})[r["rank"]] = r["worst"]
    rows = [
        [case] + [" ".join(f"r{k} {v:.3g}" for k, v in sorted(cell.get((case, e), {}).items())) or "-" for e in engines]
        for case in CASES
        if any((case, e) in cell for e in engines)
    ]
    return "\n".join(tables.markdown(["case", *engines], rows))


def render(results):
    """The summary, then per engine what it did to the model and data_parallel's rows."""
    out = [
        "worst error / tolerance per rank (<= 1 matches the oracle; the unpatched control must miss):",
        "",
        summary(results),
        "",
    ]
    for name in ENGINES:
        rows = [r for r in results if r.get("engine") == name]
        if not rows:
            continue
        layouts = sorted({r["layout"] for r in rows})
        out += [f"{name}:", *[f"  {text}" for text in layouts], "", data_parallel.render(rows), ""]
    return "\n".join(out)


def succeeded(results):
    return all(CASES[r["case"]].patched == r["ok"] and r["engine_on"] for r in results)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--json", help="write every rank's results here")
    args = parser.parse_args(argv)
    from ..detect import unsloth_version
    from . import oracle

    results = []
    for name in args.engines:
        if ENGINES[name].uses_deepspeed and not deepspeed_available():
            print(f"{name}: skipped, DeepSpeed is not installed (pip install --no-build-isolation deepspeed==0.19.8)")
            continue
        results += launch(name)
    print(f"Unsloth {unsloth_version()}; 2 ranks per engine; Gloo on CPU; {oracle.describe_tolerance()}\n")
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if results and succeeded(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Noise you can trust, before and after: python scripts/noise_demo.py

1. Resume: trains 4 optimizer steps with a checkpoint at step 2, resumes a fresh trainer from it, and
   prints the largest parameter difference to the uninterrupted run - at the default settings, with
   diffusion_noise="global" and "per_sample", and for Unsloth's own draws (the plugin unpatched).
2. Data parallel: launches 2 ranks (torchrun, Gloo on CPU) and prints the noise level p_mask each rank's
   first micro-batch got - with the global RNG (every rank seeded alike) and with "per_sample".

Both tables go to records/noise-demo.json (docs/noise.md renders them from there).
"""

import contextlib
import io
import os
import sys

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")  # CPU-only host: needed by `import unsloth`
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import unsloth_diffusion_norm  # noqa: E402
from unsloth_diffusion_norm.proof import fixtures, tables  # noqa: E402

fixtures.import_unsloth()  # the plugin first, as users do
from unsloth_diffusion_norm.proof import data_parallel, experiment  # noqa: E402
from unsloth_diffusion_norm.proof.fixtures import Example  # noqa: E402
from unsloth_diffusion_norm.tools import records  # noqa: E402

RESUMED = "max abs parameter difference, resumed at step 2 vs uninterrupted, after step 4"
EXAMPLES = [Example([10 + i, 11, 12], list(range(20, 29))) for i in range(8)]  # GA 2: 4 steps


def main():
    status = unsloth_diffusion_norm.apply()
    print(f"Unsloth {status.unsloth_version}, plugin mode {status.mode}\n")
    rows, resumed = [], {}
    for key, label, flag, context in (
        ("default", "default (None)", {}, contextlib.nullcontext),
        ("global", '"global"', {"diffusion_noise": "global"}, contextlib.nullcontext),
        ("per_sample", '"per_sample"', {"diffusion_noise": "per_sample"}, contextlib.nullcontext),
        ("unpatched", "Unsloth's own draws (plugin unpatched)", {}, unsloth_diffusion_norm.unpatched),
    ):
        with contextlib.redirect_stdout(io.StringIO()), context():
            runs = experiment.train_and_resume(EXAMPLES, at=2, seed=0, **flag)
        resumed[key] = float(runs.difference)
        rows.append([label, f"{runs.difference:.3g}"])
    resume_table = "\n".join(tables.markdown(["noise", RESUMED], rows))
    print(resume_table)

    results = data_parallel.launch(2, ["unequal-counts", "per-sample-noise"])
    rows, levels = [], {}
    for key, case, label in (
        ("global", "unequal-counts", "default: global RNG"),
        ("per_sample", "per-sample-noise", '"per_sample"'),
    ):
        ranks = sorted((r for r in results if r["case"] == case), key=lambda r: r["rank"])
        levels[key] = [float(r["noise_levels"][0][0][0]) for r in ranks]
        rows.append([label, *(f"{level:.6f}" for level in levels[key])])
    header = ["noise (2 ranks)"] + [f"p_mask of rank {r}'s first micro-batch" for r in (0, 1)]
    ranks_table = "\n".join(tables.markdown(header, rows))
    print("\n" + ranks_table)
    records.write(
        "noise-demo",
        "python scripts/noise_demo.py",
        {"mode": status.mode, "resumed_difference": resumed, "first_p_mask": levels},
        tables={"resume": resume_table, "ranks": ranks_table},
    )
    print("\nrecords/noise-demo.json written")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Noise you can trust, before and after: python scripts/noise_demo.py

1. Resume: trains 4 optimizer steps with a checkpoint at step 2, resumes a fresh trainer from it, and
   prints the largest parameter difference to the uninterrupted run - at the default settings, with
   diffusion_noise="global" and "per_sample", and for Unsloth's own draws (the plugin unpatched).
2. Data parallel: launches 2 ranks (torchrun, Gloo on CPU) and prints the noise level p_mask each rank's
   first micro-batch got - with the global RNG (every rank seeded alike) and with "per_sample".
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

RESUMED = "max abs parameter difference, resumed at step 2 vs uninterrupted, after step 4"
EXAMPLES = [Example([10 + i, 11, 12], list(range(20, 29))) for i in range(8)]  # GA 2: 4 steps


def main():
    status = unsloth_diffusion_norm.apply()
    print(f"Unsloth {status.unsloth_version}, plugin mode {status.mode}\n")
    rows = []
    for label, flag, context in (
        ("default (None)", {}, contextlib.nullcontext),
        ('"global"', {"diffusion_noise": "global"}, contextlib.nullcontext),
        ('"per_sample"', {"diffusion_noise": "per_sample"}, contextlib.nullcontext),
        ("Unsloth's own draws (plugin unpatched)", {}, unsloth_diffusion_norm.unpatched),
    ):
        with contextlib.redirect_stdout(io.StringIO()), context():
            runs = experiment.train_and_resume(EXAMPLES, at=2, seed=0, **flag)
        rows.append([label, f"{runs.difference:.3g}"])
    print("\n".join(tables.markdown(["noise", RESUMED], rows)))

    results = data_parallel.launch(2, ["unequal-counts", "per-sample-noise"])
    rows = []
    for case, label in (("unequal-counts", "default: global RNG"), ("per-sample-noise", '"per_sample"')):
        ranks = sorted((r for r in results if r["case"] == case), key=lambda r: r["rank"])
        levels = [f"{r['noise_levels'][0][0][0]:.6f}" for r in ranks]
        rows.append([label, *levels])
    header = ["noise (2 ranks)"] + [f"p_mask of rank {r}'s first micro-batch" for r in (0, 1)]
    print("\n" + "\n".join(tables.markdown(header, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stand-alone reproduction: python scripts/reproduce.py [--seed N]

Trains one optimizer step (batch 1, gradient accumulation 2, two equal-length answers) of a tiny
Nemotron-Labs-Diffusion-shaped model through Unsloth's real DiffusionTrainer, unpatched and with the
plugin, and prints both against the oracle (one forward over the window, sum(CE/p_mask)/total masked).
"""

import argparse
import contextlib
import io
import os
import sys

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")  # CPU-only host
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import unsloth_diffusion_norm  # noqa: E402 - before unsloth, as a user's script does

with contextlib.redirect_stdout(io.StringIO()):
    import unsloth  # noqa: E402,F401

from unsloth_diffusion_norm import reproduce  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0)
seed = parser.parse_args().seed
with contextlib.redirect_stdout(io.StringIO()):
    columns = reproduce.table(seed)
print(unsloth_diffusion_norm.status())
print()
print(reproduce.render(columns))
sys.exit(0 if reproduce.succeeded(columns) else 1)

"""Stand-alone reproduction: python scripts/reproduce.py [--seed N]

Trains one optimizer step (batch 1, gradient accumulation 2, two equal-length answers) of a tiny
Nemotron-Labs-Diffusion-shaped model through Unsloth's real DiffusionTrainer, unpatched and with the
plugin, and prints both against the oracle (one forward over the window, sum(CE/p_mask)/total masked).
Same as `unsloth-diffusion-norm reproduce`, for a checkout without the console script installed.
"""

import sys

from unsloth_diffusion_norm.tools import cli

sys.exit(cli.main(["reproduce", *sys.argv[1:]]))

"""Stand-alone data-parallel reproduction: python scripts/ddp_reproduce.py [--ranks 2 3] [--nodes N] [--json FILE]

Launches real processes (2 ranks with torchrun, 3 ranks with `accelerate launch`; Gloo on CPU; with
`--ranks 2 --nodes 2`: two torchrun agents as two nodes, one process each, RANK 0/1 and LOCAL_RANK 0) that
train the tiny model through Unsloth's DiffusionTrainer with the plugin, and prints one row per case:
realized masked tokens per rank, logged loss vs the oracle over all ranks' data with the same masks,
the largest gradient error on each rank, the parameter error after the SGD step, and how many count
collectives each optimizer step issued. Exit 0 when every case matches and the unpatched control misses.
"""

import sys

from unsloth_diffusion_norm.proof import data_parallel

sys.exit(data_parallel.main(sys.argv[1:]))

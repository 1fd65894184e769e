"""Stand-alone sharded reproduction: python scripts/sharded_reproduce.py [--engines fsdp2 zero2 zero3] [--json FILE]

Launches 2 real processes per engine, the way users launch each (FSDP2: `accelerate launch --config_file`;
DeepSpeed ZeRO-2: torchrun with `deepspeed=` in the training arguments; ZeRO-3: `accelerate launch
--config_file` with a DeepSpeed JSON; Gloo on CPU), trains the tiny model through Unsloth's DiffusionTrainer
with the plugin, and prints per engine what the engine did to the model and one row per case: realized
masked tokens per rank, logged loss vs the oracle over all ranks' data with the same masks, the largest
whole-gradient error on each rank, the parameter error after the SGD step, and how many count collectives
each optimizer step issued. Exit 0 when every case matches on every rank, every engine really sharded, and
the unpatched control misses. DeepSpeed engines need the `sharded` extra (requirements-sharded.txt).
"""

import sys

from unsloth_diffusion_norm.proof import sharded

sys.exit(sharded.main(sys.argv[1:]))

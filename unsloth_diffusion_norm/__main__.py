"""`python -m unsloth_diffusion_norm` is the command line, `unsloth-diffusion-norm`."""

import sys

from .tools.cli import main

sys.exit(main())

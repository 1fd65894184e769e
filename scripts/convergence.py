"""Does the fix change the model? python scripts/convergence.py [--quick] [--part 1|2] [--arms A,B] [--native FILE]
[--gpu] [--json [FILE]] [--plot FILE]

See unsloth_diffusion_norm/tools/convergence/ and docs/convergence.md; `make convergence` runs the documented study.
"""

import os
import sys

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")  # CPU-only host: needed by `import unsloth`
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import unsloth_diffusion_norm  # noqa: E402,F401 - before Unsloth, as users do
from unsloth_diffusion_norm.tools import convergence  # noqa: E402

if __name__ == "__main__":
    sys.exit(convergence.main())

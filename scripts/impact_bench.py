"""Time `impact` on 100,000+ examples (the docstring dataset, 25 copies; batch 1 x accumulation 8 x 2 ranks):
prints the seconds of each phase and the total, and writes them to records/impact-bench.json (docs/impact.md
renders them from there). A benchmark, not a test: `python scripts/impact_bench.py`."""

import tempfile
import time

from unsloth_diffusion_norm.tools import docstring_data, impact, records

with tempfile.TemporaryDirectory(prefix="udn-impact-bench-") as folder:
    data, tokenizer, distinct = docstring_data.write(folder, copies=25)
    settings = impact.Settings(per_device_train_batch_size=1, gradient_accumulation_steps=8, world_size=2)
    marks = [(time.perf_counter(), "reading the rows")]
    found = impact.run(data, tokenizer, settings, log=lambda line: marks.append((time.perf_counter(), line)))
    marks.append((time.perf_counter(), "end"))
    print(f"{found.data['rows']} rows ({distinct} distinct), {found.steps} optimizer steps, {found.draws} drawn")
    phases = [(phase, end - start) for (start, phase), (end, _) in zip(marks, marks[1:])]
    for phase, seconds in phases:
        print(f"  {seconds:6.1f} s  {phase}")
    total = marks[-1][0] - marks[0][0]
    print(f"total {total:.1f} s; share moved {100 * found.share:.2f} %")
    records.write(
        "impact-bench",
        "python scripts/impact_bench.py",
        {
            "rows": found.data["rows"],
            "distinct": distinct,
            "steps": found.steps,
            "draws": found.draws,
            "seconds": round(total, 1),
            "phases": [{"phase": phase, "seconds": round(seconds, 1)} for phase, seconds in phases],
            "share": found.share,
        },
        covers={
            "impact": ["unsloth_diffusion_norm/tools/impact/*.py", "unsloth_diffusion_norm/tools/docstring_data.py"]
        },
    )

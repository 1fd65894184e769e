"""`unsloth-diffusion-norm bench` runs end to end and reports every figure (timings are not asserted:
they belong to the benchmark, not to the tests)."""

import pytest

from unsloth_diffusion_norm import bench


def test_bench_reports_every_figure(plugin, tmp_path):
    found = bench.run(blocks=1, steps=1, models=("tiny",), plot=str(tmp_path / "bench.png"), ddp=False,
                      log=lambda line: None)
    variants = [label for label, _, _ in bench.variants(found["mode"])]
    assert [(r["ga"], r["variant"]) for r in found["rows"]] == [
        (ga, v) for ga in bench.GRADIENT_ACCUMULATION for v in variants
    ]
    assert all(r["step_ms"] > 0 and r["peak_mib"] > 0 and r["samples"] == 1 for r in found["rows"])
    assert found["import_torch"] is False and found["import_unsloth"] is False
    table = bench.render(found)
    assert table.count("| tiny |") == len(found["rows"]) and "import unsloth_diffusion_norm" in table
    pytest.importorskip("matplotlib")
    assert found["plot"] and (tmp_path / "bench.png").stat().st_size > 0

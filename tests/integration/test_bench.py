"""`unsloth-diffusion-norm bench` runs end to end and reports every figure (timings are not asserted:
they belong to the benchmark, not to the tests)."""

import pytest

from unsloth_diffusion_norm.tools import bench


@pytest.mark.once  # our own tooling, the same on every release
def test_bench_reports_every_figure_and_writes_its_record(plugin, tmp_path, monkeypatch):
    import json

    from unsloth_diffusion_norm.tools import records

    monkeypatch.setattr(records, "STORE", str(tmp_path))  # the record goes here, not into the checkout's store
    # GA 1 (what peak memory is compared with) and 8; the quick bench, launched by test_cli.py, runs every GA.
    plan = bench.Plan(blocks=1, steps=1, models=("tiny",), gas=(1, 8), plot=str(tmp_path / "bench.png"), ddp=False)
    found = bench.run(plan, log=lambda line: None)
    record = json.loads((tmp_path / "bench-cpu.json").read_text())
    for field in ("command", "commit", "date", "machine", "versions", "covers", "figures", "tables"):
        assert record[field], field
    assert record["command"] == "unsloth-diffusion-norm bench --models tiny --blocks 1 --steps 1 --no-ddp (GA 1, 8)"
    assert record["machine"].startswith("CPU") and record["covers"] == records.CORE
    plugin_row = next(r for r in found["rows"] if r["ga"] == 8 and r["variant"] == "plugin")
    assert record["figures"]["models"]["tiny"]["ga8"]["plugin"]["step_ms"] == plugin_row["step_ms"]
    assert record["figures"]["import_ms"] == found["import_ms"] and record["figures"]["seconds"] > 0
    assert record["tables"]["steps"].count("| tiny |") == len(found["rows"])
    assert found["record"].endswith("bench-cpu.json") and f"record: {found['record']}" in bench.render(found)
    assert not bench.QUICK.record and not bench.GPU.record  # a smoke run or a GPU part writes none
    variants = [label for label, _, _ in bench.variants(found["mode"])]
    assert [(r["ga"], r["variant"]) for r in found["rows"]] == [(ga, v) for ga in plan.gas for v in variants]
    assert all(r["step_ms"] > 0 and r["peak_mib"] > 0 and r["samples"] == 1 for r in found["rows"])
    assert found["import_torch"] is False and found["import_unsloth"] is False
    table = bench.render(found)
    assert table.count("| tiny |") == len(found["rows"]) and "import unsloth_diffusion_norm" in table
    pytest.importorskip("matplotlib")
    assert found["plot"] and (tmp_path / "bench.png").stat().st_size > 0


def test_a_ratio_within_the_spread_between_blocks_is_called_noise():
    def row(variant, ratio, spread):
        return dict(
            model="tiny",
            ga=1,
            variant=variant,
            step_ms=20 * ratio,
            ratio=ratio,
            spread=spread,
            peak_mib=600.0,
            above_mib=0.1,
            samples=6,
        )

    found = dict(
        mode="patched",
        unsloth="x",
        quick=False,
        blocks=3,
        steps=2,
        import_ms=9.0,
        import_torch=False,
        import_unsloth=False,
        collectives_per_step=None,
        rows=[row("unpatched", 1.0, 0.02), row("plugin", 1.05, 0.08), row("per-sample", 1.30, 0.05)],
    )
    note = bench.noise_note(found)
    # plugin: 5 % from 1 within blocks 8 % apart; per-sample: 30 % from 1 stands out of 5 %
    assert note.startswith("note: in 1 of 2 rows") and "tiny GA 1 plugin 1.050 (blocks 8% apart)" in note
    assert "per-sample" not in note and note in bench.render(found)
    assert "count collectives" not in bench.render(found)  # (--no-ddp)
    counted = bench.render({**found, "collectives_per_step": [1]})
    assert "count collectives per optimizer step under 2-rank DDP: [1]" in counted
    found["rows"].pop(1)
    assert bench.noise_note(found) is None
    assert "one block per figure" in bench.noise_note({**found, "blocks": 1})


@pytest.mark.once
def test_the_gpu_bench_runs_its_code_at_the_tiny_size_on_cpu(plugin, tmp_path):
    """scripts/gpu_check.sh's bench (bench.GPU) at the size a CPU affords: one part written, a table of parts."""
    import json

    found = bench.gpu_part(str(tmp_path / "part.json"), bench.GPU_SMOKE, log=lambda line: None)
    assert json.loads((tmp_path / "part.json").read_text())["rows"] == found["rows"]
    assert [r["ga"] for r in found["rows"]] == [2] * len(bench.variants(found["mode"]))
    assert all(len(r["block_ratios"]) == bench.GPU_SMOKE.blocks for r in found["rows"])
    table = bench.render_gpu([found, found])
    assert table.count("| tiny |") == 0 and table.count(f"{found['unsloth']} ({found['mode']})") == 2 * len(
        found["rows"]
    )
    assert "| 1.000 |" in table and "Each release ran in its own process" in table and "ratio per block" in table


def test_the_gpu_bench_times_the_metrics_off_beside_the_plugin_and_pairs_its_blocks():
    """On a GPU the metrics' cost is timed too (turning them off is no opt-in), and each ratio is read block by
    block against the baseline timed beside it: a drift between blocks cancels out of the paired ratios."""
    from unsloth_diffusion_norm.registry import NATIVE, PATCHED
    from unsloth_diffusion_norm.tools.bench_report import block_ratio_range

    timed = {
        mode: [label for label, _, flags in bench.variants(mode) if not bench.opts_in(flags)]
        for mode in (PATCHED, NATIVE)
    }
    assert timed[PATCHED] == ["unpatched", "plugin", "plugin, diffusion_metrics=False"]
    assert timed[NATIVE][0] == "native, unpatched (Unsloth's own)" and len(timed[NATIVE]) == 3
    assert bench.GPU.blocks * bench.GPU.steps >= 16
    row = {"block_ratios": [1.004, 0.998, 1.001]}
    assert block_ratio_range(row) == "0.998–1.004" and block_ratio_range(row, first_row=True) == "—"
    assert block_ratio_range({"spread": 0.02}) == "—"  # a part written before the blocks were paired

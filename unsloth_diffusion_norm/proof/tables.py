"""Every markdown table the proof and the tools print (the tables of README.md and docs/ are pasted from these)."""


def markdown(header, rows, align=None, min_width=0):
    """Lines of a markdown table: `header` is a list of column titles, each row a list of cells. `align`:
    one of '<' / '>' per column, and every cell is padded to its column's width (at least `min_width`), so
    the table also reads as plain text; None leaves the cells as they are."""
    if align is None:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(str(cell) for cell in row) + " |" for row in rows
        ]
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(min_width, *(len(row[i]) for row in cells)) for i in range(len(header))]

    def line(row):
        return "| " + " | ".join(f"{cell:{side}{width}}" for cell, side, width in zip(row, align, widths)) + " |"

    return [line(cells[0]), "|" + "|".join("-" * (width + 2) for width in widths) + "|"] + [line(r) for r in cells[1:]]


def flags_table():
    """docs/api.md's flags table, from the flags' records (config.FLAGS): the one place a flag is defined."""
    from .. import config

    def values(flag):
        shown = [f"`{flag.default!r}` (default)"] + [f"`{value}`" for value in flag.other_values()]
        return ", ".join(shown)

    rows = [[f"`{flag.name}`", values(flag), flag.applies, flag.help] for flag in config.FLAGS]
    return markdown(["flag", "values", "where it applies", "what it does"], rows)


# ---- the record of a fuzzing run (scripts/fuzz.py) ------------------------------------------------------------------

FUZZ_KINDS = ("configurations", "family configurations", "rank cases", "bad inputs")
# What a fuzzing run measured: the core, and the fuzzer and the oracle that judge it.
FUZZ_COVERS = {
    "the core": ["unsloth_diffusion_norm/*.py"],
    "the fuzzer": ["unsloth_diffusion_norm/proof/**", "scripts/fuzz.py", "tests/integration/test_fuzz.py"],
}


def fuzz_figures(counts, rounds, minutes, first_seed, failures, mode, unsloth):
    """A fuzzing run's record figures: per kind (FUZZ_KINDS) tried, diverged and tracebacks (from the Counter `counts`:
    'KIND tried' / 'KIND failed' / 'KIND tracebacks'); the totals, rounds, minutes, seeds, failures, mode, release."""
    kinds = {
        kind.replace(" ", "_"): {what: counts.get(f"{kind} {what}", 0) for what in ("tried", "failed", "tracebacks")}
        for kind in FUZZ_KINDS
    }
    return {
        **kinds,
        "tried": sum(k["tried"] for k in kinds.values()),
        "divergences": sum(k["failed"] for k in kinds.values()),
        "tracebacks": sum(k["tracebacks"] for k in kinds.values()),
        "failures": failures,
        "rounds": rounds,
        "minutes": minutes,
        "seeds": {"first": first_seed, "last": first_seed + rounds - 1 if rounds else None},
        "mode": mode,
        "unsloth": unsloth,
    }


def fuzz_table(figures):
    lines = ["| kind | tried | diverged | tracebacks |", "|---|---|---|---|"]
    for kind in FUZZ_KINDS:
        found = figures[kind.replace(" ", "_")]
        lines.append(f"| {kind} | {found['tried']:,} | {found['failed']} | {found['tracebacks']} |")
    return "\n".join(lines)

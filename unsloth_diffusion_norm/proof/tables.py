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

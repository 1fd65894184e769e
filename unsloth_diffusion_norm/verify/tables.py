"""Every markdown table the proof prints (the tables of README.md and docs/ are pasted from these)."""


def markdown(header, rows):
    """Lines of a markdown table: `header` is a list of column titles, each row a list of cells."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(cell) for cell in row) + " |" for row in rows
    ]

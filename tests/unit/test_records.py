"""The pages say what the records hold (unsloth_diffusion_norm/tools/records.py): every figure of the README and
docs/ rendered from a record as it reads now, and every number in the prose of README, docs, CONTRIBUTING and
CHANGELOG rendered from a record, derived from the code, or a setting the page names as one; no count of things
the code defines typed by hand. A failure names the file, the line and the text; the fix is
`python scripts/docs_outputs.py --render`, a record that holds the figure, or the setting in `code`."""

import json
import pathlib
import re
import sys

import pytest

from unsloth_diffusion_norm.tools import records

ROOT = pathlib.Path(records.ROOT)
PAGES = [pathlib.Path(p) for p in records.pages()]
PROSE = [*PAGES, ROOT / "CHANGELOG.md"]
REQUIRED = ("name", "command", "commit", "date", "machine", "versions", "covers", "figures")

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
MARKED = re.compile(
    r"<!--r .*?<!--/r-->|<!--n .*?<!--/n-->|<!-- record: .*?<!-- /record -->|"
    r"<!-- compatibility table: start -->.*?<!-- compatibility table: end -->|<!-- flags: start.*?<!-- flags: end -->",
    re.S,
)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
# What is no measurement: versions (2026.10.4, transformers 4.56, Python 3.11, '.6' of a range), an interval's level.
VERSION = re.compile(
    r"\b\d+\.\d+\.\d+\S*|\b20\d\d\.\d+\b|[–-]\.\d+\b|[A-Za-z]-\d+\.\d+\b|"
    r"(?i:python|torch|transformers|trl|accelerate|unsloth|deepspeed|peft|cuda|wandb|wrapt|version|"
    r"tensorboard|numpy|h100|h200)[ =<>~!]*\d+\.\d+\b|[<>=~]=?\s*\d+\.\d+|\b\d+\s?% (?=interval|confidence|level)"
)
MEASURED = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?%|(?<![\w.])\d[\d,]*\.\d+(?:e[-+]?\d+)?(?:\s?ms\b)?|\b\d[\d,]*\s?ms\b"
)
# Every numeral of the prose is one of these, or a failure: what a reader takes for a setting (a layout, a seed, an
# exit status, a list's item, a part of a page, an issue), or 0 and 1 (identities: a ratio's 1, an empty window's 0).
NUMERAL = re.compile(r"(?<![\w.#/-])\d+(?:,\d{3})*(?:\.\d+)?(?![\w.]*\w)")
_N = r"\d+(?:,\d{3})*"
_NS = rf"{_N}(?:(?:,\s*| and | to | or |\s*[-–×x]\s*){_N})*"
SETTING = re.compile(
    rf"^\s*(?:[-*]\s+)?{_N}\.\s|"  # an ordered list's item
    rf"\b(?:GA|batch(?: size)?|gradient accumulation|seeds?|hidden|exit(?: status)?|Parts?|windows|step|layouts?|issue|world size >)\s+{_NS}|"
    rf"\b{_NS}\s*-?\s*(?:×\s*\d+\s*)?(?:CPU\s+|paired\s+|held-out\s+|warm-up\s+|two-rank\s+)?"
    r"(?:ranks?|nodes?|process(?:es)?|seeds|layers?|tokens?|symbols|rows|items|draws|decimals|configurations|"
    r"bad inputs|cases|micro-batches)\b",
    re.I,
)
NUMBER = r"\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
COUNTED = re.compile(
    rf"\b({NUMBER})\s+(?:per-run\s+|status\s+|core\s+)?(flags|patches|modes|mutants|tests|lines of code|modules)\b",
    re.I,
)


def prose_lines(path):
    """(line number, text) of a page's prose: code, comments, rendered figures and link targets taken out."""
    text = FENCE.sub(lambda m: "\n" * m.group().count("\n"), path.read_text(encoding="utf-8"))
    text = MARKED.sub(lambda m: " " + "\n" * m.group().count("\n"), text)
    text = COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    for i, line in enumerate(text.split("\n"), 1):
        yield i, LINK_TARGET.sub("]", CODE_SPAN.sub("", line))


def derived(noun):
    """', the code gives N' where the store derives that noun's count."""
    name = {"flags": "flags", "modes": "modes", "mutants": "mutants", "modules": "core-modules"}.get(noun.lower())
    return f", the code gives {records.COUNTS[name]()}" if name else ""


def shown_figures(line):
    """The rendered text of every figure and count on a line."""
    return [m["text"] for pattern in (records.FIGURE, records.COUNT) for m in pattern.finditer(line)]


def held(figure):
    """Where the store may hold a figure typed in prose (a value that rounds to it, of 3 digits or more), or None."""
    number = figure.replace(",", "").rstrip("%ms ").strip()
    if len(number.replace(".", "").lstrip("0")) < 3:
        return None
    for name in records.names():
        for key, found in records.leaves(records.load(name)["figures"]):
            if isinstance(found, (int, float)) and not isinstance(found, bool):
                digits = len(number.split(".")[1]) if "." in number else 0
                scaled = found * 100 if figure.endswith("%") and abs(found) <= 1 else found
                if round(scaled, digits) == float(number):
                    return f"perhaps records/{name}.json's {key} ({found!r}): <!--r {name}.{key}-->"
    return None


@pytest.mark.parametrize("name", records.names())
def test_every_record_names_its_command_commit_machine_versions_and_code(name):
    record = records.load(name)
    missing = [field for field in REQUIRED if field not in record]
    assert not missing, f"records/{name}.json lacks {missing}"
    assert record["name"] == name and record["figures"], name
    assert re.fullmatch(r"[0-9a-f]{7,40}", record["commit"]), record["commit"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]), record["date"]
    assert record["machine"].startswith("CPU") or "GPU" in record["machine"] or "NVIDIA" in record["machine"]
    assert all(isinstance(paths, list) and paths for paths in record["covers"].values()), record["covers"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_figure_reads_as_its_record_renders_it_now(path):
    if not records.history():
        pytest.skip("a shallow clone: what changed since a record's commit needs the history")
    text = path.read_text(encoding="utf-8")
    try:
        rendered = records.render(text)
    except KeyError as error:
        line = next((i for i, row in enumerate(text.split("\n"), 1) if str(error).split("'")[1] in row), "?")
        pytest.fail(f"{path.relative_to(ROOT)}:{line}: {error.args[0]}")
    wrong = []
    for i, (now, then) in enumerate(zip(text.split("\n"), rendered.split("\n")), 1):
        if now != then:
            reads, holds = shown_figures(now), shown_figures(then)
            shown = [f"reads {a!r}, the record gives {b!r}" for a, b in zip(reads, holds) if a != b] or [then[:160]]
            wrong.append(f"{path.relative_to(ROOT)}:{i}: " + "; ".join(shown))
    assert not wrong, "render the pages (python scripts/docs_outputs.py --render):\n" + "\n".join(wrong)


def untyped(path):
    """'FILE:LINE: TEXT' for each number of a page's prose that is neither rendered, derived nor a setting."""
    found = []
    for i, line in prose_lines(path):
        rest = SETTING.sub(" ", VERSION.sub(" ", line))
        for m in NUMERAL.finditer(rest):
            if m.group() in ("0", "1"):
                continue
            figure = next((f for f in MEASURED.findall(rest) if m.group() in f), m.group())
            where = held(figure) or "no record holds it, the code does not derive it, and it reads as no setting"
            found.append(f"{path.relative_to(ROOT)}:{i}: {figure!r} in {line.strip()[:100]!r}: {where}")
    return found


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_number_in_prose_is_rendered_derived_or_a_setting(path):
    typed = untyped(path)
    assert not typed, "render it (<!--r RECORD.KEY-->), derive it (<!--n NAME-->) or put the setting in `code`:\n" + (
        "\n".join(typed)
    )


PLANTS = {
    "CONTRIBUTING.md": "The suite has 812 tests.",
    "CHANGELOG.md": "- `make test` now takes 6 minutes on two cores.",
    "docs/api.md": "The plugin applies 14 patches to 2026.10.6.",
}


@pytest.mark.parametrize("page", sorted(PLANTS))
def test_a_number_typed_into_a_page_fails_with_the_file_the_line_and_the_text(page, tmp_path, monkeypatch):
    """A whole number in CONTRIBUTING, a duration in CHANGELOG and a count in a docs page, each planted at the end
    of a copy of the real page: the one failure names it."""
    copy = tmp_path / page
    copy.parent.mkdir(parents=True, exist_ok=True)
    text = (ROOT / page).read_text(encoding="utf-8").rstrip("\n") + "\n\n" + PLANTS[page] + "\n"
    copy.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    typed = untyped(copy)
    assert len(typed) == 1 and typed[0].startswith(f"{page}:{text.count(chr(10))}: "), typed
    assert CODE_SPAN.sub("", PLANTS[page]).strip("- ")[:30] in typed[0], typed


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_count_of_what_the_code_defines_typed_by_hand(path):
    typed = [
        f"{path.relative_to(ROOT)}:{i}: {m.group()!r} typed by hand{derived(m.group(2))}: derive it (<!--n NAME-->, "
        f"NAME one of {sorted(records.COUNTS)})"
        for i, line in prose_lines(path)
        for m in COUNTED.finditer(line)
    ]
    assert not typed, "\n".join(typed)


def test_a_figure_that_is_no_longer_its_records_fails_with_the_file_the_line_and_the_value(tmp_path, monkeypatch):
    """The test above on a planted page: a record's figure changed by hand is found and named."""
    store = tmp_path / "records"
    store.mkdir()
    record = {
        "name": "planted",
        "command": "bench",
        "commit": "0000000",
        "date": "2026-01-01",
        "machine": "CPU (2 cores, x86_64)",
        "versions": {},
        "covers": {"the core": ["unsloth_diffusion_norm/*.py"]},
        "figures": {"ratio": 0.992},
    }
    (store / "planted.json").write_text(json.dumps(record))
    monkeypatch.setattr(records, "STORE", str(store))
    records.load.cache_clear()
    records.changed_since.cache_clear()
    try:
        good = records.render("step time <!--r planted.ratio:.3f-->x<!--/r--> of the release's")
        assert good == "step time <!--r planted.ratio:.3f-->0.992 (CPU, 0000000)<!--/r--> of the release's"
        assert records.render(good.replace("0.992", "1.048")) == good
        assert held("0.992") == "perhaps records/planted.json's ratio (0.992): <!--r planted.ratio-->"
        shown = "a page names a figure, `<!--r planted.ratio:.3f-->…<!--/r-->`, or a count, `<!--n flags-->…<!--/n-->`"
        assert records.render(shown) == shown  # the syntax shown in a code span is text
    finally:
        records.load.cache_clear()
        records.changed_since.cache_clear()


def test_the_prose_rules_catch_a_typed_figure_and_a_typed_count_and_spare_versions(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Unsloth 2026.10.4–.6 with transformers 4.56 and Python 3.11: `lr 0.1`, a 95 % interval, AGPL-3.0.\n"
        "The final parameters were 0.0118 apart; 96.5 % exact match.\n"
        "api.md lists the six per-run flags and 2663 mutants.\n"
    )
    found = [(i, MEASURED.findall(VERSION.sub(" ", line))) for i, line in prose_lines(page)]
    assert found == [(1, []), (2, ["0.0118", "96.5 %"]), (3, []), (4, [])]
    counted = [(i, m.group()) for i, line in prose_lines(page) for m in COUNTED.finditer(line)]
    assert counted == [(3, "six per-run flags"), (3, "2663 mutants")]

"""The pages say what the records hold (unsloth_diffusion_norm/tools/records.py): every figure of the README and
docs/ rendered from a record as it reads now, no measured figure in prose that no record holds, no count of
things the code defines typed by hand. A failure names the file, the line and the record's value; the fix is
`python scripts/docs_outputs.py --render` (or a record that holds the figure). Plain text only."""

import json
import pathlib
import re

import pytest

from unsloth_diffusion_norm.tools import records

ROOT = pathlib.Path(records.ROOT)
PAGES = [pathlib.Path(p) for p in records.pages()]
REQUIRED = ("name", "command", "commit", "date", "machine", "versions", "covers", "figures")

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
MARKED = re.compile(r"<!--r .*?<!--/r-->|<!--n .*?<!--/n-->|<!-- record: .*?<!-- /record -->", re.S)
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


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_measured_figure_in_prose_that_no_record_holds(path):
    typed = []
    for i, line in prose_lines(path):
        for figure in MEASURED.findall(VERSION.sub(" ", line)):
            where = held(figure) or "no record holds it (a setting goes in `code`)"
            typed.append(f"{path.relative_to(ROOT)}:{i}: {figure!r} typed by hand; {where}")
    assert not typed, "\n".join(typed)


@pytest.mark.parametrize("path", [*PAGES, ROOT / "CONTRIBUTING.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
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

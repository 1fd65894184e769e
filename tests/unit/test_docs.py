"""The README stays a three-minute read and the docs pages stay reachable: size, what the first screen
holds, every relative link and anchor, no page or image left unlinked. Plain text only: no Unsloth, torch
or transformers."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
IMAGES = sorted(p for p in DOCS.rglob("*") if p.suffix.lower() in {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"})

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def prose(text):
    """The text with fenced code blocks and code spans taken out: links and headings live outside them."""
    return FENCE.sub("", text)


def links(path):
    """Every markdown link target of a file, outside code."""
    return LINK.findall(CODE_SPAN.sub("", prose(path.read_text(encoding="utf-8"))))


def relative_links(path):
    return [t for t in links(path) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]  # http(s):, mailto:, ...


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation dropped (hyphens, spaces and letters kept,
    backticks too are punctuation), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors GitHub gives a file's headings; a repeated slug gets -1, -2, ..."""
    seen, out = {}, set()
    for heading in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def test_slug_follows_githubs_rule():
    assert slug("Check your own model (doctor --model DIR)") == "check-your-own-model-doctor---model-dir"
    assert slug("Reproduction: real output of `make reproduce`") == "reproduction-real-output-of-make-reproduce"
    assert slug("What it fixes, and who needs it") == "what-it-fixes-and-who-needs-it"


def test_the_readme_and_the_docs_keep_to_their_word_budgets():
    """What a user reads stays short: the README at most 1,500 words, docs/ at most 15,000 in all (as `wc -w` counts,
    markers included); detail goes by the user's question, history to the CHANGELOG."""
    words = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").split()) for path in PAGES}
    assert len(README.read_text(encoding="utf-8").split()) <= 1_500, "README.md: cut it, or move detail to docs/"
    assert sum(words.values()) <= 15_000, sorted(words.items(), key=lambda item: -item[1])


def test_readme_first_40_lines_answer_what_it_fixes_am_i_affected_install_the_one_line_and_the_check():
    """The first screen: what it fixes (its symbols defined there, the flag behind "window" named), whether you
    are affected, how to install, the one line, and the command that checks your stack."""
    lines = README.read_text(encoding="utf-8").splitlines()
    screen = "\n".join(lines[:40])
    for heading in ("The one line", "What it fixes", "Am I affected?"):
        assert re.search(rf"^## {re.escape(heading)}$", screen, re.M), f"{heading!r} in the first 40 lines"
    code = "\n".join(FENCE.findall(screen))
    for command in (r"import unsloth_diffusion_norm\b", r"pip install \.", r"unsloth-diffusion-norm doctor\b"):
        assert re.search(rf"^{command}", code, re.M), f"{command!r}, in a code block of the first 40 lines"
    for defined in ("`p_mask`:", "weighted sum `S`", "masked\ntokens `N`", "(GA)", "over micro-batches `g`"):
        assert defined in screen, f"{defined!r} defined on the first screen"
    assert "diffusion_loss_normalization" in screen


def test_readme_first_80_lines_hold_every_section_a_user_starts_with_and_the_test_command():
    lines = README.read_text(encoding="utf-8").splitlines()
    head = "\n".join(lines[:80])
    for heading in ("What it fixes", "Am I affected?", "Install", "The one line", "Check it"):
        assert re.search(rf"^## {re.escape(heading)}$", head, re.M), f"{heading!r} in the first 80 lines"
    code = "\n".join(FENCE.findall(head))
    assert re.search(r"^import unsloth_diffusion_norm\b", code, re.M), "the usage line, in a code block"
    assert re.search(r"^pip install \.", code, re.M), "the install command from a clone, in a code block"
    for command in ("make reproduce", "make test"):
        assert re.search(rf"^{command}\b", code, re.M), f"{command!r}, in a code block of the first 80 lines"
    code = "\n".join(FENCE.findall("\n".join(lines[:100])))
    assert "unsloth-diffusion-norm doctor" in code and "Self-check" in code, "doctor and its expected lines"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT).as_posix()}")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README) if t.partition("#")[0]}
    assert PAGES, "docs/ has no pages"
    orphans = [p.relative_to(ROOT).as_posix() for p in PAGES if p.resolve() not in linked]
    assert not orphans, f"not linked from README.md: {orphans}"


def test_every_image_under_docs_is_used():
    used = {
        (path.parent / t.partition("#")[0]).resolve()
        for path in (README, *PAGES)
        for t in relative_links(path)
        if t.partition("#")[0]
    }
    unused = [p.relative_to(ROOT).as_posix() for p in IMAGES if p.resolve() not in used]
    assert not unused, f"not referenced by README.md or any docs page: {unused}"


# Words about how the project is built rather than about what a user has (a CUDA machine, perhaps without
# network): the docs, the scripts and the README speak of the project itself.
MACHINERY = re.compile(r"device tool|\blent\b|KINDS\.md|timeout_s|carry \[", re.I)


def test_the_project_speaks_of_itself_only():
    scripts = [p for p in (ROOT / "scripts").rglob("*") if p.is_file() and p.suffix in {".py", ".sh", ".txt", ".md"}]
    found = {
        str(path.relative_to(ROOT)): MACHINERY.findall(path.read_text(encoding="utf-8"))
        for path in [README, *PAGES, *scripts]
    }
    assert {path: words for path, words in found.items() if words} == {}


def test_the_layout_page_gives_every_core_module_once_in_its_reading_order():
    """docs/layout.md's core table names each module of the core (the package's top level) exactly once: a module
    added, split or renamed shows here."""
    page = (DOCS / "layout.md").read_text(encoding="utf-8")
    table = page[page.index("## The core") : page.index("## The proof")]
    named = re.findall(r"`(\w+\.py)`", "".join(line.split("|")[1] for line in table.splitlines() if line[:2] == "| "))
    core = sorted(p.name for p in (ROOT / "unsloth_diffusion_norm").glob("*.py") if p.name != "__main__.py")
    assert sorted(named) == core and len(named) == len(set(named)), sorted(set(core) ^ set(named))


def test_the_version_is_one_in_the_package_the_changelog_and_the_readme():
    """__version__ (what --version prints and the wheel is named by), the CHANGELOG's newest version and the README's
    status line say the same version, and whether it is published; no entries wait outside a version."""
    version = re.search(
        r'^__version__ = "([^"]+)"', (ROOT / "unsloth_diffusion_norm" / "__init__.py").read_text(), re.M
    )
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    newest = re.search(r"^## (\S+)( \(not yet published\))?$", changelog, re.M)
    status = re.search(
        r"^\*\*Status:\*\* version (\S+?),( not yet published)?", README.read_text(encoding="utf-8"), re.M
    )
    assert version and newest and status
    assert version.group(1) == newest.group(1) == status.group(1)
    assert bool(newest.group(2)) == bool(status.group(2))
    assert "## Unreleased" not in changelog


def test_the_fuzzers_ci_share_in_contributing_is_the_suites():
    """CONTRIBUTING.md states how many random examples each CI leg draws: the defaults the tests read."""

    def default(path, variable):
        (value,) = re.findall(rf'"{variable}", "(\d+)"', (ROOT / "tests" / "integration" / path).read_text())
        return int(value)

    configurations = default("test_fuzz.py", "UDN_FUZZ_CONFIGURATIONS")
    bad = 2 * default("test_fuzz.py", "UDN_FUZZ_BAD_INPUTS")  # (flag values, and command lines)
    family = default("test_own_model.py", "UDN_FUZZ_FAMILY_CONFIGURATIONS")
    ranks = default("multiprocess/test_data_parallel.py", "UDN_FUZZ_RANK_CASES")
    text = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())
    assert f"{configurations} configurations and {bad} bad inputs in make test and on the matrix's stacks" in text
    assert f"{family} configurations of each family" in text and f"{ranks} two-rank cases" in text

"""The docs' real-output blocks that `make docs-outputs` writes (scripts/docs_outputs.py): every marker names a
block, every block is in its page once, and each carries its command, the commit and the versions it was
measured at - the pinned stack's. Plain text only."""

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location("docs_outputs", ROOT / "scripts" / "docs_outputs.py")
docs_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_outputs)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks():
    """{name: (page, body)} of every marked block in the README and docs/."""
    found = {}
    for page in PAGES:
        for match in docs_outputs.MARKER.finditer(page.read_text(encoding="utf-8")):
            assert match.group("name") not in found, f"{match.group('name')} twice"
            found[match.group("name")] = (str(page.relative_to(ROOT)), match.group("body"))
    return found


def pins():
    """The test environment's exact pins (requirements-dev.txt; torch in constraints.txt too)."""
    lines = [
        line.split("#")[0].strip()
        for f in ("constraints.txt", "requirements-dev.txt")
        for line in (ROOT / f).read_text(encoding="utf-8").splitlines()
    ]
    return dict(line.split("==") for line in lines if "==" in line)


def test_every_marked_block_is_a_block_of_the_script_on_its_page():
    found = blocks()
    assert set(found) == set(docs_outputs.BLOCKS)
    for name, (page, _) in found.items():
        assert page == docs_outputs.BLOCKS[name].page, name


def test_each_block_names_its_command_the_commit_and_the_pinned_versions():
    pinned = pins()
    for name, (_, body) in blocks().items():
        block = docs_outputs.BLOCKS[name]
        stamp = docs_outputs.STAMP.match(body.splitlines()[0])
        assert stamp, f"{name}: no stamp in its first line: {body.splitlines()[0]!r}"
        assert stamp["command"] == block.command(), name
        assert bool(stamp["shortened"]) == block.shortened, name
        expected = dict(pinned)
        if block.leg:  # a leg's own Unsloth, transformers and TRL (its name says them), torch pinned alike
            _, expected["unsloth"], _, expected["transformers"], _, expected["trl"] = block.leg.split("-")
        for package in ("unsloth", "transformers", "trl", "torch"):
            assert re.match(re.escape(expected[package]) + r"(\+|$)", stamp[package]), (name, package, stamp[package])
        assert len(body.splitlines()) > 1, f"{name}: nothing under the stamp"


COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_every_other_real_output_names_its_commit():
    """A "real output" the script does not make names the commit it came from, within its sentence (the line,
    the two before it or the two after); one the script makes carries its stamp (the test above)."""
    unnamed = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if "real output" not in line.lower() or "(#real-output)" in line or "make docs-outputs" in line:
                continue
            if line.startswith(("|", "#")):  # a table cell pointing to a page; a heading over the block
                continue
            if not COMMIT.search(" ".join(lines[max(0, i - 2) : i + 3])):
                unnamed.append(f"{page.relative_to(ROOT)}:{i + 1}: {line.strip()[:80]}")
    assert not unnamed, unnamed

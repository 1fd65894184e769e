"""The docs' real-output blocks of the commands users run, made by one command on one commit: `make docs-outputs`.

A block is the fenced code block right after a marker line `<!-- output: NAME -->` in a page. Its first line is
the command and its stamp, `$ COMMAND   # at COMMIT · Unsloth X · transformers Y · TRL Z · torch W`; the rest is
what the command printed, shortened where BLOCKS says so (a shortened block says "shortened" in its stamp line).

    python scripts/docs_outputs.py              # run every block's command into its record, render every page
    python scripts/docs_outputs.py --only NAME  # one block's command, then render every page
    python scripts/docs_outputs.py --render     # run nothing: render every page from the records as they are
    python scripts/docs_outputs.py --list       # the blocks, their pages and commands

Each command's output is a record (records/output-NAME.json, unsloth_diffusion_norm/tools/records.py), and so is
every other measurement (the bench, the matrix, the convergence study, the fuzzer, mutation testing, the GPU
check: each tool writes its own); rendering puts every record's figures, tables and blocks into the README and
docs/, each with the commit it was measured at, and says where the code changed since. Running commands refuses a
tree whose files other than pages (*.md) and records differ from HEAD: the record names the commit the code was
at. tests/unit/test_records.py holds every page to the records; tests/unit/test_docs_outputs.py the markers, the
stamps and the pinned versions; tests/integration/test_reproduce.py the reproduction's block to what the command
prints now.
"""

import argparse
import dataclasses
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from unsloth_diffusion_norm.tools import records  # noqa: E402  (plain Python: the checkout's own)

CLI = "unsloth-diffusion-norm"
MARKER = records.OUTPUT
STAMP = re.compile(
    r"^\$ (?P<command>.+?) +# (?P<shortened>shortened, )?at (?P<commit>[0-9a-f]{7,40})(?: \((?P<since>.+) changed "
    r"since\))? · Unsloth (?P<unsloth>\S+) · transformers (?P<transformers>\S+) · TRL (?P<trl>\S+) · torch (?P<torch>\S+)$"
)


def _from_first(pattern):
    """The output from its first line matching `pattern` on (Unsloth's banner and warnings before it dropped)."""

    def keep(lines):
        start = next(i for i, line in enumerate(lines) if re.match(pattern, line))
        return lines[start:]

    return keep


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    arguments: tuple
    keep: object = None  # lines -> the lines shown; None: all of them
    shortened: bool = False
    leg: str = None  # a leg of scripts/matrix.py (.matrix/<leg>/, built by `make matrix`) to run in; None: this one
    module: str = None  # `python -m MODULE` instead of the command line (a proof table); None: the command line
    prepare: object = None  # () -> None: makes the command's input first (outputs/ is ignored by git)
    same_as: str = None  # another block's name: its run's output, shown again (one run, one set of figures)

    def executable(self):
        folder = os.path.join(ROOT, ".matrix", self.leg, "bin") if self.leg else os.path.dirname(sys.executable)
        return os.path.join(folder, "python" if self.module else CLI)

    def command(self):
        """What the block's stamp says was run."""
        return " ".join(("python -m " + self.module if self.module else CLI, *self.arguments))


NATIVE_LEG = "unsloth-2026.10.9-transformers-5.17.0-trl-1.15.0"


BLOCKS = {
    "reproduce": Block("README.md", ("reproduce",), _from_first(r"Unsloth \d")),
    "doctor": Block("docs/doctor.md", ("doctor",), _from_first(r"Installed: ")),
    "doctor-summary": Block("README.md", ("doctor",), _from_first(r"Installed: "), same_as="doctor"),
    "doctor-native": Block("docs/doctor.md", ("doctor",), _from_first(r"Installed: "), leg=NATIVE_LEG),
    "doctor-config": Block(
        "docs/doctor.md", ("doctor", "--config", "examples/train.yaml"), _from_first(r"Installed: ")
    ),
    "cli-help": Block("docs/cli.md", ("--help",)),
    # Each command's usage lines (its options are explained on its own page; `--help` prints them all).
    **{
        f"cli-{command}-help": Block(
            "docs/cli.md", (command, "--help"), lambda lines: lines[: lines.index("")], shortened=True
        )
        for command in ("reproduce", "doctor", "bench", "impact")  # status has no options
    },
    "impact": Block(
        "docs/impact.md",
        ("impact", "--config", "examples/train.yaml", "--data", "outputs/demo/data.jsonl", "--tokenizer")
        + ("outputs/demo/tokenizer", "--world-size", "2", "--plot", "docs/impact.png"),
        prepare=lambda: _demo_data(),
    ),
    # The realistic configurations, each judged by the oracle beside its per-micro-batch control (minutes).
    "scenarios": Block(
        "docs/in-the-field.md", (), _from_first(r"Unsloth \d"), module="unsloth_diffusion_norm.proof.scenarios"
    ),
}
PACKAGES = ("unsloth", "transformers", "trl", "torch")


def versions(block):
    """The versions the block's command runs with: this environment's, or its leg's."""
    if not block.leg:
        return {name: metadata.version(name) for name in PACKAGES}
    python = os.path.join(os.path.dirname(block.executable()), "python")
    code = f"import json, importlib.metadata as m; print(json.dumps({{n: m.version(n) for n in {PACKAGES!r}}}))"
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def _demo_data():
    """impact's input: the docstring set and its tokenizer, made on this machine (nothing downloaded)."""
    from unsloth_diffusion_norm.tools import docstring_data  # noqa: PLC0415  (plain Python and tokenizers)

    docstring_data.write(os.path.join(ROOT, "outputs", "demo"))


def run(block):
    """The command's output as it prints it (stdout and stderr together, as a terminal shows them)."""
    if block.prepare:
        block.prepare()
    env = {**os.environ, "UNSLOTH_ALLOW_CPU": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    if not os.path.exists(block.executable()):
        sys.exit(f"docs_outputs: {block.executable()} is missing: build the leg first (make matrix)")
    done = subprocess.run(
        [block.executable(), *(("-m", block.module) if block.module else ()), *block.arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.rstrip("\n").splitlines()
    if done.returncode != 0:
        sys.exit(f"docs_outputs: `{block.command()}` exited {done.returncode}:\n{done.stderr}")
    return block.keep(lines) if block.keep else lines


def commit_of_the_code():
    """The short commit HEAD, refusing a tree whose code differs from it (the stamp would not say the truth);
    changed pages (*.md) are allowed, no command prints them."""
    changed = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    others = [
        line for line in changed if not line.endswith(".md") and not line[3:].startswith("records/")
    ]  # pages and records: no command reads them
    if others:
        sys.exit("docs_outputs: commit these changes first, the stamp names the commit:\n" + "\n".join(others))
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(BLOCKS), help="these blocks only")
    parser.add_argument("--list", action="store_true", help="list the blocks and stop")
    parser.add_argument("--render", action="store_true", help="run nothing: render the pages from the records")
    args = parser.parse_args(argv)
    names = [] if args.render else args.only or list(BLOCKS)
    if args.list:
        for name in names:
            where = f"   (in .matrix/{BLOCKS[name].leg})" if BLOCKS[name].leg else ""
            print(f"{name:<16} {BLOCKS[name].page:<20} {BLOCKS[name].command()}{where}")
        return 0
    if names:
        commit = commit_of_the_code()
    shown = {}
    for name in names:
        block = BLOCKS[name]
        lines = shown[block.same_as] if block.same_as in shown else run(block)
        shown[name] = lines
        command = block.command()
        figures = {"lines": lines, "shortened": block.shortened}
        records.write(f"output-{name}", command, figures, covers=records.PLUGIN, found=versions(block), commit=commit)
        print(f"{name}: {len(lines)} lines into records/output-{name}.json")
    for path in records.render_pages(records.pages()):
        print(f"rendered {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

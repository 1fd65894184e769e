"""The results store: one JSON record per measurement under records/, and the pages' figures rendered from it.

A record is what a measuring tool wrote (the bench, the GPU check, the convergence study, the fuzzer, mutation
testing, the release matrix, the real outputs of doctor and the CLI): its command, the commit it measured, the
date, the machine (CPU or the GPU's model), the versions, the code it measured (`covers`) and its figures. A page
never types a figure: it names one, and `make docs-outputs` (scripts/docs_outputs.py) renders it.

    <!--r bench-cpu.ratio.ga8:.3f-->0.992 (CPU, 9db11bf)<!--/r-->    a figure: record, dotted key, format spec
    <!--n flags-->10<!--/n-->                                       a count of things the code defines
    <!-- record: bench-cpu.tables.steps -->  ...  <!-- /record -->  a table the record holds, under its stamp

A figure carries where and at which commit it was measured; consecutive figures of one record on one line carry
it once, after the last. Where the code a record covers changed after its commit, the figure says so ("CPU,
9db11bf; the core changed since"). tests/unit/test_records.py holds every page to the store: a figure that
differs from its record, a measured figure in prose that no record holds, a count typed by hand.

Plain Python: no torch, no Unsloth (the unit tier imports this).
"""

import datetime
import functools
import glob
import json
import os
import platform
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORE = os.path.join(ROOT, "records")
PACKAGES = ("unsloth", "unsloth_zoo", "transformers", "trl", "accelerate", "torch")
# What most records measured: the code that runs in a user's training step.
CORE = {"the core": ["unsloth_diffusion_norm/*.py"]}
# What a command's output depends on: core, proof, tools; not this module, which renders pages ("!": left out).
PLUGIN = {"the plugin": ["unsloth_diffusion_norm/**", "!unsloth_diffusion_norm/tools/records.py"]}

FIGURE = re.compile(r"<!--r (?P<name>[\w-]+)\.(?P<key>[\w.-]+?)(?::(?P<spec>[^>]*?))?-->(?P<text>.*?)<!--/r-->")
COUNT = re.compile(r"<!--n (?P<name>[\w-]+)-->(?P<text>.*?)<!--/n-->")
# A real-output block (scripts/docs_outputs.py): the fenced block after the marker, its stamp the first line.
OUTPUT = re.compile(r"^<!-- output: (?P<name>[\w-]+) -->\n```[^\n]*\n(?P<body>.*?)^```$", re.M | re.S)
TABLE = re.compile(
    r"^<!-- record: (?P<name>[\w-]+)\.(?P<key>[\w.-]+) -->\n(?P<body>.*?)^<!-- /record -->$", re.M | re.S
)


# ---- writing ----------------------------------------------------------------------------------------------------


def _git(*args):
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def head():
    """This checkout's commit, short (None outside a git checkout)."""
    return _git("rev-parse", "--short", "HEAD")


# A record's commit where none is known: written from a source archive or an sdist, outside a git checkout.
OUTSIDE = "none (written outside a git checkout)"


def machine():
    """'CPU' or the GPU's model, with the host's cores, the CPU's model and the kernels torch picks on it (its CPU
    capability): what a reader needs to weigh a figure, and to know where it reproduces bitwise."""
    capability = None
    try:
        import torch  # noqa: PLC0415  (only where a tool measures: the unit tier never writes)

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        capability = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        pass
    said = [f"{os.cpu_count()} cores", platform.machine(), cpu_model()]
    return f"CPU ({', '.join(filter(None, said))}; torch CPU capability {capability})"


def cpu_model():
    """The CPU's model name, as the operating system gives it (None where it gives none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def versions():
    from importlib import metadata  # noqa: PLC0415

    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def write(
    name, command, figures, covers=None, tables=None, found=None, commit=None, date=None, where=None, source=None
):
    """Store one measurement as records/NAME.json and return it. `covers`: {label: [path globs]} of the code the
    figures measured (default: the core); `found`: the versions, where the measured stack is not this
    interpreter's (a matrix leg); `commit`, `date`, `where`: for a measurement made elsewhere (the GPU check)."""
    record = {
        "name": name,
        "command": command,
        "commit": commit or head() or OUTSIDE,
        "dirty": commit is None and bool(_git("status", "--porcelain", "--", "unsloth_diffusion_norm")),
        "date": date or datetime.date.today().isoformat(),
        "machine": where or machine(),
        "versions": found or versions(),
        "covers": covers if covers is not None else CORE,
        "figures": figures,
        "tables": tables or {},
    }
    if source:
        record["source"] = source
    os.makedirs(STORE, exist_ok=True)
    with open(os.path.join(STORE, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=False)
        f.write("\n")
    return record


# ---- reading ----------------------------------------------------------------------------------------------------


@functools.cache
def load(name):
    path = os.path.join(STORE, f"{name}.json")
    if not os.path.exists(path):
        raise KeyError(f"no record {name!r} (records/{name}.json)")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def names():
    return sorted(os.path.basename(p)[: -len(".json")] for p in glob.glob(os.path.join(STORE, "*.json")))


def value(name, key):
    """The figure at a dotted key of a record's figures ('ratio.ga8'; a list index is a number)."""
    found = load(name)["figures"]
    for part in key.split("."):
        if isinstance(found, list):
            found = found[int(part)]
        elif isinstance(found, dict) and part in found:
            found = found[part]
        else:
            raise KeyError(f"record {name!r} has no figure {key!r}")
    return found


def leaves(figures, prefix=""):
    """(dotted key, value) of every number and text a record's figures hold."""
    if isinstance(figures, dict):
        for key, item in figures.items():
            yield from leaves(item, f"{prefix}{key}.")
    elif isinstance(figures, list):
        for i, item in enumerate(figures):
            yield from leaves(item, f"{prefix}{i}.")
    else:
        yield prefix[:-1], figures


def _pathspec(path):
    return f":(exclude,glob){path[1:]}" if path.startswith("!") else f":(glob){path}"


@functools.cache
def history():
    """Whether this checkout holds the history a record's commit is looked up in: a shallow clone does not, nor a
    copy of the tree inside another checkout (mutmut's mutants/), whose git would answer for other files."""
    top = _git("rev-parse", "--show-toplevel")
    return top is not None and os.path.samefile(top, ROOT) and _git("rev-parse", "--is-shallow-repository") == "false"


@functools.cache
def changed_since(name):
    """The labels of the code the record covers that changed after its commit (its history unknown: '?')."""
    record = load(name)
    changed = []
    for label, paths in record["covers"].items():
        if _git("cat-file", "-e", f"{record['commit']}^{{commit}}") is None:
            return ["?"]
        diff = subprocess.run(
            ["git", "diff", "--quiet", record["commit"], "HEAD", "--", *map(_pathspec, paths)], cwd=ROOT
        )
        if diff.returncode != 0:
            changed.append(label)
    return changed


def where(name):
    """'CPU, 9db11bf' or 'H200, e0445c8; the core changed since': what every rendered figure carries (a record
    written from a tree with uncommitted changes to the package says so)."""
    record = load(name)
    kind = "CPU" if record["machine"].startswith("CPU") else record["machine"].replace("NVIDIA ", "")
    commit = record["commit"] + (" with uncommitted changes" if record.get("dirty") else "")
    changed = changed_since(name)
    if changed == ["?"]:
        return f"{kind}, {commit}"  # a clone without the history cannot tell; the full history can
    since = f"; {' and '.join(changed)} changed since" if changed else ""
    return f"{kind}, {commit}{since}"


# ---- counts of things the code defines --------------------------------------------------------------------------


def _core_lines():
    total = 0
    for path in glob.glob(os.path.join(ROOT, "unsloth_diffusion_norm", "*.py")):
        with open(path, encoding="utf-8") as f:
            total += sum(1 for line in f)
    return total


def _flags():
    from unsloth_diffusion_norm import config  # noqa: PLC0415  (plain Python: dataclasses only)

    return len(config.FLAGS)


def _modes():
    from unsloth_diffusion_norm import registry  # noqa: PLC0415

    return len(registry.MODES)


def _mutation(field):
    def count():
        with open(os.path.join(ROOT, "mutation", "report.md"), encoding="utf-8") as f:
            text = f.read()
        found = re.search(r"\*\*Score: (\d+) killed / (\d+) non-equivalent = [\d.]+ %\*\* \((\d+) mutants, (\d+)", text)
        return int(found.group({"killed": 1, "non-equivalent": 2, "mutants": 3, "equivalent": 4}[field]))

    return count


def _tests():
    pattern = re.compile(r"^(?:async )?def test_", re.M)
    total = 0
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            total += len(pattern.findall(f.read()))
    return total


COUNTS = {
    "flags": _flags,
    "modes": _modes,
    "core-lines": _core_lines,
    "core-modules": lambda: len(glob.glob(os.path.join(ROOT, "unsloth_diffusion_norm", "*.py"))) - 1,  # __main__
    "mutants": _mutation("mutants"),
    "mutants-equivalent": _mutation("equivalent"),
    "mutants-killed": _mutation("killed"),
    "test-functions": _tests,
}


# ---- rendering --------------------------------------------------------------------------------------------------


def formatted(found, spec):
    if spec and isinstance(found, (int, float)):
        return format(found, spec)
    if isinstance(found, float):
        return f"{found:g}"
    return str(found)


def _shown(line, match):
    """A marker written out in a code span (a page that shows the syntax) is text, not a figure."""
    return match.start() > 0 and line[match.start() - 1] == "`"


def _render_line(line):
    matches = [match for match in FIGURE.finditer(line) if not _shown(line, match)]
    out, last = [], 0
    for i, match in enumerate(matches):
        name = match["name"]
        text = formatted(value(name, match["key"]), match["spec"])
        following = matches[i + 1] if i + 1 < len(matches) else None
        if not (following and following["name"] == name):
            text += f" ({where(name)})"
        spec = f":{match['spec']}" if match["spec"] else ""
        out.append(line[last : match.start()] + f"<!--r {name}.{match['key']}{spec}-->{text}<!--/r-->")
        last = match.end()
    out.append(line[last:])
    line = "".join(out)
    return COUNT.sub(
        lambda m: m.group() if _shown(line, m) else f"<!--n {m['name']}-->{COUNTS[m['name']]()}<!--/n-->", line
    )


def stamp(name):
    """The line over a record's table: the command, where and when, the versions."""
    record = load(name)
    found = record["versions"]
    stack = ", ".join(f"{p} {found[p]}" for p in ("unsloth", "transformers", "trl", "torch") if p in found)
    return f"*`{record['command']}` ({where(name)}, {record['date']}; {stack})*"


def _render_table(match):
    name, key = match["name"], match["key"]
    table = load(name)["tables"][key]
    return f"<!-- record: {name}.{key} -->\n{stamp(name)}\n\n{table.rstrip()}\n<!-- /record -->"


def output_stamp(name):
    """A real-output block's first line: `$ COMMAND   # at COMMIT · Unsloth X · transformers Y · TRL Z · torch W`
    ('shortened, ' before 'at' where the block shows a part; the code changed since, after the commit)."""
    record = load(name)
    found = record["versions"]
    shortened = "shortened, " if record["figures"].get("shortened") else ""
    changed = [label for label in changed_since(name) if label != "?"]
    since = f" ({' and '.join(changed)} changed since)" if changed else ""
    return (
        f"$ {record['command']}   # {shortened}at {record['commit']}{since} · Unsloth {found['unsloth']} · "
        f"transformers {found['transformers']} · TRL {found['trl']} · torch {found['torch']}"
    )


def _render_output(match):
    name = f"output-{match['name']}"
    body = "\n".join([output_stamp(name), *load(name)["figures"]["lines"]])
    start, end = match.span("body")
    return match.group()[: start - match.start()] + body + "\n" + match.group()[end - match.start() :]


def render(text):
    """The page with every figure, count, table and real-output block rendered from the store now."""
    text = OUTPUT.sub(_render_output, text)
    text = TABLE.sub(_render_table, text)
    return "\n".join(_render_line(line) for line in text.split("\n"))


def render_pages(paths):
    """Rewrite the pages in place; the paths of those that changed."""
    changed = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            before = f.read()
        after = render(before)
        if after != before:
            with open(path, "w", encoding="utf-8") as f:
                f.write(after)
            changed.append(path)
    return changed


def pages():
    """The pages figures are rendered into: the README, CONTRIBUTING and every page of docs/ (docs/gpu-check/ holds
    the GPU check's own files, not pages)."""
    top = [os.path.join(ROOT, name) for name in ("README.md", "CONTRIBUTING.md")]
    return [*top, *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]

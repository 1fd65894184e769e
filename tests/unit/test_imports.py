"""No import circle among the package's modules: every import counts, at module level or inside a function,
so that a piece two modules need lies below both. Read from the source, nothing imported."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[2] / "unsloth_diffusion_norm"
NAME = PACKAGE.name


def modules():
    """{dotted module name: source path} for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name, path, known):
    """The package's modules that `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from . import x` names a module when x is one, otherwise something the base module defines
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` imports a.b.c, whose nearest module we know
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycle(graph):
    """One import circle as a list of modules, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_import_graph_is_read_right():
    edges = graph()
    assert f"{NAME}.proof.ranks" in edges[f"{NAME}.proof.data_parallel"]  # from .ranks import launch
    assert f"{NAME}.proof.tables" in edges[f"{NAME}.proof.sharded"]  # from . import data_parallel, ranks, tables
    assert f"{NAME}.registry" in edges[f"{NAME}.proof.ranks"]  # from ..registry import NATIVE
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_imports_itself_through_others():
    assert cycle(graph()) is None


def test_the_example_script_imports_the_plugin_first_and_unsloth_before_trl():
    """The one line the plugin asks for comes first; Unsloth asks to come before TRL, transformers and torch."""
    tree = ast.parse((PACKAGE.parent / "examples" / "train.py").read_text())
    order = [
        (node.names[0].name if isinstance(node, ast.Import) else node.module).split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert order[0] == NAME
    assert order.index("unsloth") < min(order.index(name) for name in ("trl", "torch", "datasets"))


def room(module):
    """'core', 'proof' or 'tools': the room a module of the package belongs to. `python -m
    unsloth_diffusion_norm` (__main__) is the command line, so a tool."""
    parts = module.split(".")
    if parts[1:] == ["__main__"]:
        return "tools"
    return parts[1] if len(parts) > 1 and parts[1] in ("proof", "tools") else "core"


def test_imports_run_from_the_tools_to_the_proof_to_the_core():
    allowed = {"core": {"core"}, "proof": {"proof", "core"}, "tools": {"tools", "proof", "core"}}
    against = sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if room(target) not in allowed[room(name)]
    )
    assert against == []
    assert room(f"{NAME}.tools.cli") == "tools" and room(f"{NAME}.proof.tiny_model") == "proof"
    assert room(f"{NAME}.patches") == room(NAME) == "core"


def test_the_console_script_lives_in_the_tools_room():
    import tomllib

    scripts = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert room(scripts["unsloth-diffusion-norm"].split(":")[0]) == "tools"


def test_no_module_is_over_500_lines():
    """A module that grows past this is two ideas: split it at its seam (as impact/ and wrappers.py were)."""
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: lines for name, lines in sizes.items() if lines > 500} == {}

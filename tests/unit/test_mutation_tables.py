"""scripts/mutation.py names the core's functions and mutants (its tables, mutation/equivalent.txt, the result
files) by their qualified names: each must name a function or method the core has, or a rename leaves it
silently matching nothing. Reads the core with ast: imports none of it (nor Unsloth)."""

import ast
import fnmatch
import glob
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("mutation_script", os.path.join(ROOT, "scripts", "mutation.py"))
mutation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation)


def core_functions():
    """{qualified name: mutmut's name} of every function mutmut mutates: the core's module-level functions and
    the methods of its module-level classes (__main__.py is not mutated: pyproject.toml's do_not_mutate)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "unsloth_diffusion_norm", "*.py"))):
        stem = os.path.basename(path)[: -len(".py")]
        if stem == "__main__":
            continue
        module = "unsloth_diffusion_norm" + ("" if stem == "__init__" else "." + stem)
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        for node in ast.parse(open(path, encoding="utf-8").read(), path).body:
            if isinstance(node, functions):
                found[f"{module}.{node.name}"] = f"{module}.x_{node.name}"
            elif isinstance(node, ast.ClassDef):
                for method in (item for item in node.body if isinstance(item, functions)):
                    found[f"{module}.{node.name}.{method.name}"] = f"{module}.xǁ{node.name}ǁ{method.name}"
    return found


CORE = core_functions()


def unknown_mutants(mutants):
    """The functions of these mutant names (`function#N`) that the core lacks, or a malformed name itself."""
    bad = set()
    for mutant in mutants:
        function, _, number = mutant.partition("#")
        if function not in CORE:
            bad.add(function)
        elif not number.isdigit():
            bad.add(mutant)
    return sorted(bad)


def function_lines():
    """{qualified name: the stripped lines of its source} of every function mutmut mutates."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "unsloth_diffusion_norm", "*.py"))):
        stem = os.path.basename(path)[: -len(".py")]
        module = "unsloth_diffusion_norm" + ("" if stem == "__init__" else "." + stem)
        source = open(path, encoding="utf-8").read()
        lines = source.splitlines()
        for node in ast.parse(source, path).body:
            members = [("", node)] if not isinstance(node, ast.ClassDef) else [(node.name + ".", m) for m in node.body]
            for prefix, member in members:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):  # whole lines: comments included
                    own = lines[member.lineno - 1 : member.end_lineno]
                    found[f"{module}.{prefix}{member.name}"] = {line.strip() for line in own}
    return found


@pytest.mark.parametrize("path", [mutation.EQUIVALENT, mutation.OUT_OF_REACH], ids=os.path.basename)
def test_each_named_mutant_is_pinned_to_a_line_its_function_still_has(path):
    """Each entry of mutation/equivalent.txt (and out-of-reach.txt) carries the lines its mutant changed when it
    was judged (`scripts/mutation.py report` writes them and refuses an entry whose number now names another
    mutation). A function whose judged line is gone has changed: its mutants were renumbered."""
    pins, lines = mutation.reasons(path, pinned=True), function_lines()
    unpinned = sorted(set(mutation.reasons(path)) - set(pins))
    gone = sorted(
        mutant
        for mutant, mutated in pins.items()
        if not any(line[1:].strip() in lines.get(mutant.partition("#")[0], ()) for line in mutated if line[0] == "-")
    )
    name = os.path.basename(path)
    assert not unpinned, f"mutation/{name} entries without their mutated lines: {unpinned}"
    assert not gone, f"mutation/{name} entries whose judged line the function no longer has: {gone}"


def test_the_fresh_and_shape_tables_name_functions_the_core_has():
    fresh = [pattern for pattern in mutation.FRESH if not fnmatch.filter(CORE, pattern)]
    shape = sorted(set(mutation.SHAPE_SPECIFIC) - set(CORE))
    assert not fresh + shape, (
        f"scripts/mutation.py names functions the core does not have (renamed? name them anew): "
        f"FRESH {fresh}, SHAPE_SPECIFIC {shape}"
    )


@pytest.mark.parametrize("path", [mutation.EQUIVALENT, mutation.OUT_OF_REACH], ids=os.path.basename)
def test_the_named_mutants_are_of_functions_the_core_has(path):
    bad = unknown_mutants(mutation.reasons(path))
    assert not bad, f"mutation/{os.path.basename(path)} names functions the core does not have (renamed?): {bad}"


@pytest.mark.parametrize("result", mutation.result_files(), ids=lambda result: result["label"])
def test_the_result_files_are_of_functions_the_core_has(result):
    bad = unknown_mutants(result["mutants"])
    assert not bad, (
        f"mutation/results-{result['label']}.json has mutants of functions the core does not have (renamed or "
        f"gone? `scripts/mutation.py run --label {result['label']} --mutants OLD NEW` drops the old name's "
        f"verdicts and runs the new one's mutants): {bad}"
    )


@pytest.mark.parametrize(
    ("mangled", "qualified"),
    [
        (
            "unsloth_diffusion_norm.patched.x__get_batch_samples__mutmut_12",
            "unsloth_diffusion_norm.patched._get_batch_samples#12",
        ),
        (
            "unsloth_diffusion_norm.per_sample.xǁDataOrderǁ__init____mutmut_1",
            "unsloth_diffusion_norm.per_sample.DataOrder.__init__#1",
        ),
        ("unsloth_diffusion_norm.x__switch__mutmut_20", "unsloth_diffusion_norm._switch#20"),  # in __init__.py
        (  # a class whose name is not capitalised: only the module files tell a method from a function
            "unsloth_diffusion_norm.activation.xǁunpatchedǁ__exit____mutmut_3",
            "unsloth_diffusion_norm.activation.unpatched.__exit__#3",
        ),
        ("unsloth_diffusion_norm.window.xǁWindowǁnoise", "unsloth_diffusion_norm.window.Window.noise"),
        (
            "unsloth_diffusion_norm.hooks.xǁ_PostImportFinderǁ*",
            "unsloth_diffusion_norm.hooks._PostImportFinder.*",
        ),
        (
            "unsloth_diffusion_norm.loss.x_dense_cross_entropy__mutmut_*",
            "unsloth_diffusion_norm.loss.dense_cross_entropy#*",
        ),
    ],
)
def test_mutmut_names_translate_to_qualified_names_and_back(mangled, qualified):
    assert mutation.qualified(mangled) == qualified
    assert mutation.mangled(qualified) == mangled
    assert mutation.mangled(mutation.qualified(mangled)) == mangled


def test_every_function_of_the_core_translates_as_mutmut_names_it():
    assert CORE
    for name, mutmut in CORE.items():
        assert mutation.mangled(name + "#7") == mutmut + "__mutmut_7"
        assert mutation.qualified(mutmut + "__mutmut_7") == name + "#7"

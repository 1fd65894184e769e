"""Post-import hooks: run a function right after a named module has executed, or now if it already has.

What wrapt.register_post_import_hook does, without importing wrapt at `import unsloth_diffusion_norm` (wrapt 2
pulls in asyncio: ~40 ms). Imports nothing of the plugin.
"""

import sys


def run_after_import(hooks):
    """{module name: hook(module)}: each hook once, right after its module's body has run (now, for a module
    already imported)."""
    pending = {name: hook for name, hook in hooks.items() if name not in sys.modules}
    if pending:
        sys.meta_path.insert(0, _PostImportFinder(pending))
    for name, hook in hooks.items():
        if name not in pending:
            hook(sys.modules[name])


class _PostImportFinder:
    """Finds a hooked module with the finders after it, and gives its spec a loader that runs the hook."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.finding = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks or name in self.finding:
            return None
        self.finding.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.finding.discard(name)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, self.hooks.pop(name))
        return spec


class _HookedLoader:
    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: Unsloth reads its own source
        return getattr(self._loader, name)

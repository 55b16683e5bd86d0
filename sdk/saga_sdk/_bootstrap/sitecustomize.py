"""Start-up hook that `saga run` puts first on `PYTHONPATH` (see `saga_sdk.launcher`).

Python imports `sitecustomize` once at start-up, from the first directory on its
path that has one; this one then:
  1. runs the `sitecustomize` that would have been imported without us (the next
     one on `sys.path`), so an environment's own start-up code still runs;
  2. unless `SAGA_INTEGRATIONS=0`, arranges for each SAGA integration to switch on
     right after its framework is first imported, so a process that never imports
     the framework pays nothing: `openai` -> `saga_sdk.integrations.openai.instrument()`,
     `langchain_core` -> import `saga_sdk.integrations.langchain` (its
     `SAGA_LANGCHAIN=1` hook), `autogen_core` -> `saga_sdk.integrations.autogen.instrument()`.
Nothing here may raise or stop the program: every step is guarded, and a failure
is reported once on stderr only when `SAGA_DEBUG` is set.
"""

import os
import sys


def _debug(message):
    if os.environ.get("SAGA_DEBUG"):
        try:
            sys.stderr.write(f"saga bootstrap: {message}\n")
        except Exception:
            pass


def _chain():
    """Run the next `sitecustomize` on the path, as if we were not there."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _import_saga_sdk():
    """`saga_sdk`, from the path or else from `SAGA_SDK_PATH` (the launcher's copy),
    loading that one package only, never the rest of its directory."""
    try:
        import saga_sdk
        return saga_sdk
    except ImportError:
        location = os.environ.get("SAGA_SDK_PATH")
        if not location:
            raise
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("saga_sdk", [location])
    if spec is None:
        raise ImportError(f"saga_sdk not found in {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["saga_sdk"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("saga_sdk", None)
        raise
    return module


def _activate_openai():
    _import_saga_sdk()
    from saga_sdk.integrations import openai as saga_openai
    saga_openai.instrument()


def _activate_langchain():
    _import_saga_sdk()
    os.environ.setdefault("SAGA_LANGCHAIN", "1")
    import saga_sdk.integrations.langchain  # noqa: F401  (importing registers the hook)


def _activate_autogen():
    _import_saga_sdk()
    from saga_sdk.integrations import autogen as saga_autogen
    saga_autogen.instrument()


HOOKS = {"openai": _activate_openai, "langchain_core": _activate_langchain, "autogen_core": _activate_autogen}


def _run_hook(name):
    try:
        HOOKS[name]()
        _debug(f"{name} integration on")
    except BaseException as exc:  # an integration must never take the program down
        if isinstance(exc, KeyboardInterrupt):
            raise
        _debug(f"{name} integration not activated: {type(exc).__name__}: {exc}")


class _AfterImport:
    """A meta-path finder that runs a hook right after a watched top-level module
    has executed, by wrapping that one module's loader for the duration."""

    def __init__(self, names):
        self.pending = set(names)
        self.busy = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending or name in self.busy:
            return None
        import importlib.util

        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            return None
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        self.pending.discard(name)
        spec.loader = _HookedLoader(spec.loader, name)
        return spec


class _HookedLoader:
    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module sees its own loader, not ours (importlib.resources, inspect...).
        try:
            module.__spec__.loader = self._loader
            module.__loader__ = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        _run_hook(self._name)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


def _activate():
    if os.environ.get("SAGA_INTEGRATIONS", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    watched = []
    for name in HOOKS:
        if name in sys.modules:
            _run_hook(name)
        else:
            watched.append(name)
    if watched:
        sys.meta_path.insert(0, _AfterImport(watched))


for _step in (_chain, _activate):
    try:
        _step()
    except BaseException as _exc:  # noqa: B902  start-up must go on whatever happens
        if isinstance(_exc, KeyboardInterrupt):
            raise
        _debug(f"{_step.__name__} failed: {type(_exc).__name__}: {_exc}")

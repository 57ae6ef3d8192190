"""The packages' import structure, read from the source: no cycles, the core free of transport and
serialization, no package reaching into another's private modules, in-function imports only with a reason.

See docs/architecture.md ("Import layering") for the rules these checks hold the code to.
"""
import ast
import pathlib

import pytest

from proc_testlib import ROOT

_PACKAGES = ("replay_tf", "rlds_tf")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict:
    """Module name -> (path, parsed tree) for every module of both packages (generated *_pb2 included)."""
    found = {}
    for package in _PACKAGES:
        for path in sorted(pathlib.Path(ROOT, package).rglob("*.py")):
            found[_module_name(path)] = (path, ast.parse(path.read_text(encoding="utf-8")))
    return found


_SOURCES = _sources()


class _Import:
    """One import statement of one of our modules: what it names, where, and whether inside a function."""

    def __init__(self, module: str, targets: list, node: ast.stmt, in_function: bool):
        self.module, self.targets, self.node, self.in_function = module, targets, node, in_function


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _own(name: str) -> str:
    """The longest of our modules that `name` (a module or a name inside one) refers to, or ''."""
    while name and name not in _SOURCES:
        name = name.rpartition(".")[0]
    return name


def _imports() -> list:
    found = []
    for module, (path, tree) in _SOURCES.items():
        is_package = path.name == "__init__.py"

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = _resolve(module, is_package, child)
                    targets = [f"{base}.{alias.name}" if _own(f"{base}.{alias.name}") == f"{base}.{alias.name}"
                               else base for alias in child.names]
                else:
                    visit(child, inner)
                    continue
                found.append(_Import(module, targets, child, in_function))

        visit(tree, False)
    return found


_IMPORTS = _imports()


def _edges() -> dict:
    """Module -> our modules it imports outside functions (TYPE_CHECKING blocks included: a cycle there is
    still a cycle for a reader)."""
    edges = {module: set() for module in _SOURCES}
    for imp in _IMPORTS:
        if not imp.in_function:
            for target in imp.targets:
                own = _own(target)
                if own and own != imp.module and not imp.module.startswith(f"{own}."):
                    edges[imp.module].add(own)
    return edges


def _cycles(edges: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_sources_are_read():
    # (the checks below mean something only if they see the modules and their imports)
    assert {"replay_tf.client", "replay_tf.core.table", "rlds_tf.loading"} <= set(_SOURCES)
    assert "replay_tf.core.chunk_store" in _edges()["replay_tf.core.table"]


def test_no_import_cycles():
    # Packages' __init__ modules import their submodules; a submodule importing its own package is left out
    # of the graph (it does not make the package's modules depend on each other).
    assert _cycles(_edges()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# (TensorFlow is not among them: a table's signature is a nest of tf.TensorSpec, imported where checked.)
@pytest.mark.parametrize("forbidden", ["replay_tf.wire", "replay_tf.grpc", "replay_tf.checkpointing",
                                       "google.protobuf", "grpc"])
def test_the_server_core_knows_no_transport_or_serialization(forbidden):
    offending = [(imp.module, imp.node.lineno, target) for imp in _IMPORTS
                 if imp.module.startswith("replay_tf.core")
                 for target in imp.targets if target == forbidden or target.startswith(f"{forbidden}.")]
    assert offending == []


def test_only_the_service_adapter_and_the_remote_client_import_the_grpc_layer():
    # (`Server` starts the service; `make_transport` builds the remote transport for a server elsewhere.)
    found = {}
    for imp in _IMPORTS:
        if imp.module == "replay_tf.grpc" or imp.module.startswith("replay_tf.grpc."):
            continue
        for target in imp.targets:
            own = _own(target)
            if own == "replay_tf.grpc" or own.startswith("replay_tf.grpc."):
                found.setdefault(imp.module, set()).add(own)
    assert found == {"replay_tf.server": {"replay_tf.grpc.server.service"},
                     "replay_tf.transport.base": {"replay_tf.grpc.client.client_transport"}}


@pytest.mark.parametrize("side, other", [("client", "server"), ("server", "client")])
def test_the_grpc_client_and_server_do_not_import_each_other(side, other):
    offending = [(imp.module, imp.node.lineno, target) for imp in _IMPORTS
                 if imp.module.startswith(f"replay_tf.grpc.{side}")
                 for target in imp.targets if _own(target).startswith(f"replay_tf.grpc.{other}")]
    assert offending == []


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_module_imports(imports: list) -> list:
    """Imports of a private module (`buffers/_ring.py`) from outside the package it sits in."""
    offending = []
    for imp in imports:
        for target in imp.targets:
            parts = _own(target).split(".")
            for depth, part in enumerate(parts):
                if _private(part) and not f"{imp.module}.".startswith(".".join(parts[:depth]) + "."):
                    offending.append((imp.module, imp.node.lineno, ".".join(parts)))
    return offending


def _reach_ins(imports: list, sources: dict) -> list:
    """Private names of one of our modules used by another: imported by name, or read as an attribute of
    the imported module."""
    found = []
    for imp in imports:
        if isinstance(imp.node, ast.ImportFrom):
            base = _resolve(imp.module, sources[imp.module][0].name == "__init__.py", imp.node)
            for alias in imp.node.names:
                name = f"{base}.{alias.name}"
                if _private(alias.name) and _own(name) != name and _own(base) not in ("", imp.module):
                    found.append((imp.module, imp.node.lineno, name))
    for module, (path, tree) in sources.items():
        bound = {}  # local name -> our module it is bound to
        for imp in imports:
            if imp.module == module and isinstance(imp.node, ast.ImportFrom):
                base = _resolve(module, path.name == "__init__.py", imp.node)
                bound.update({alias.asname or alias.name: f"{base}.{alias.name}" for alias in imp.node.names
                              if _own(f"{base}.{alias.name}") == f"{base}.{alias.name}"})
            elif imp.module == module:
                bound.update({alias.asname: alias.name for alias in imp.node.names
                              if alias.asname and _own(alias.name) == alias.name})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and bound.get(node.value.id, module) != module):
                found.append((module, node.lineno, f"{bound[node.value.id]}.{node.attr}"))
    return found


def test_private_modules_are_imported_only_inside_their_package():
    # A private module belongs to the package it sits in; other packages and subpackages use that package's
    # public modules.
    assert _private_module_imports(_IMPORTS) == []


def test_no_module_reaches_into_another_modules_private_names():
    assert _reach_ins(_IMPORTS, _SOURCES) == []


def test_the_private_checks_find_planted_reach_ins(monkeypatch, tmp_path):
    planted = {
        "replay_tf.sampling._planted": "X = 1\n_Y = 2\n",
        "replay_tf.core._planted_user": ("from replay_tf.sampling import _planted\n"
                                         "from replay_tf.sampling._planted import _Y\n"
                                         "from replay_tf.core import table as t\n"
                                         "Z = _planted.X + t._hidden\n"),
    }
    for module, text in planted.items():
        monkeypatch.setitem(_SOURCES, module, (tmp_path / f"{module}.py", ast.parse(text)))
    imports = [imp for imp in _imports() if imp.module in planted]
    assert [entry[2] for entry in _private_module_imports(imports)] == ["replay_tf.sampling._planted"] * 2
    assert [entry[2] for entry in _reach_ins(imports, {m: _SOURCES[m] for m in planted})] == [
        "replay_tf.sampling._planted._Y", "replay_tf.core.table._hidden"]


def test_replay_tf_top_level_holds_the_public_modules_only():
    # The modules named after Reverb's and TF-Agents' public modules; everything else is in a subpackage.
    top = sorted(path.name for path in pathlib.Path(ROOT, "replay_tf").glob("*.py"))
    assert len(top) <= 25, top
    assert [name for name in top if _private(name) and name != "__init__.py"] == []


# Modules allowed over the size limit: each holds one idea a reader follows top to bottom.
_ONE_IDEA_MODULES: dict = {}


def test_modules_stay_under_600_lines():
    lengths = {module: len(path.read_text(encoding="utf-8").splitlines())
               for module, (path, _) in _SOURCES.items() if not module.endswith("_pb2")}
    assert {module: n for module, n in lengths.items() if n > 600 and module not in _ONE_IDEA_MODULES} == {}


def test_in_function_imports_of_our_modules_say_why():
    # Allowed only to defer TensorFlow or gRPC (or a module that imports them) past start-up; the line says so.
    lines = {module: path.read_text(encoding="utf-8").splitlines() for module, (path, _) in _SOURCES.items()}
    unexplained = []
    for imp in _IMPORTS:
        if imp.in_function and any(_own(target) for target in imp.targets):
            text = " ".join(lines[imp.module][imp.node.lineno - 1:imp.node.end_lineno])
            if "noqa: PLC0415" not in text or "(" not in text.split("noqa: PLC0415", 1)[1]:
                unexplained.append((imp.module, imp.node.lineno))
    assert unexplained == []

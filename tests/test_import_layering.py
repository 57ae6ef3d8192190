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


def test_no_package_imports_another_packages_private_module():
    offending = []
    for imp in _IMPORTS:
        for target in imp.targets:
            own = _own(target)
            if own and own.split(".")[0] != imp.module.split(".")[0]:
                if any(part.startswith("_") and part != "__init__" for part in own.split(".")):
                    offending.append((imp.module, imp.node.lineno, own))
    assert offending == []


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

"""The package's layers point one way and no import cycle exists.

Every `import` and `from ... import` of a tfgc module (at the top of a file
or inside a function) is an edge; the layers are tfgc's subpackages and
top-level modules. Compressors and communicators share the contract in
`tfgc.core` and never import each other; the kernels import nothing above
them.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfgc"

# What each layer may import besides itself.
ALLOWED = {
    "_arguments": set(),
    "_keras_compat": set(),
    "quiet": set(),
    "core": {"_arguments"},
    "ops": {"_arguments"},
    "compressors": {"core", "ops", "_arguments"},
    "communicators": {"core", "ops", "_arguments"},
    "optimizers": {
        "core", "ops", "compressors", "communicators", "_arguments",
        "_keras_compat",
    },
    "callbacks": {"optimizers"},
    "launch": {"quiet"},
    # The package itself loads its public names lazily.
    "tfgc": {"_keras_compat", "optimizers", "callbacks", "communicators",
             "compressors", "ops"},
}  # fmt: skip


def module_name(path: pathlib.Path) -> str:
    parts = ("tfgc", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(name: str) -> str:
    """The module `name` refers to: a module, or the package of a name
    imported from it."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    if path.with_suffix(".py").exists() or path.is_dir():
        return name
    return name.rsplit(".", 1)[0]


def imports() -> dict[str, set[str]]:
    """module -> the tfgc modules it imports."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        package = module if path.name == "__init__.py" else (
            module.rsplit(".", 1)[0])  # fmt: skip
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) -
                                               node.level + 1]  # fmt: skip
                    base = ".".join([*parts, *([base] if base else [])])
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            edges.update(resolve(n) for n in names if n.startswith("tfgc"))
        graph[module] = edges - {module}
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tfgc"


def test_layers_import_only_what_they_may():
    wrong = [
        f"{module} imports {dep}"
        for module, deps in sorted(imports().items())
        for dep in sorted(deps)
        if layer(dep) != layer(module)
        and layer(dep) not in ALLOWED[layer(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_every_layer_is_known():
    assert {layer(m) for m in imports()} <= set(ALLOWED)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(imports())
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize(
    "graph, cycle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ],
)
def test_find_cycle_finds_them(graph, cycle):
    assert find_cycle(graph) == cycle

"""The package's layering: data flows one way, and no folder imports a folder above it.

Ranks go from the bottom (no gitops imports but the bottom) to the top (the
command line). A module may import its own package and anything of a lower
rank; an import of an equal or higher rank is a loop between folders.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gitops"

RANK = {
    # bottom: no repo model, no I/O policy
    "errors": 0, "__version__": 0, "apipaths": 0, "printable": 0, "memo": 0, "units": 0, "redact": 0, "hostport": 0,
    "safeio": 1, "pki": 1, "httpserve": 0.5, "keypair": 0.5,
    "logs": 1, "gitrepo": 1, "secrets": 1, "metrics": 1, "procs": 2,
    "cri": 2, "state": 2, "kubeapi": 2, "pods": 2, "nodefiles": 2.5,
    # the OIDC provider (SIP's auth pod runs it) and its kubectl login stand alone; the model checks hashes with it
    "oidc": 2.5,
    "agent": 3, "model": 3, "kubeconfig": 3, "coordination": 3, "etcdclient": 3,
    "backup": 4, "notify": 4,
    "sip": 4,
    # the stages: compile and observe feed plan, plan feeds apply, the engine owns the loop
    "compile": 5, "observe": 5,
    # learning what only the hypervisors know is not planning: neither imports the other;
    # the lab builds the jump host's image from compile's jump host
    # a worker's join and leave stand alone; the lab abandons a worker still joined when it goes down
    "worker": 5.5,
    # a machine made a hypervisor (`gitops hypervisor`) stands alone too; the lab makes its machines with it
    "hypervisor": 5.5,
    "learn": 6, "plan": 6, "lab": 6, "snapshots": 6,
    "apply": 7,
    "engine": 8,
    "status": 9, "source": 9,
    # the web UI reads the status branch and plans a branch against it; `gitops watch --ui` serves it
    "ui": 9.5,
    "controller": 10,
    "cli": 11, "__main__": 12,
}


def _unit(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]


def _imports(path: Path) -> set[str]:
    """The top-level units of gitops that `path` imports, at module level or inside functions,
    absolute or relative."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:  # relative: resolved against path's package
            package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-node.level]
            parts = [*package, *(node.module.split(".") if node.module else [])]
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gitops":
            parts = node.module.split(".")
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("gitops.")}
    return out


def test_every_folder_has_a_rank():
    units = {_unit(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert units <= set(RANK), sorted(units - set(RANK))


def test_no_folder_imports_a_folder_above_it_or_beside_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "pb" in path.relative_to(PACKAGE).parts:
            continue  # generated protobuf code
        unit = _unit(path)
        for target in sorted(_imports(path) - {unit}):
            if RANK.get(target, 99) >= RANK.get(unit, -1):
                wrong.append(f"{path.relative_to(PACKAGE.parent)} ({unit}, rank {RANK.get(unit)}) imports "
                             f"gitops.{target} (rank {RANK.get(target)})")
    assert not wrong, "\n".join(wrong)


def test_apply_contains_no_planning():
    """apply executes payloads: it imports no diff, no engine, nothing of compile."""
    for path in (PACKAGE / "apply").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for forbidden in ("gitops.plan.diff", "gitops.engine", "gitops.compile", "compile_desired", "make_plan",
                          "certificate_problem"):
            assert forbidden not in text, f"{path.name} uses {forbidden}"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The gitops modules `path` imports (a name imported from a package counts as its submodule when
    one of that name exists), at module level or inside functions, absolute or relative."""
    out = set()
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in modules else source)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules} - {me}


def test_no_two_modules_import_each_other():
    """Inside a folder too, imports go one way: no cycle between modules (inside functions included).
    A package's `__init__` re-exporting its own modules is the one allowed back edge."""
    paths = [p for p in PACKAGE.rglob("*.py") if "pb" not in p.relative_to(PACKAGE).parts]
    modules = {_module(p) for p in paths}
    graph = {_module(p): _module_imports(p, modules) for p in paths}
    for name, targets in graph.items():  # a module importing its package's __init__: not a loop of code
        graph[name] = {t for t in targets if not name.startswith(f"{t}.")}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [node, target]) if target in stack
                              else f"{node} -> {target}")
            elif target not in state:
                visit(target, [*stack, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not cycles, "\n".join(cycles)


def _graph() -> tuple[dict[str, Path], dict[str, set[str]]]:
    """Every gitops module's path, and the gitops modules each imports (with the packages above it,
    whose `__init__` runs first)."""
    paths = {_module(p): p for p in PACKAGE.rglob("*.py") if "pb" not in p.relative_to(PACKAGE).parts}
    graph = {}
    for name, path in paths.items():
        parents = {".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)}
        graph[name] = (_module_imports(path, set(paths)) | parents) & set(paths) - {name}
    return paths, graph


def _definition(paths: dict[str, Path], module: str, name: str) -> tuple[str, ast.stmt | None]:
    """Where `name` of `module` is defined (following re-exports inside gitops): (module, its statement)."""
    tree = ast.parse(paths[module].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return module, node
        if isinstance(node, ast.ImportFrom) and node.module in paths and any(
                (a.asname or a.name) == name for a in node.names):
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            return _definition(paths, node.module, original)
    return module, None  # a constant (or a name from outside gitops)


def _compile_code(paths: dict[str, Path], module: str, name: str) -> str:
    """Why taking `name` from compile's `module` takes compile code ("" when it is data only): it is a
    function, a module, or a class whose body uses a function of its module."""
    if f"{module}.{name}" in paths:
        return f"the module {module}.{name}"
    where, node = _definition(paths, module, name)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and where.startswith("gitops.compile"):
        return f"the function {where}.{name}"
    if isinstance(node, ast.ClassDef):
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for other in sorted(used - {name}):
            home, code = _definition(paths, where, other)
            if isinstance(code, (ast.FunctionDef, ast.AsyncFunctionDef)) and home.startswith("gitops.compile"):
                return f"{where}.{name}, whose methods call {home}.{other}"
    return ""


def test_apply_reaches_no_compile_code_and_no_planning():
    """What apply can reach (its modules and, transitively, every gitops module they import, payloads
    included) takes only data from compile (classes and constants, never a function or a method calling
    one), and reaches no diff, rollout, learning or engine: apply computes nothing a plan can know."""
    paths, graph = _graph()
    reached = {m for m in paths if m.startswith("gitops.apply")}
    todo = list(reached)
    while todo:
        for target in graph[todo.pop()]:
            if target not in reached and not target.startswith("gitops.compile"):
                reached.add(target)
                todo.append(target)
    planning = {"gitops.plan.diff", "gitops.plan.rollout", "gitops.learn", "gitops.engine"}
    wrong = [f"apply reaches {m}" for m in sorted(reached & planning)]
    for module in sorted(reached):
        for node in ast.walk(ast.parse(paths[module].read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wrong += [f"{module} imports {a.name}" for a in node.names if a.name.startswith("gitops.compile")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gitops.compile"):
                for alias in node.names:
                    why = _compile_code(paths, node.module, alias.name)
                    wrong += [f"{module} takes {why}"] if why else []
    assert not wrong, "\n".join(wrong)


#: libraries that talk to the outside world (runtimes, clusters, processes, git): a module importing one does I/O
IO_LIBRARIES = ("grpc", "kubernetes", "git", "requests", "urllib3", "subprocess", "socket", "ssl", "http",
                "urllib.request")
#: data and computation only (modules, or packages with everything under them): what they reach, at import
#: time or inside functions, does no I/O. Planning reads observed data through `gitops.observe.types`, never
#: through a reader; a provider's data and the file provider are apart from the one that calls an API.
PURE = ("gitops.pods", "gitops.model.components", "gitops.observe.types", "gitops.sip.selection", "gitops.sip.hosts",
        "gitops.sip.fileprovider", "gitops.learn", "gitops.compile", "gitops.plan")


def _does_io(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        if any(n == lib or n.startswith(f"{lib}.") for n in names for lib in IO_LIBRARIES):
            return True
    return False


def test_pure_modules_reach_no_io():
    """A pure module reaches (transitively, package `__init__`s included) no module that imports an I/O library."""
    paths, graph = _graph()
    io = {m for m, path in paths.items() if _does_io(path)}
    wrong = []
    for module in sorted(m for m in paths if any(m == p or m.startswith(f"{p}.") for p in PURE)):
        via, todo = {module: [module]}, [module]
        while todo:
            here = todo.pop()
            for target in sorted(graph[here] - set(via)):
                via[target] = [*via[here], target]
                todo.append(target)
        wrong += [" -> ".join(via[m]) for m in sorted(set(via) & io)]
    assert not wrong, "\n".join(wrong)


def test_pure_list_names_modules():
    paths, _ = _graph()
    assert all(any(m == p or m.startswith(f"{p}.") for m in paths) for p in PURE)


def test_each_command_is_found_in_the_module_the_cli_loads_for_it():
    """`gitops CMD` imports only CMD's module (gitops.cli._Group.MODULES): the map must be right."""
    import importlib

    from gitops.cli import _Group

    for module in _Group.ALL:
        for command in importlib.import_module(f"gitops.cli.{module}").COMMANDS:
            assert _Group.MODULES.get(command.name, module) == module, command.name


def test_the_cri_client_stands_alone():
    """issue #45.4: the CRI client imports nothing of gitops but its own package and the bottom (errors,
    logs, the key-pair check): not the PKI."""
    used = set().union(*(_imports(path) for path in (PACKAGE / "cri").glob("*.py"))) - {"cri"}
    assert used <= {"errors", "logs", "keypair"}, sorted(used)


def test_the_plans_data_types_live_below_the_compiler():
    """issue #45.4: a plan's actions and payloads import no stage: their node-file types live in
    `gitops.nodefiles`, where compile and plan both may import them."""
    for name in ("actions.py", "payloads.py"):
        used = _imports(PACKAGE / "plan" / name)
        assert not used & {"compile", "observe", "apply", "engine"}, (name, sorted(used))


def test_every_git_command_goes_through_the_one_git_adapter():
    """Only `gitops/gitrepo.py` runs git: no other module imports GitPython (or gitdb) or starts a process
    whose argv begins with "git"."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "gitrepo.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name.split(".")[0] in ("git", "gitdb") for name in imported):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {imported}")
            if (isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(node.elts[0], ast.Constant)
                    and node.elts[0].value == "git"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} runs git itself")
    assert not offenders, offenders

"""The suite's lab groups (tests/conftest.py LAB_GROUPS): two pytest-xdist workers run two groups at once, so
no two groups may share a lab or an address, and every module that starts a lab or real servers is in one.

`conftest.require_lab_group` fails such a test at run time under xdist; this reads the modules' source so
that a module left out is found by any run, with or without xdist.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import LAB_FIXTURES, LAB_GROUPS

TESTS = Path(__file__).resolve().parent
#: what starts a lab or real servers, as the test modules call it
STARTS = re.compile(r"\b(require_root|running_lab|lab_world|lab_tempdir|kube_api_server|etcd_binary|labmod\.up)\(")
#: `127.0.T` for the third octet T, in a string
ADDRESS = re.compile(r"127\.0\.([1-9]\d*)(\.\d+)?")
#: addresses a module binds that no lab of its octet ever takes (a lab takes `127.0.T.254` on the host
#: and nothing else): the example repo's BareMetalHost r01-node-01, served by the SIP test of test_apply_lab
NOT_A_LAB = {"127.0.20.11"}


def _group(tree: ast.Module) -> str | None:
    """The module's `pytest.mark.lab(NAME)`, from its `pytestmark`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            for call in ast.walk(node.value):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "lab"
                        and call.args and isinstance(call.args[0], ast.Constant)):
                    return str(call.args[0].value)
    return None


def _uses_session_lab(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
               and LAB_FIXTURES & {arg.arg for arg in node.args.args} for node in ast.walk(tree))


def _modules() -> dict[str, tuple[str, ast.Module]]:
    return {path.name: (text, ast.parse(text)) for path in sorted(TESTS.glob("test_*.py"))
            for text in [path.read_text()]}


def _imports(tree: ast.Module) -> dict[str, list[str]]:
    """The test modules `tree` imports names from, with those names."""
    return {f"{node.module}.py": [alias.name for alias in node.names] for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("test_")}


def test_every_module_that_starts_a_lab_or_servers_is_in_a_known_group() -> None:
    """A module that starts servers itself, uses the session lab, or imports from a module of a group (its
    helpers start servers: test_etcd_upkeep starts test_backup's etcd) is in a group; one that imports another
    group's address constant (IP, SUBNET) is in that group."""
    modules = _modules()
    missing, unknown, apart = [], [], []
    for name, (text, tree) in modules.items():
        group = _group(tree)
        imported = {source: names for source, names in _imports(tree).items()
                    if source in modules and _group(modules[source][1]) is not None}
        if group is None and (STARTS.search(text) or _uses_session_lab(tree) or imported):
            missing.append(name)
        elif group is not None and group not in LAB_GROUPS:
            unknown.append(f"{name}: {group}")
        for source, names in imported.items():
            if any(n.isupper() for n in names) and _group(modules[source][1]) != group:
                apart.append(f"{name} uses {source}'s addresses in group {group}")
    assert (missing, unknown, apart) == ([], [], [])
    assert _group(modules["test_failover_lab.py"][1]) == "failover"  # (a module found through a helper)
    assert _group(modules["test_etcd_upkeep.py"][1]) == "etcd"  # (and through another test module)


def test_no_two_groups_share_a_lab_or_an_address() -> None:
    owners: dict[str, set[str]] = {}
    for name, (text, tree) in _modules().items():
        group = _group(tree)
        if group is None:
            continue
        octets = {m.group(1) for m in ADDRESS.finditer(text) if m.group(0) not in NOT_A_LAB}
        if _uses_session_lab(tree):
            octets.add("20")  # conftest's `lab`: 127.0.20
        for octet in octets:
            owners.setdefault(octet, set()).add(group)
    shared = {f"127.0.{octet}": sorted(groups) for octet, groups in owners.items() if len(groups) > 1}
    assert shared == {}
    assert owners["20"] == {"session"} and owners["24"] == {"workers"}  # (the check sees what it must)

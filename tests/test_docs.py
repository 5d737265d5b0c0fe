"""The documentation site (`docs/`, MkDocs with the Material theme): it builds with `--strict` (every page in
the navigation, every link and anchor found), its generated reference is current with `schemas/` and the CLI,
and README.md stays a short entry page (at most 250 lines, every page it links exists)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strictly(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in ("index.html", "reference/resources/index.html", "reference/cli/index.html",
                 "development/index.html", "tutorials/first-cluster/index.html", "operations/security/index.html"):
        assert page in built


def test_the_generated_reference_is_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/gen-reference.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    resources = (ROOT / "docs/reference/resources.md").read_text()
    for schema in sorted((ROOT / "schemas").glob("*.schema.json")):  # every resource has its section
        assert f"`schemas/{schema.name}`" in resources
    assert "| `spec.ingress.virtualIPs` |" in resources and "| `spec.portRange` |" in resources
    commands = (ROOT / "docs/reference/cli.md").read_text()
    for command in ("gitops plan", "gitops apply", "gitops hypervisor init", "gitops lab poweroff", "gitops watch"):
        assert f"`{command}`" in commands


def test_the_readme_is_a_short_entry_page_whose_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 20
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing

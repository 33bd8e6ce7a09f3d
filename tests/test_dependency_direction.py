"""The packages depend on each other in one direction only, and say so in their metadata.

Each package may import only itself and the Kiln packages it declares as dependencies, so
that it installs and works without its other siblings. Product code must not import the
parts of PyTorch that Kiln rebuilds.
"""

import ast
import pathlib
import re
import tomllib

import pytest

PACKAGES_DIR = pathlib.Path(__file__).resolve().parents[1] / "packages"

# Which Kiln distributions each distribution may depend on.
ALLOWED = {
    "kiln-capture": set(),
    "kiln-autograd": set(),
    "kiln-loopir": set(),
    "kiln-triton": {"kiln-loopir", "kiln-cpp"},  # kiln-cpp: the native host program
    "kiln-cpp": {"kiln-loopir"},
    "kiln-cudagraphs": set(),
    "kiln": {
        "kiln-capture",
        "kiln-autograd",
        "kiln-loopir",
        "kiln-triton",
        "kiln-cpp",
        "kiln-cudagraphs",
    },
}
FORBIDDEN_TORCH_MODULES = (
    "torch._dynamo",
    "torch._inductor",
    "torch._functorch.aot_autograd",
    "torch._functorch.partitioners",
)


def import_name(dist: str) -> str:
    return dist.replace("-", "_")


def read_project(dist: str) -> dict:
    return tomllib.loads((PACKAGES_DIR / dist / "pyproject.toml").read_text())["project"]


def declared_kiln_dependencies(dist: str) -> dict[str, str]:
    """Kiln sibling name -> its version specifier, from the package's dependencies."""
    found = {}
    for requirement in read_project(dist)["dependencies"]:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement).groups()
        if name in ALLOWED:
            found[name] = spec
    return found


def imported_modules(folder: pathlib.Path) -> set[str]:
    modules = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module)
    return modules


def test_every_package_is_known():
    on_disk = {p.name for p in PACKAGES_DIR.iterdir() if (p / "pyproject.toml").exists()}
    assert on_disk == set(ALLOWED)


@pytest.mark.parametrize("dist", sorted(ALLOWED))
def test_declared_dependencies_follow_the_direction(dist):
    assert set(declared_kiln_dependencies(dist)) == ALLOWED[dist]


@pytest.mark.parametrize("dist", sorted(ALLOWED))
def test_sibling_ranges_are_bounded(dist):
    for sibling, spec in declared_kiln_dependencies(dist).items():
        assert ">=" in spec and "<" in spec.replace("<=", ""), (
            f"{dist} requires {sibling}{spec}: give it a lower and an upper bound"
        )


@pytest.mark.parametrize("dist", sorted(ALLOWED))
def test_imports_only_declared_siblings(dist):
    allowed = {import_name(dist)} | {import_name(d) for d in declared_kiln_dependencies(dist)}
    kiln_imports = set()
    for folder in (PACKAGES_DIR / dist / "src", PACKAGES_DIR / dist / "tests"):
        kiln_imports |= {
            m.split(".")[0]
            for m in imported_modules(folder)
            if m.split(".")[0] in {import_name(d) for d in ALLOWED}
        }
    assert kiln_imports <= allowed, f"{dist} imports undeclared siblings {kiln_imports - allowed}"


@pytest.mark.parametrize("dist", sorted(ALLOWED))
def test_product_code_does_not_import_what_kiln_rebuilds(dist):
    used = {
        m
        for m in imported_modules(PACKAGES_DIR / dist / "src")
        if m.startswith(FORBIDDEN_TORCH_MODULES)
    }
    assert not used, f"{dist} imports {sorted(used)}: Kiln's own packages replace these"


@pytest.mark.parametrize("dist", sorted(ALLOWED))
def test_version_is_read_from_about_file(dist):
    config = tomllib.loads((PACKAGES_DIR / dist / "pyproject.toml").read_text())
    assert config["tool"]["hatch"]["version"]["path"] == f"src/{import_name(dist)}/__about__.py"
    assert "version" in config["project"]["dynamic"]
    for name in ("README.md", "CHANGELOG.md"):
        assert (PACKAGES_DIR / dist / name).exists(), f"{dist} has no {name}"

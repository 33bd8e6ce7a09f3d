"""Development sessions: tests per package, end-to-end, slow, integration, lint, demo, bench,
wheels, and the README's commands (readme).

Every session builds its own virtual environment and installs what it needs, so each one
works on a fresh machine: torch comes from the CPU build that pip finds on local disk.
"""

import pathlib
import re
import tomllib

import nox

ROOT = pathlib.Path(__file__).parent
PACKAGES_DIR = ROOT / "packages"
TORCH = "torch==2.13.0"
# Third-party wheels the GPU machine lacks; they travel with our own (see docs/development.md).
GPU_THIRD_PARTY = [
    "bytecode==0.19.1",
    "pytest==9.2.0",
    "pluggy==1.7.0",
    "iniconfig==2.3.1",
    "expecttest==0.3.0",
]

nox.options.sessions = ["tests"]
nox.options.error_on_external_run = True


def read_project(dist: str) -> dict:
    return tomllib.loads((PACKAGES_DIR / dist / "pyproject.toml").read_text())["project"]


PACKAGES = sorted(p.name for p in PACKAGES_DIR.iterdir() if (p / "pyproject.toml").exists())


def kiln_dependencies(dist: str) -> list[str]:
    names = (
        re.match(r"[A-Za-z0-9_.-]+", req).group(0) for req in read_project(dist)["dependencies"]
    )
    return [name for name in names if name in PACKAGES]


def with_siblings(dist: str) -> list[str]:
    """``dist`` and every Kiln package it needs, dependencies first."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        for dep in kiln_dependencies(name):
            visit(dep)
        if name not in ordered:
            ordered.append(name)

    visit(dist)
    return ordered


def install(session: nox.Session, dists: list[str], extra: str = "test") -> None:
    """torch first (so no range pulls another build), then our packages, editable."""
    session.install(TORCH)
    session.install(*(f"-e{PACKAGES_DIR / d}[{extra}]" for d in dists))


def pytest(session: nox.Session, *args: str) -> None:
    # Exit code 5 means "no tests collected": a package without tests yet is not a failure.
    session.run("pytest", *args, *session.posargs, success_codes=[0, 5])


@nox.session
@nox.parametrize("package", [nox.param(p, id=p) for p in PACKAGES + ["end-to-end"]])
def tests(session: nox.Session, package: str) -> None:
    """Unit tests of one package, installed with only the siblings it declares."""
    if package == "end-to-end":
        install(session, PACKAGES)
        pytest(session, "tests", "-m", "not slow and not gpu")
        return
    session.run(
        "pip", "wheel", "--no-deps", "-q", "-w", session.create_tmp(), f"packages/{package}"
    )
    install(session, with_siblings(package))
    pytest(session, f"packages/{package}/tests", "-m", "not slow and not gpu")


@nox.session
def slow(session: nox.Session) -> None:
    """Every package's slow tests (the OpInfo sweeps among them), on the CPU."""
    install(session, PACKAGES)
    pytest(session, *(f"packages/{p}/tests" for p in PACKAGES), "-m", "slow and not gpu")


@nox.session
def integration(session: nox.Session) -> None:
    """Real-model suites and slow tests, on the CPU."""
    install(session, PACKAGES)
    session.install("transformers>=4.46,<5.24")  # as the packages' test extras
    pytest(
        session,
        "integration",
        "tests",
        *(f"packages/{p}/tests" for p in PACKAGES),
        "-m",
        "slow and not gpu",
    )


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """Compile a Hugging Face model on the CPU and print what it gained."""
    install(session, PACKAGES)
    session.install("transformers>=4.46")
    session.run("python", "integration/demo.py")


@nox.session
def bench(session: nox.Session) -> None:
    """CPU benchmarks: Kiln against eager and torch.compile, measured in one run."""
    install(session, PACKAGES)
    session.install("transformers>=4.46")
    session.run("python", "integration/bench.py", *session.posargs)


@nox.session(name="gpu-wheels")
def gpu_wheels(session: nox.Session) -> None:
    """Build the wheels that the GPU entry point needs into .whl/ (docs/development.md)."""
    out = ROOT / ".whl"
    for old in out.glob("*.whl"):
        old.unlink()
    session.install("pip")
    for dist in PACKAGES:
        session.run("pip", "wheel", "--no-deps", "-q", "-w", str(out), f"packages/{dist}")
    session.run(
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        "-d",
        str(out),
        *GPU_THIRD_PARTY,
    )


@nox.session
def wheels(session: nox.Session) -> None:
    """The wheel of every package, as a release would upload them, into dist/."""
    out = ROOT / "dist"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    session.install("pip")
    for dist in PACKAGES:
        session.run("pip", "wheel", "--no-deps", "-q", "-w", str(out), f"packages/{dist}")
    session.log(f"{len(list(out.glob('*.whl')))} wheels in {out}")


@nox.session
def readme(session: nox.Session) -> None:
    """The README's install commands for one package alone and its example, as written, in
    a fresh environment."""
    session.install(TORCH)
    session.run("python", "-m", "pip", "install", "./packages/kiln-capture")
    session.run("python", "-m", "pip", "install", "./packages/kiln-autograd")
    text = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    session.run("python", "-c", example)

"""The project as a user receives it: a wheel built from the source tree, installed into a clean
virtual environment (`python -m venv`, nothing of this environment visible), says its version in
`transduce --version` and `transduce.__version__`, both pyproject.toml's, carries its licence and
its documentation (`transduce docs`).

Nothing is downloaded: the wheel is built with this environment's setuptools
(`--no-build-isolation`) and installed without its dependencies (`--no-deps`), so the clean
environment has no torch at all, which also shows that `transduce --version` needs none."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.MULTILINE)
    assert found, "pyproject.toml has no [project] version"
    return found.group(1)


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert p.returncode == 0, (
        f"{' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    )
    return p


def setuptools_major() -> int:
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0])
    except Exception:  # not installed, or a version that is not a number
        return 0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the source tree (so that the build's own files, build/ and
    *.egg-info, land outside the checkout)."""
    if setuptools_major() < 77:
        pytest.skip(
            "building without downloads uses this environment's setuptools, which must be >= 77 "
            "(PEP 639 license expressions, as pyproject.toml's build-system requires)"
        )
    tmp = tmp_path_factory.mktemp("package")
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        tmp / "dist",
        tree,
    )
    (built,) = (tmp / "dist").glob("transduce-*.whl")
    return built


def pip_can_target_another_python() -> bool:
    """pip >= 22.3 installs into another interpreter's environment (`pip --python`)."""
    from importlib.metadata import version

    return tuple(int(x) for x in re.findall(r"\d+", version("pip"))[:2]) >= (22, 3)


@pytest.fixture(scope="module")
def venv(wheel) -> Path:
    """A clean virtual environment with the wheel installed and none of its dependencies. Without
    pip of its own where this pip can install into it (`--python`): seeding one costs more time
    than the rest of the test together."""
    env = wheel.parents[1] / "venv"
    python = env / "bin" / "python"
    if pip_can_target_another_python():
        run(sys.executable, "-m", "venv", "--without-pip", env)
        run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel)
    else:
        run(sys.executable, "-m", "venv", env)
        run(python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel)
    return env


def test_the_wheel_is_named_and_described_by_pyproject(wheel):
    version = pyproject_version()
    assert wheel.name == f"transduce-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"transduce-{version}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode("utf-8")
        assert z.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert f"\nVersion: {version}\n" in metadata
    assert "\nLicense-Expression: MIT\n" in metadata and "\nLicense-File: LICENSE\n" in metadata
    assert "Classifier: License ::" not in metadata  # PEP 639: the expression says it, not a classifier
    assert "\nRequires-Python: >=3.10\n" in metadata
    assert "Project-URL" not in metadata  # the project has no public URL: none that points elsewhere
    assert "Description-Content-Type: text/markdown" in metadata
    # the files the commands read at run time, beside the modules
    assert {"transduce/views/page.html", "transduce/serve/demo.html", "transduce/cli/__init__.py"} <= names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)
    # the documentation, inside the package, as the source tree's docs/ has it: `transduce docs TOPIC`
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) > 10
    with zipfile.ZipFile(wheel) as z:
        for page in pages:
            assert z.read(f"transduce/docs/{page.name}") == page.read_bytes(), page.name


def test_the_installed_command_prints_the_version_without_torch(venv):
    version = pyproject_version()
    bin_ = venv / "bin"
    got = run(bin_ / "python", "-c", "import importlib.metadata as m; print(m.version('transduce'))")
    assert got.stdout.strip() == version
    got = run(bin_ / "python", "-c", "import transduce, sys; print(transduce.__version__, 'torch' in sys.modules)")
    assert got.stdout.split() == [version, "False"]
    got = run(bin_ / "transduce", "--version")  # the clean environment has no torch: --version must not need it
    assert got.stdout.strip() == f"transduce {version}" and got.stderr == ""
    licence = list((venv / "lib").glob(f"python3*/site-packages/transduce-{version}.dist-info/licenses/LICENSE"))
    assert len(licence) == 1 and licence[0].read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert "Copyright (c) 2026 the transduce authors" in licence[0].read_text(encoding="utf-8")


def test_the_installed_command_prints_the_documentation_without_torch(venv):
    """A wheel's user reaches what every help page's "details: transduce docs TOPIC" names."""
    bin_ = venv / "bin"
    listing = run(bin_ / "transduce", "docs").stdout
    assert "training" in listing and "Training: `transduce train` and `transduce average`" in listing
    page = run(bin_ / "transduce", "docs", "training").stdout
    assert page == (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = run(bin_ / "transduce", "docs", "cli", "prepare").stdout
    assert section.startswith("## prepare\n") and "## synthetic" not in section

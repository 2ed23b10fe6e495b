"""jenga's wheel builds, installs in a fresh environment, and runs as a user would run it.

``python -m build --wheel`` builds it from this checkout; a new venv installs it with the exact
versions of constraints/dev.txt (torch 2.13.0+cpu, as in make test's .venv); then, from a folder
outside the checkout, ``jenga --version`` prints the wheel's version and the README's executed
quick starts (its ```python blocks) run with the installed package, which must be imported from
that venv, not from src/.

Prints one line per step; exits 1 naming the step that failed.  Takes minutes (torch installs).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "dev.txt"


def run(step: str, cmd: list[str], cwd: pathlib.Path) -> str:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAILED {step}: {' '.join(cmd)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    print(f"{step}: ok [{time.perf_counter() - start:.0f} s]", flush=True)
    return done.stdout


def quick_starts() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    if not blocks:
        sys.exit("FAILED: README.md has no ```python quick start")
    return "import jenga\nprint('imported from', jenga.__file__)\n" + "\n".join(blocks)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="jenga-check-wheel-") as name:
        tmp = pathlib.Path(name)
        run("build", [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp / "dist"), str(ROOT)], tmp)
        (wheel,) = (tmp / "dist").glob("jenga-*.whl")
        version = wheel.name.split("-")[1]
        run("venv", [sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
        bin_dir = tmp / "venv" / "bin"
        run(f"install {wheel.name} -c {CONSTRAINTS.relative_to(ROOT)}",
            [str(bin_dir / "pip"), "install", "--quiet", "-c", str(CONSTRAINTS), str(wheel)], tmp)
        printed = run("jenga --version", [str(bin_dir / "jenga"), "--version"], tmp).strip()
        if printed != f"jenga {version}":
            sys.exit(f"FAILED jenga --version: printed {printed!r}, the wheel is {version}")
        (tmp / "quick_start.py").write_text(quick_starts())
        out = run("README quick starts", [str(bin_dir / "python"), "quick_start.py"], tmp).splitlines()
        where = out[0].removeprefix("imported from ")
        if not where.startswith(str(tmp / "venv")):
            sys.exit(f"FAILED: the quick start imported jenga from {where}, not the wheel's venv")
        print(f"{printed}; quick starts printed {len(out) - 1} lines, e.g. {out[1]!r}")


if __name__ == "__main__":
    main()

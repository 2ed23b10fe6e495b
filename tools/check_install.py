"""pip's resolver shows that jenga installs beside the vLLM its users run.

jenga's wheel is built once from this checkout (``pip wheel --no-deps``); both checks are then dry
runs that read metadata only.  The index these machines reach serves no PEP 658 metadata files, and
a plain dry run downloads every wheel it weighs (1.8 GB for the first check: vLLM 336 MB, torch 555
MB, ...), so pip reads each wheel's metadata by HTTP range requests (``--use-feature=fast-deps``).
Each check counts what pip still downloads whole and fails past :data:`MAX_DOWNLOAD_MB`.

1. together: ``"jenga[vllm-cuda] @ file://WHEEL" "vllm==0.33.0"`` resolves, and takes vLLM's torch
   2.14.  vLLM 0.34.0 resolves nowhere here (its ``flashinfer-python==0.7.3`` is not on the index
   these machines reach), so 0.33.0, the same torch, stands in.
2. beside: in a throwaway environment that holds vLLM 0.34.0, torch 2.14.0 and the newest
   transformers vLLM 0.34.0 accepts, ``"jenga @ file://WHEEL"`` installs jenga and leaves those three
   as they are.  The environment holds their index metadata written as installed distributions
   (``*.dist-info``), which is all pip's resolver reads of an installed package.

Prints one line per check; exits 1 naming what failed.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOGETHER_VLLM = "0.33.0"   # stands in for 0.34.0 (same torch 2.14), which the index cannot resolve
BESIDE_VLLM = "0.34.0"
KEPT = ("vllm", "torch", "transformers")
MAX_DOWNLOAD_MB = 100  # whole files pip may fetch (sdists, a server refusing ranges); a torch wheel is 555 MB
DOWNLOAD = re.compile(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)")
downloaded_mb = 0.0


def dry_run(report: pathlib.Path, *requirements: str, python: str | None = None,
            no_deps: bool = False) -> list[dict]:
    """pip's install plan for ``requirements`` (the report's ``install`` list); exits on failure.

    Without ``python`` the plan is for an empty environment (``--ignore-installed``); with it, for
    the environment of that interpreter, as ``pip install`` there would make it."""
    global downloaded_mb
    cmd = [sys.executable, "-m", "pip"] + (["--python", python] if python else [])
    cmd += ["install", "--dry-run", "--use-feature=fast-deps", "--report", str(report)]
    cmd += [] if python else ["--ignore-installed"]
    cmd += (["--no-deps"] if no_deps else []) + list(requirements)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        said = [ln for ln in done.stdout.splitlines() if "is ignored: it is neither" not in ln]
        sys.exit(f"FAILED: pip install --dry-run {' '.join(requirements)}\n" + "\n".join(said[-25:]))
    unit = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}
    downloaded_mb += sum(float(size) * unit[u] for size, u in DOWNLOAD.findall(done.stdout))
    if downloaded_mb > MAX_DOWNLOAD_MB:
        sys.exit(f"FAILED: pip downloaded {downloaded_mb:.0f} MB of whole files, not metadata only:\n"
                 + "\n".join(m.group(0) for m in DOWNLOAD.finditer(done.stdout)))
    return json.loads(report.read_text())["install"]


def versions(plan: list[dict]) -> dict[str, str]:
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in plan}


def write_installed(site: pathlib.Path, metadata: dict) -> None:
    """``metadata`` (a report's JSON core metadata) as an installed distribution in ``site``."""
    name, version = metadata["name"], metadata["version"]
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if "requires_python" in metadata:
        lines.append(f"Requires-Python: {metadata['requires_python']}")
    lines += [f"Requires-Dist: {r}" for r in metadata.get("requires_dist", [])]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def check_together(tmp: pathlib.Path, wheel: pathlib.Path) -> str:
    want = [f"jenga[vllm-cuda] @ {wheel.as_uri()}", f"vllm=={TOGETHER_VLLM}"]
    got = versions(dry_run(tmp / "together.json", *want))
    if got.get("vllm") != TOGETHER_VLLM or not got.get("torch", "").startswith("2.14"):
        sys.exit(f"FAILED together: {want} planned vllm {got.get('vllm')}, torch {got.get('torch')}")
    return (f"together: {' '.join(want[1:])} + jenga[vllm-cuda] {got['jenga']} resolves with torch "
            f"{got['torch']}, transformers {got['transformers']} ({len(got)} packages)")


def check_beside(tmp: pathlib.Path, wheel: pathlib.Path) -> str:
    vllm = dry_run(tmp / "vllm.json", f"vllm=={BESIDE_VLLM}", no_deps=True)[0]["metadata"]
    pins = [r.split(";")[0] for r in vllm["requires_dist"] if r.startswith(("torch==", "transformers"))]
    present = [vllm] + [p["metadata"] for p in dry_run(tmp / "deps.json", *pins, no_deps=True)]
    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = str(env / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for metadata in present:
        write_installed(pathlib.Path(site), metadata)
    had = versions([{"metadata": m} for m in present])
    got = versions(dry_run(tmp / "beside.json", f"jenga @ {wheel.as_uri()}", python=python))
    replaced = sorted(set(got) & set(KEPT))
    if "jenga" not in got or replaced:
        sys.exit(f"FAILED beside: installing jenga next to {had} would install "
                 f"{ {n: got[n] for n in replaced} if replaced else got}")
    return (f"beside: jenga {got['jenga']} installs next to "
            f"{', '.join(f'{n} {v}' for n, v in sorted(had.items()))} and keeps them "
            f"(installs {len(got)} packages: none of {', '.join(KEPT)})")


def build_wheel(tmp: pathlib.Path) -> pathlib.Path:
    """jenga's wheel from this checkout, without dependencies."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp / "dist"),
                    str(ROOT)], check=True)
    (wheel,) = (tmp / "dist").glob("jenga-*.whl")
    return wheel


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="jenga-check-install-") as tmp:
        wheel = build_wheel(pathlib.Path(tmp))
        for check in (check_together, check_beside):
            start = time.perf_counter()
            line = check(pathlib.Path(tmp), wheel)
            print(f"{line} [{time.perf_counter() - start:.0f} s, {downloaded_mb:.1f} MB downloaded whole so far]",
                  flush=True)


if __name__ == "__main__":
    main()

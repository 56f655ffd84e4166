"""GPU check of `patchkit verify`'s launch predictions: build each test CUDA object, predict from
its fatbin whether its kernel launches on this machine's GPU, launch it, and compare.

Each object exports ``pk_launch(n)``, which returns the cudaError_t of a launch of a one-line
kernel (0 = ran and computed the right value, 209 = cudaErrorNoKernelImageForDevice).
Set ``PATCHKIT_GPU_REPORT`` to a path to also write the result table as Markdown.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from patchkit.abi.archs import CC
from patchkit.abi.checks import predict
from patchkit.abi.scan import analyze_file
from tests.abi import builders

pytestmark = pytest.mark.gpu

NO_KERNEL_IMAGE = 209
LAUNCH = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); print(lib.pk_launch(4096))"


def _local_cc() -> CC | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return CC.parse(out[0]) if out else None


@pytest.fixture(scope="module")
def gpu_cc() -> CC:
    cc = _local_cc()
    if cc is None:
        pytest.skip("needs an NVIDIA GPU (nvidia-smi)")
    if builders.nvcc() is None:
        pytest.skip("needs nvcc")
    return cc


def _launch(path: str) -> int:
    # The objects use the shared CUDA runtime of the nvcc that built them.
    home = os.path.dirname(os.path.dirname(os.path.realpath(builders.nvcc() or "")))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(
        [os.path.join(home, "lib64"), os.path.join(home, "lib"), env.get("LD_LIBRARY_PATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH, path], capture_output=True, text=True, timeout=300, env=env
    )
    if proc.returncode:
        raise RuntimeError(f"launcher failed for {path}: {proc.stderr[-1000:]}")
    return int(proc.stdout.strip().splitlines()[-1])


def test_predictions_match_launches(gpu_cc):
    variants = sorted(builders.CUDA_VARIANTS)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        paths = dict(zip(variants, pool.map(builders.cuda_object, variants), strict=True))
    rows = []
    for variant in variants:
        report = analyze_file(paths[variant], variant, paths[variant])
        pred = predict(report, gpu_cc)
        will_run = pred["verdict"] in ("sass", "jit")
        rc = _launch(paths[variant])
        ran = rc == 0
        archs = " ".join(sorted({a for f in report.kernel_fatbins for a in f.archs}))
        rows.append(
            (
                variant,
                archs,
                pred["verdict"],
                "launches" if will_run else "no kernel image",
                "ran" if ran else f"error {rc}",
                will_run == ran and rc in (0, NO_KERNEL_IMAGE),
            )
        )
    table = [
        f"| object | fatbin images | verdict for sm_{gpu_cc.sm} | predicted | launched | match |",
        "|---|---|---|---|---|---|",
    ] + [f"| {v} | {a} | {p} | {w} | {r} | {'yes' if m else 'NO'} |" for v, a, p, w, r, m in rows]
    text = "\n".join(table)
    print(text)
    if os.environ.get("PATCHKIT_GPU_REPORT"):
        with open(os.environ["PATCHKIT_GPU_REPORT"], "w") as fh:
            fh.write(text + "\n")
    assert all(row[-1] for row in rows), text

"""How `inspect WHEEL` scales with the member count: synthetic wheels of 10k, 20k and 40k
members, each timed in a fresh interpreter (best of 3), against an older inspection module
when one is given (side by side, as the machine is shared).

    python tests/reliability/measure_inspect.py [OLD_INSPECTION_PY]
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMER = """
import importlib.util, sys, time
from pathlib import Path
if sys.argv[2] != "-":
    spec = importlib.util.spec_from_file_location("baseline_inspection", sys.argv[2])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_inspection"] = mod
    spec.loader.exec_module(mod)
else:
    from patchkit.wheels import inspection as mod
best = min(
    (lambda t: (mod.inspect_wheel(Path(sys.argv[1])), time.perf_counter() - t)[1])(
        time.perf_counter()
    )
    for _ in range(3)
)
print(f"{best:.3f}")
"""


def _hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def make_wheel(members: int, path: Path) -> None:
    di = "big-1.0.dist-info"
    files = {f"big/m{i:06d}.py": f"x = {i}\n".encode() for i in range(members)}
    files[f"{di}/METADATA"] = b"Metadata-Version: 2.1\nName: big\nVersion: 1.0\n"
    record = "".join(f"{k},{_hash(v)},{len(v)}\n" for k, v in files.items()) + f"{di}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{di}/RECORD", record)


def timed(wheel: Path, module: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", TIMER, str(wheel), module],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(out.stdout.strip())


def main() -> None:
    baseline = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory() as tmp:
        for n in (10_000, 20_000, 40_000):
            wheel = Path(tmp) / f"big-{n}.whl"
            make_wheel(n, wheel)
            now = timed(wheel, "-")
            line = f"inspect, {n} members: {now:.2f}s"
            if baseline:
                before = timed(wheel, baseline)
                line += f" (baseline {before:.2f}s, {before / now:.1f}x)"
            print(line)


if __name__ == "__main__":
    main()

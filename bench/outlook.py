"""Release day: `patchkit outlook` cold and warm, and a warm `rebase` preview, beside `pip
download --no-deps` of the same release files (the anchor: what fetching them costs here).

    .venv/bin/python bench/outlook.py [--line 0.5.9] [--warm-runs 5] [--work DIR]

In a fresh cache (`--work`, default a temporary folder): (1) `pip download --no-deps
--no-cache-dir` of each release file outlook imports (the sdist, else the first pinned
platform's wheel, of every release after the line's pin), (2) `patchkit outlook --target
sglang --line L` with an empty cache, (3) the same outlook warm, `--warm-runs` times, (4)
`patchkit rebase --target sglang@0.5.23 --line 0.5.17` once to fill its record, then warm
`--warm-runs` times. pip runs once per file (it refuses two versions of a project in one
resolution) and prepares the sdists' metadata, as it does. Prints each time, the medians, the
ratios to the goals (cold outlook <= 2x the download, warm outlook <= 1 s, warm preview <= 1 s)
and the load average (`uptime`) before and after: the machine is shared, compare ratios taken
in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load() -> str:
    """The load average over 1, 5 and 15 minutes, as `uptime` prints it."""
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def release_files(line: str) -> list[str]:
    """The URL of each file outlook imports for `line`: sdist, else the first pinned wheel."""
    from patchkit.upstream.index import index_url, project_files
    from patchkit.upstream.newbase import wanted_tags
    from patchkit.upstream.releases import releases_after
    from patchkit.workspace import Workspace

    target = Workspace.load(ROOT).targets.get("sglang", line)
    files = project_files("sglang")
    python, platform = wanted_tags(target)[0]
    urls = []
    for version in releases_after(target, target.pin, files):
        sdist = [f for f in files if f["filename"] == f"sglang-{version}.tar.gz"]
        wheel = [
            f
            for f in files
            if f["filename"].startswith(f"sglang-{version}-")
            and f["filename"].endswith(f"-{python}-{python}-{platform}.whl")
        ]
        entry = (sdist or wheel)[0]
        url = entry["url"]
        if not url.startswith(("http://", "https://", "file://")):
            url = urllib.request.urljoin(f"{index_url()}/sglang/", url)
        urls.append(url)
    return urls


def timed(cmd: list[str], env: dict[str, str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("ab") as out:
        subprocess.run(cmd, env=env, stdout=out, stderr=out, cwd=ROOT, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", default="0.5.9")
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-outlook-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "log.txt"
    env = {**os.environ, "PATCHKIT_CACHE": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop("PATCHKIT_OFFLINE_GIT", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed patchkit runs: bytecode kept
    py = sys.executable
    print(f"load before: {load()}", flush=True)
    urls = release_files(args.line)
    # One pip per file: pip refuses two versions of one project in one resolution.
    pip = [
        py,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "-q",
        "-d",
        str(work / "pip"),
    ]
    download = sum(timed([*pip, url], env, log) for url in urls)
    if len(list((work / "pip").iterdir())) != len(urls):
        print(f"pip download failed (see {log})")
        return 1
    print(f"pip download --no-deps of {len(urls)} release files: {download:.1f} s", flush=True)
    # The bytes alone, one connection per file (pip also prepares each sdist's metadata).
    fetch = timed(["curl", "-sSf", "--remote-name-all", "--output-dir", str(work / "curl"),
                   "--create-dirs", *urls], env, log)  # fmt: skip
    print(f"curl of the same files: {fetch:.1f} s", flush=True)
    outlook = [py, "-m", "patchkit", "outlook", "--target", "sglang", "--line", args.line]
    cold = timed(outlook, env, log)
    print(
        f"outlook cold: {cold:.1f} s ({cold / download:.2f}x the pip download, goal <= 2x; "
        f"{cold / fetch:.2f}x curl)",
        flush=True,
    )
    warm = [timed(outlook, env, log) for _ in range(args.warm_runs)]
    print(f"outlook warm: {' '.join(f'{t:.2f}' for t in warm)} s; median "
          f"{statistics.median(warm):.2f} s (goal <= 1 s)", flush=True)  # fmt: skip
    rebase = [py, "-m", "patchkit", "rebase", "--target", "sglang@0.5.23", "--line", "0.5.17"]
    first = timed(rebase, env, log)
    previews = [timed(rebase, env, log) for _ in range(args.warm_runs)]
    print(f"rebase preview 0.5.17 -> 0.5.23: first {first:.1f} s; warm "
          f"{' '.join(f'{t:.2f}' for t in previews)} s; median "
          f"{statistics.median(previews):.2f} s (goal <= 1 s)")  # fmt: skip
    print(f"load after: {load()}")
    summary = {
        "download_s": download,
        "curl_s": fetch,
        "cold_s": cold,
        "cold_ratio": cold / download,
        "warm_s": warm,
        "rebase_first_s": first,
        "rebase_warm_s": previews,
        "files": len(urls),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"log and summary in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

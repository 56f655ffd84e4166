"""Plain helpers shared by the test modules (imported as `helpers`; fixtures live in conftest)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_CACHE = Path(os.environ.get("PATCHKIT_TEST_CACHE", ROOT / ".cache" / "test-patchkit"))


# The line the tests were written on and call the default: the seed's 0.5.9 (an sdist base
# with a git pin). The project's own default is the newest line; `seed_project` copies the
# project with 0.5.9 as the default, and the tests run in such a copy (conftest), while
# test_targets and test_build check the real default on ROOT itself.
SEED_LINE = "0.5.9"


# A toy target's series, one line (1.0); the wheel-base tests add a 2.0 line.
TOY_TOML = """\
[series]
version = "1.0.0"

[targets.toy]
git = "https://example.invalid/toy.git"
subdir = "python"
default_line = "1.0"

[targets.toy.lines."1.0"]
pin = "1.0"
series = "toy/1.0"
"""


def record_hash(data: bytes) -> str:
    """A RECORD line's hash of `data` (sha256, urlsafe base64 without padding)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def seed_project(dest: Path) -> Path:
    """A copy of this project's patches/ and build/ whose sglang default line is SEED_LINE."""
    import shutil

    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "patches", dest / "patches")
    if (ROOT / "build").exists():
        shutil.copytree(ROOT / "build", dest / "build", ignore=shutil.ignore_patterns("work"))
    toml = dest / "patches" / "targets.toml"
    toml.write_text(seeded_targets(toml.read_text()))
    return dest


def seeded_targets(text: str) -> str:
    """targets.toml's text with SEED_LINE as sglang's default line."""
    import re

    text, count = re.subn(
        r'(\[targets\.sglang\][^\[]*?)^default_line = "[^"]*"$',
        rf'\1default_line = "{SEED_LINE}"',
        text,
        count=1,
        flags=re.M | re.S,
    )
    assert count == 1, "targets.toml: no default_line under [targets.sglang]"
    return text


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    """Plain git for test set-up (the code under test uses patchkit.gitops)."""
    full_env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": "1700000000 +0000",
        "GIT_COMMITTER_DATE": "1700000000 +0000",
        **(env or {}),
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=full_env, check=True, capture_output=True, text=True
    ).stdout


def patchkit(
    *args: str, cwd: Path | None = None, env: dict | None = None, input: str | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (exit codes and output as a user sees them)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PATCHKIT_OFFLINE_GIT", "1")
    # This checkout's patchkit, whatever the cwd (an editable install may point elsewhere).
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), full_env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "patchkit", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        input=input,
    )


def sha_of(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", f"{ref}^{{commit}}").strip()


def snapshot(path: Path) -> dict[str, bytes | str]:
    """Every file (including .git) under `path` with its bytes; symlinks by target."""
    out: dict[str, bytes | str] = {}
    if not path.exists():
        return out
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        elif p.is_dir():
            out[rel] = "dir"
    return out


def private_cache(warm: Path, dest: Path) -> Path:
    """A PATCHKIT_CACHE with the warm mirrors cloned and the sdists linked."""
    (dest / "sdists").mkdir(parents=True)
    for sdist in (warm / "sdists").glob("*.tar.gz"):
        os.link(sdist, dest / "sdists" / sdist.name)
    if (warm / "wheels").is_dir():
        (dest / "wheels").mkdir()
        for wheel in (warm / "wheels").glob("*.whl"):
            os.link(wheel, dest / "wheels" / wheel.name)
    (dest / "mirrors").mkdir()
    for mirror in (warm / "mirrors").glob("*.git"):
        subprocess.run(
            [
                "git",
                "clone",
                "--quiet",
                "--mirror",
                str(mirror),
                str(dest / "mirrors" / mirror.name),
            ],
            check=True,
            capture_output=True,
        )
    return dest


def series_folder(root: Path, target: str, line: str | None = None) -> Path:
    """The series folder of `target`'s line (default line when None) in the project at `root`."""
    from patchkit.project import Project

    return Project(root).series_dir(target, line)


def result_of(stdout: str) -> dict:
    """The verb's result from its `--json` envelope (the one document on stdout)."""
    import json

    document = json.loads(stdout)
    assert document["error"] is None, document["error"]
    return document["result"]


def error_of(stdout: str) -> dict:
    """The error object of a failed verb's `--json` envelope."""
    import json

    document = json.loads(stdout)
    assert document["ok"] is False and document["error"] is not None, document
    return document["error"]


def loosen_packs(mirror: Path) -> None:
    """Turn every pack of a bare repository into loose objects (tests that rewrite one object
    of a mirror need it loose; a private cache's packs are its own, not hard links)."""
    for pack in sorted((mirror / "objects" / "pack").glob("pack-*.pack")):
        moved = pack.with_name("moved.pack")
        pack.rename(moved)
        pack.with_suffix(".idx").unlink()
        with moved.open("rb") as fh:
            subprocess.run(
                ["git", "--git-dir", str(mirror), "unpack-objects", "-q"], stdin=fh, check=True
            )
        moved.unlink()

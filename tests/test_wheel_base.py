"""Wheel bases and series lines.

Fast tests run on a small synthetic upstream published only as wheels (two releases, two
lines), built in the test with the real wheel format; the slow ones on the real pinned
sglang wheels from the package index (cached): a 0.5.9 -> 0.5.12 classification with no git
access (a pinned release whose line is retired), and on the 0.5.17 line's wheels the wheel
import, the repacked wheel installed with pip into a fresh venv, inspect, byte-identical
rebuilds and tampered wheels refused.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, error_of, git, patchkit, record_hash, result_of, snapshot
from helpers import TOY_TOML as ONE_LINE
from series_fixtures import EXPORT

from patchkit.wheels.sbom import validate_sbom

TOY_TOML = (
    ONE_LINE
    + """
[targets.toy.lines."2.0"]
pin = "2.0"
series = "toy/2.0"
"""
)


def make_wheel(dest: Path, version: str, files: dict[str, bytes], tag: str = "py3-none-any"):
    """A real wheel (METADATA, WHEEL, RECORD) holding `files`."""
    info = f"toy-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: toy\nVersion: {version}\n\n".encode()
    )
    members[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = dest / f"toy-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zi = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 6))
            zi.external_attr = 0o100644 << 16
            zf.writestr(zi, data)
    return path


def toy_sources(version: str) -> dict[str, bytes]:
    return {
        "toy/__init__.py": f'__version__ = "{version}"\n'.encode(),
        "toy/core.py": b"def answer():\n    return 41\n\n\ndef name():\n    return 'toy'\n",
        "toy/_speed.cpython-311-x86_64-linux-gnu.so": b"\x7fELF" + bytes(60),
    }


def make_patch(
    base_files: dict[str, bytes],
    path: str,
    old: bytes,
    new: bytes,
    subject: str,
    author: str = "Test Author",
):
    """A `git format-patch` of one edit against a tree laid out like the target."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git(repo, "init", "-q")
        for name, data in base_files.items():
            (repo / "python" / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / "python" / name).write_bytes(data)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "base")
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        text = target.read_bytes() if target.exists() else b""
        target.write_bytes(text.replace(old, new) if old else new)
        git(repo, "add", "-A")
        git(
            repo,
            "commit",
            f"--author={author} <author@example.invalid>",
            "-qm",
            f"{subject}\n\nWhy: a test change.\n\nOrigin: other\nForwarded: not-needed\n"
            "Last-Update: 2026-12-01\nPatchkit-Tests: tests/test_wheel_base.py",
        )
        return subprocess.run(
            ["git", *EXPORT, "-1", "HEAD"],
            cwd=repo,
            check=True,
            capture_output=True,
        ).stdout


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A project whose only target publishes wheels only: releases 1.0 and 2.0, one line each;
    the pinned wheels sit in a private cache (nothing is downloaded)."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheels = {v: make_wheel(cache / "wheels", v, toy_sources(v)) for v in ("1.0", "2.0")}
    project = tmp_path / "project"
    (project / "patches" / "toy" / "1.0").mkdir(parents=True)
    (project / "patches" / "toy" / "2.0").mkdir(parents=True)
    toml = TOY_TOML
    for version, path in wheels.items():
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        toml += (
            f'\n[[targets.toy.releases]]\nversion = "{version}"\n'
            f'wheels = [{{ file = "{path.name}", sha256 = "{sha}" }}]\n'
        )
    (project / "patches" / "targets.toml").write_text(toml)
    (project / "build").symlink_to(ROOT / "build")
    base = toy_sources("1.0")
    patch = make_patch(base, "python/toy/core.py", b"return 41", b"return 42", "Answer 42")
    (project / "patches/toy/1.0/answer-42.patch").write_bytes(patch)
    (project / "patches/toy/1.0/series").write_text("answer-42.patch\n")
    (project / "patches/toy/2.0/series").write_text("# empty line\n")
    for key, value in {
        "PATCHKIT_PROJECT": project,
        "PATCHKIT_CACHE": cache,
        "PATCHKIT_OFFLINE_GIT": "1",
        "PATCHKIT_INDEX_URL": "http://127.0.0.1:9/simple",  # nothing reachable
    }.items():
        monkeypatch.setenv(key, str(value))
    return {"project": project, "cache": cache, "wheels": wheels}


def test_apply_picks_the_line_whose_pin_matches(toy, tmp_path):
    r = patchkit("apply", "--target", "toy@1.0", "--into", str(tmp_path / "a"), "--json")
    assert r.returncode == 0, r.stderr
    report = result_of(r.stdout)["reports"][0]
    assert report["base"]["source"] == "wheel"
    assert "wheel toy-1.0-py3-none-any.whl" in report["base"]["stands_for"]
    assert [p["name"] for p in report["patches"]] == ["answer-42.patch"]
    tree = tmp_path / "a" / "python"
    assert "return 42" in (tree / "toy/core.py").read_text()
    assert not list(tree.rglob("*.so")) and not list(tree.rglob("*.dist-info"))
    # 2.0: the line pinned to it (empty: applies nothing, still valid)
    r = patchkit("apply", "--target", "toy@2.0", "--into", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "return 41" in (tmp_path / "b/python/toy/core.py").read_text()
    r = patchkit("status", str(tmp_path / "b"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert result_of(r.stdout)["status"][0]["line"] == "2.0"  # from the checkout's base
    r = patchkit("status", str(tmp_path / "a"), "--json")
    assert r.returncode == 0 and result_of(r.stdout)["status"][0]["line"] == "1.0"
    # --line against another pin is refused, naming both
    r = patchkit("apply", "--target", "toy@2.0", "--line", "1.0", "--into", str(tmp_path / "c"))
    assert r.returncode == 2 and "line 1.0 is pinned to 1.0" in r.stderr
    assert not (tmp_path / "c").exists()


def test_import_is_deterministic_and_records_the_wheel(toy, tmp_path, monkeypatch):
    from patchkit.upstream import acquire
    from patchkit.workspace import Workspace

    target = Workspace.load(toy["project"]).targets.get("toy", "1.0")
    first = acquire(target, None)
    other = tmp_path / "other-cache"
    (other / "wheels").mkdir(parents=True)
    for wheel in toy["wheels"].values():
        os.link(wheel, other / "wheels" / wheel.name)
    second = acquire(target, None, cache=other)
    assert first.commit == second.commit and first.source == "wheel"
    message = git(toy["cache"] / "mirrors" / "toy.git", "log", "-1", "--format=%B", first.commit)
    assert "Patchkit-Wheel: toy-1.0-py3-none-any.whl" in message
    assert "Patchkit-Wheel-Compiled: toy/_speed.cpython-311-x86_64-linux-gnu.so" in message
    assert "Patchkit-Wheel-Dist-Info: toy-1.0.dist-info" in message


def test_tampered_cached_wheel_is_refused_and_names_every_source(toy, tmp_path):
    wheel = toy["wheels"]["2.0"]
    data = bytearray(wheel.read_bytes())
    data[len(data) // 3] ^= 0xFF
    wheel.write_bytes(bytes(data))
    before = snapshot(toy["cache"] / "wheels")
    r = patchkit("rebase", "--target", "toy@2.0", "--json")
    assert r.returncode == 2, r.stdout + r.stderr  # cannot obtain the base
    doc = error_of(r.stdout)
    assert doc["kind"] == "cannot-obtain-base" and doc["exit_code"] == 2
    sources = [a["source"] for a in doc["detail"]["attempts"]]
    assert sources == ["git", "wheel"], doc
    assert "--upstream" in doc["next_step"] and "--upstream" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2
    assert snapshot(toy["cache"] / "wheels") == before  # nothing written


def test_lint_checks_every_line(toy):
    (toy["project"] / "patches/toy/2.0/stray.patch").write_text("x")
    r = patchkit("lint", "--no-reexport", "--json")
    doc = result_of(r.stdout)
    assert set(doc["checked"]) == {"toy/1.0", "toy/2.0"}
    assert r.returncode == 1 and any(f["rule"] == "series-extra" for f in doc["findings"])


def test_rebase_write_new_line_keeps_the_old_line(toy):
    before = snapshot(toy["project"] / "patches")
    # moving line 1.0 onto 2.0, which line 2.0 is pinned to, is refused
    r = patchkit("rebase", "--target", "toy@2.0", "--line", "1.0", "--write")
    assert r.returncode == 2 and "already pinned to 2.0" in r.stderr, r.stdout + r.stderr
    assert snapshot(toy["project"] / "patches") == before
    before = snapshot(toy["project"] / "patches/toy/1.0")
    # carry the 1.0 line onto 2.0 as a new line "2.0-next"
    r = patchkit(
        "rebase", "--target", "toy@2.0", "--line", "1.0", "--write", "--new-line", "2.0-next"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(toy["project"] / "patches/toy/1.0") == before
    new = toy["project"] / "patches/toy/2.0-next"
    assert (new / "series").read_text().split() == ["answer-42.patch"]
    text = (toy["project"] / "patches/targets.toml").read_text()
    assert '[targets.toy.lines."2.0-next"]' in text and 'default_line = "1.0"' in text
    assert text.startswith(TOY_TOML.splitlines()[0])  # the rest kept as it was written
    from patchkit.targets import load_targets

    toy_target = load_targets(toy["project"] / "patches/targets.toml").get("toy")
    assert toy_target.on_line("2.0-next").pin == "2.0"
    assert toy_target.on_line("1.0").pin == "1.0"
    r = patchkit("rebase", "--target", "toy@2.0", "--write", "--new-line", "2.0-next")
    assert r.returncode == 2 and "already exists" in r.stderr
    patches = snapshot(toy["project"] / "patches")
    for bad in ("../../escape", ".hidden", "a/b"):
        r = patchkit("rebase", "--target", "toy@2.0", "--write", "--new-line", bad)
        assert r.returncode == 2 and "line name" in r.stderr, (bad, r.stderr)
    assert snapshot(toy["project"] / "patches") == patches
    assert not (toy["project"].parent / "escape").exists()


def test_build_repacks_and_refuses_compiled_or_outside_files(toy, tmp_path):
    out = tmp_path / "dist"
    r = patchkit("build", "--target", "toy@1.0", "--out", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = result_of(r.stdout)
    (wheel,) = [Path(w["wheel"]) for w in doc["wheels"]]
    assert wheel.name.startswith("toy-1.0+") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        info = wheel.name.split("-py3")[0] + ".dist-info"
        assert b"return 42" in zf.read("toy/core.py")
        assert zf.read("toy/_speed.cpython-311-x86_64-linux-gnu.so").startswith(b"\x7fELF")
        prov = json.loads(zf.read(f"{info}/patchkit.json"))
        assert prov["series"]["line"] == "1.0" and prov["upstream"]["source"] == "wheel"
    assert patchkit("inspect", str(wheel)).returncode == 0
    # a build that succeeded leaves its log, not its patched tree; --keep-tree keeps it
    work = toy["project"] / "work" / "build" / "toy-1.0"
    assert [w["tree"] for w in doc["wheels"]] == [None]
    assert sorted(p.name for p in work.parent.iterdir()) == ["toy-1.0"]
    assert sorted(p.name for p in work.iterdir()) == ["build.log"]
    kept = patchkit("build", "--target", "toy@1.0", "--out", str(out), "--keep-tree", "--json")
    assert [w["tree"] for w in result_of(kept.stdout)["wheels"]] == [str(work / "tree")]
    assert (work / "tree" / "python" / "toy" / "core.py").is_file()
    for path, what in (
        ("python/pyproject.toml", "not in the wheel"),
        ("python/toy/_new.cpython-311-x86_64-linux-gnu.so", "compiled"),
        ("README.md", "outside python/"),
    ):
        bad = make_patch(toy_sources("1.0"), path, b"", b"x = 1\n", f"Touch {path}")
        (toy["project"] / "patches/toy/1.0/bad.patch").write_bytes(bad)
        (toy["project"] / "patches/toy/1.0/series").write_text("answer-42.patch\nbad.patch\n")
        out2 = tmp_path / "dist2"
        r = patchkit("build", "--target", "toy@1.0", "--out", str(out2))
        assert r.returncode == 1 and what in r.stderr, (path, r.stderr)
        assert not out2.exists() or not list(out2.iterdir())
        assert (work / "tree" / "python" / "toy" / "core.py").is_file()  # kept to look into


# --- the real sglang 0.5.12 and 0.5.17 wheels -------------------------------------------------


@pytest.fixture
def wheel_cache(
    sglang_wheels, sglang_0512_wheels, shared_cache, tmp_path, monkeypatch, warm_mirrors
):
    """A private cache holding the warm 0.5.9 mirror and the pinned 0.5.12 and 0.5.17 wheels;
    no git, no index."""
    from helpers import private_cache

    dest = private_cache(warm_mirrors, tmp_path / "cache")
    monkeypatch.setenv("PATCHKIT_CACHE", str(dest))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "1")
    monkeypatch.setenv("PATCHKIT_INDEX_URL", "http://127.0.0.1:9/simple")
    return dest


@pytest.mark.slow
def test_rebase_0_5_9_onto_the_0_5_12_wheel_without_git(project, wheel_cache):
    r = patchkit("rebase", "--target", "sglang@0.5.12", "--json")
    assert r.returncode in (0, 1), r.stderr
    doc = result_of(r.stdout)
    assert doc["new_base"]["source"] == "wheel"
    assert doc["new_base"]["wheel"] == "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert doc["line"] == "0.5.9" and doc["history"] is False
    from patchkit.workspace import Workspace

    names = Workspace.load(project).series("sglang").names
    assert [p["name"] for p in doc["patches"]] == names
    labels = {p["name"]: p["label"] for p in doc["patches"]}
    assert set(labels.values()) <= {
        "clean",
        "offset",
        "merged",
        "conflict",
        "upstreamed",
        "obsolete",
    }
    # packaging pins live in pyproject.toml, which a wheel base does not hold; the wheel
    # declares the CUDA 13 stack itself (as tests/test_rebase_equivalent.py reads it)
    assert labels["cu130-packaging-pins.patch"] == "obsolete"
    assert not (project / "work" / "rebase").exists()  # a preview leaves nothing


def _sglang_patch(tmp_path: Path, wheel: Path) -> bytes:
    """A one-line change of sglang/version.py against the real 0.5.17 wheel's files."""
    with zipfile.ZipFile(wheel) as zf:
        files = {"sglang/version.py": zf.read("sglang/version.py")}
    return make_patch(
        files,
        "python/sglang/version.py",
        b"",
        files["sglang/version.py"] + b'PATCHKIT_MARK = "pk"\n',
        "Mark the patched build",
    )


@pytest.mark.long
@pytest.mark.slow
def test_repack_real_wheels_install_inspect_reproducible(
    project, wheel_cache, sglang_wheels, tmp_path
):
    line = project / "patches/sglang/0.5.17"
    (line / "mark.patch").write_bytes(_sglang_patch(tmp_path, sglang_wheels["cp311"]))
    (line / "series").write_text("mark.patch\n")
    out = tmp_path / "dist"
    r = patchkit("build", "--target", "sglang@0.5.17", "--out", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = {
        Path(w["wheel"]).name.split("-")[2]: Path(w["wheel"]) for w in result_of(r.stdout)["wheels"]
    }
    assert set(wheels) == {"cp311", "cp312"}
    for tag, path in wheels.items():
        assert path.name.startswith("sglang-0.5.17+cu130.pk")
        assert path.name.endswith(f"-{tag}-{tag}-manylinux_2_34_x86_64.whl")
        assert patchkit("inspect", str(path)).returncode == 0
        with zipfile.ZipFile(path) as zf, zipfile.ZipFile(sglang_wheels[tag]) as orig:
            so = next(n for n in orig.namelist() if n.endswith(".so"))
            assert zf.read(so) == orig.read(so)  # compiled member carried unchanged
            info = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            assert f"Version: {path.name.split('-')[1]}" in zf.read(info).decode()
            dist_info = info.rsplit("/", 1)[0]
            prov = json.loads(zf.read(f"{dist_info}/patchkit.json"))
            assert prov["upstream"]["wheel"] == sglang_wheels[tag].name
            assert (
                prov["upstream"]["wheel_sha256"]
                == hashlib.sha256(sglang_wheels[tag].read_bytes()).hexdigest()
            )
            assert prov["series"]["line"] == "0.5.17"
            assert validate_sbom(zf.read(f"{dist_info}/sboms/patchkit.cdx.json")) is None
    first = {t: p.read_bytes() for t, p in wheels.items()}
    r = patchkit(
        "build",
        "--target",
        "sglang",
        "--line",
        "0.5.17",
        "--python-tag",
        "cp312",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert wheels["cp312"].read_bytes() == first["cp312"]  # byte-identical rebuild
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheels["cp311"])],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr
    # Import the patched module as far as this CPU environment allows: sglang's package
    # __init__ needs its dependencies (numpy, torch...), which --no-deps leaves out.
    check = (
        "import importlib.metadata as m, importlib.util as u, pathlib;"
        "d = m.distribution('sglang'); print(d.version);"
        "f = pathlib.Path(d.locate_file('sglang/version.py'));"
        "s = u.spec_from_file_location('sglang_version', f); mod = u.module_from_spec(s);"
        "s.loader.exec_module(mod); print(mod.PATCHKIT_MARK)"
    )
    run = subprocess.run([str(py), "-c", check], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [wheels["cp311"].name.split("-")[1], "pk"]
    site = next(venv.glob("lib/python*/site-packages"))
    installed = patchkit("inspect", "--installed", "sglang", "--path", str(site), "--json")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    doc = result_of(installed.stdout)
    assert doc["status"] == "ok" and doc["provenance"]["series"]["line"] == "0.5.17"
    edited = site / "sglang" / "version.py"
    edited.write_text(edited.read_text() + "# edited after install\n")
    installed = patchkit("inspect", "--installed", "sglang", "--path", str(site))
    assert installed.returncode == 1 and "sglang/version.py" in installed.stdout


DEPS_ENV = "PATCHKIT_SGLANG_0517_DEPS"


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get(DEPS_ENV),
    reason=f"{DEPS_ENV} (a site-packages with sglang 0.5.17's dependencies) is not set",
)
def test_repacked_wheel_imports_with_its_dependencies(
    project, wheel_cache, sglang_wheels, tmp_path
):
    """With sglang's dependencies at hand (torch etc., not installed by --no-deps), the
    installed repacked wheel imports as a package: `sglang` and its server arguments."""
    line = project / "patches/sglang/0.5.17"
    (line / "mark.patch").write_bytes(_sglang_patch(tmp_path, sglang_wheels["cp311"]))
    (line / "series").write_text("mark.patch\n")
    out = tmp_path / "dist"
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    r = patchkit("build", "--target", "sglang@0.5.17", "--python-tag", tag, "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True
    )
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "zz-sglang-deps.pth").write_text(os.environ[DEPS_ENV] + "\n")  # after our sglang
    check = (
        "import sglang, sglang.version as v, sglang.srt.server_args as a;"
        f"print(sglang.__file__.startswith({str(site)!r}), v.PATCHKIT_MARK, "
        "a.ServerArgs.__name__)"
    )
    run = subprocess.run([str(py), "-c", check], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "pk", "ServerArgs"]


class _Index(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        port = self.server.server_address[1]
        if self.path.rstrip("/") in ("/simple/sglang", "/simple/toy"):
            body = json.dumps(
                {
                    "files": [
                        {
                            "filename": n,
                            "url": f"http://127.0.0.1:{port}/f/{n}",
                            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                        }
                        for n, data in self.files.items()
                    ]
                }
            ).encode()
        elif self.path.startswith("/f/") and self.path[3:] in self.files:
            body = self.files[self.path[3:]]
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_index_serving_a_tampered_wheel_is_refused(project, sglang_wheels, tmp_path, monkeypatch):
    real = sglang_wheels["cp311"]
    tampered = bytearray(real.read_bytes())
    tampered[len(tampered) // 2] ^= 1
    _Index.files = {real.name: bytes(tampered)}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = tmp_path / "cache"
    try:
        r = patchkit(
            "apply",
            "--target",
            "sglang@0.5.17",
            "--into",
            str(tmp_path / "tree"),
            env={
                "PATCHKIT_CACHE": str(cache),
                "PATCHKIT_INDEX_URL": f"http://127.0.0.1:{server.server_address[1]}/simple",
            },
        )
    finally:
        server.shutdown()
    assert r.returncode == 1 and "does not match the pin" in r.stderr, r.stderr
    assert not list((cache / "wheels").iterdir()) if (cache / "wheels").exists() else True
    assert not (tmp_path / "tree").exists()


def test_non_ascii_author_and_subject_round_trip(toy, tmp_path):
    """export -> apply -> export: headers decoded and re-encoded as RFC 2047 words agree."""
    after_first = toy_sources("1.0")  # the tree the second patch of the line applies to
    after_first["toy/core.py"] = after_first["toy/core.py"].replace(b"return 41", b"return 42")
    raw = make_patch(
        after_first,
        "python/toy/core.py",
        b"return 'toy'",
        b"return 'toy \xc3\xa9t\xc3\xa9'",
        "Nom accentu\u00e9: \u00e9t\u00e9 \u2014 r\u00e9sum\u00e9",
        author="J\u00f6rg M\u00fcller-\u0141\u00f3d\u017a",
    )
    assert b"=?UTF-8?q?" in raw  # git encodes both headers
    line = toy["project"] / "patches/toy/1.0"
    (line / "accents.patch").write_bytes(raw)
    (line / "series").write_text("answer-42.patch\naccents.patch\n")
    from patchkit.series import parse_patch

    patch = parse_patch("accents.patch", raw)
    assert patch.subject == "Nom accentu\u00e9: \u00e9t\u00e9 \u2014 r\u00e9sum\u00e9"
    assert patch.author.startswith("J\u00f6rg M\u00fcller-\u0141\u00f3d\u017a <")
    tree = tmp_path / "tree"
    assert patchkit("apply", "--target", "toy", "--into", str(tree)).returncode == 0
    log = git(tree, "log", "-1", "--format=%an%n%s")
    assert log.splitlines() == [
        "J\u00f6rg M\u00fcller-\u0141\u00f3d\u017a",
        "Nom accentu\u00e9: \u00e9t\u00e9 \u2014 r\u00e9sum\u00e9",
    ]
    check = patchkit("export", str(tree), "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    lint = patchkit("lint", "--target", "toy", "--line", "1.0")
    assert lint.returncode == 0, lint.stdout


def test_review_a_line(toy):
    r = patchkit("review", "--line", "2.0", "--no-diff", "--json")
    assert r.returncode == 0, r.stderr
    (only,) = result_of(r.stdout)["targets"]
    assert (only["name"], only["line"], only["patches"]) == ("toy", "2.0", [])
    r = patchkit("review", "--no-diff", "--json")
    (default,) = result_of(r.stdout)["targets"]
    assert default["line"] == "1.0" and [p["name"] for p in default["patches"]] == [
        "answer-42.patch"
    ]
    assert patchkit("review", "--line", "9.9").returncode == 2


@pytest.mark.slow
def test_air_gapped_static_mirror_gives_the_wheel_base(project, sglang_wheels, tmp_path):
    """A PEP 503 mirror on disk (HTML pages, no server, no git): rebase classifies and apply
    applies the 0.5.17 line from it."""
    mirror = tmp_path / "mirror"
    (mirror / "simple" / "sglang").mkdir(parents=True)
    (mirror / "files").mkdir()
    links = []
    for wheel in sglang_wheels.values():
        os.link(wheel, mirror / "files" / wheel.name)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>')
    (mirror / "simple" / "sglang" / "index.html").write_text(
        "<!DOCTYPE html><html><body>" + "<br>".join(links) + "</body></html>"
    )
    env = {
        "PATCHKIT_CACHE": str(tmp_path / "cache"),
        "PATCHKIT_INDEX_URL": mirror.as_uri() + "/simple",
    }
    tree = tmp_path / "tree"
    r = patchkit("apply", "--target", "sglang@0.5.17", "--into", str(tree), "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert result_of(r.stdout)["reports"][0]["base"]["source"] == "wheel"
    assert (tree / "python/sglang/srt/server_args.py").is_file()
    assert (tmp_path / "cache/wheels" / sglang_wheels["cp311"].name).is_file()


def test_rebase_onto_an_unpinned_wheel_release_pins_its_wheels(toy, tmp_path, monkeypatch):
    """Trust on first use of a wheel-only release the index serves: --write --new-line
    records its wheels, and the new line then builds from the cache alone."""
    served = tmp_path / "served"
    served.mkdir()
    new = make_wheel(served, "3.0", toy_sources("3.0"))
    _Index.files = {new.name: new.read_bytes(), "toy-3.0-cp39-cp39-win_amd64.whl": b"x"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        r = patchkit(
            "rebase",
            "--target",
            "toy@3.0",
            "--write",
            "--new-line",
            env={"PATCHKIT_INDEX_URL": url},
        )
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trust on first use" in r.stdout
    from patchkit.targets import load_targets

    toy_target = load_targets(toy["project"] / "patches/targets.toml").get("toy", "3.0")
    sha = hashlib.sha256(new.read_bytes()).hexdigest()
    assert [(w.filename, w.sha256) for w in toy_target.pinned.wheels] == [(new.name, sha)]
    assert (toy["project"] / "patches/toy/3.0/series").read_text().split() == ["answer-42.patch"]
    r = patchkit("build", "--target", "toy@3.0", "--out", str(tmp_path / "dist"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((tmp_path / "dist").glob("toy-3.0+*-py3-none-any.whl"))


@pytest.mark.parametrize(
    "member, words",
    [("../evil.py", "escapes"), ("/abs.py", "absolute"), ("toy/.git/config", "not a plain path")],
)
def test_hostile_wheel_is_refused_before_import(toy, tmp_path, member, words):
    wheel = toy["wheels"]["2.0"]
    make_wheel(wheel.parent, "2.0", {**toy_sources("2.0"), member: b"x = 1\n"})
    text = (toy["project"] / "patches/targets.toml").read_text()
    old_sha = next(ln for ln in text.splitlines() if "toy-2.0" in ln).split('sha256 = "')[1][:64]
    new_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (toy["project"] / "patches/targets.toml").write_text(text.replace(old_sha, new_sha))
    r = patchkit("apply", "--target", "toy@2.0", "--into", str(tmp_path / "t"))
    assert r.returncode == 1 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "t").exists()
    mirror = toy["cache"] / "mirrors" / "toy.git"
    assert not (mirror / "refs/patchkit/wheel/2.0").exists()
    assert not list(tmp_path.glob("**/evil.py"))


def test_repack_adds_and_removes_files_as_the_series_does(toy, tmp_path):
    line = toy["project"] / "patches/toy/1.0"
    after_first = toy_sources("1.0")
    after_first["toy/core.py"] = after_first["toy/core.py"].replace(b"return 41", b"return 42")
    added = make_patch(after_first, "python/toy/extra.py", b"", b"EXTRA = 1\n", "Add extra")
    (line / "add-extra.patch").write_bytes(added)
    (line / "series").write_text("answer-42.patch\nadd-extra.patch\n")
    out = tmp_path / "dist"
    r = patchkit("build", "--target", "toy", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        assert zf.read("toy/extra.py") == b"EXTRA = 1\n"
    assert "toy/extra.py,sha256=" in record and "toy/__init__.py,sha256=" in record
    assert not [n for n in names if n.startswith("toy-1.0.dist-info/")]  # renamed, not kept
    assert patchkit("inspect", str(wheel)).returncode == 0


def test_a_pep503_html_index_page_lists_the_same_entries_as_the_json_api():
    """An index without the JSON API (PEP 503 HTML): names, absolute URLs, sha256 fragments."""
    from patchkit.upstream.index import _html_files

    page = "https://mirror.example/simple/sglang/"
    text = (
        "<!DOCTYPE html><html><body><h1>Links for sglang</h1>\n"
        '<a href="../../packages/sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl'
        '#sha256=abc123">sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl</a><br/>\n'
        '<a href="https://files.example/sglang-0.5.9.tar.gz#md5=ff" data-requires-python=">=3.10">'
        "sglang-0.5.9.tar.gz</a>\n"
        '<a href="sglang-0.5.8.tar.gz"></a></body></html>'
    )
    assert _html_files(text, page) == [
        {
            "filename": "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl",
            "url": "https://mirror.example/packages/sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl",
            "hashes": {"sha256": "abc123"},
        },
        {
            "filename": "sglang-0.5.9.tar.gz",
            "url": "https://files.example/sglang-0.5.9.tar.gz",
            "hashes": {},
        },
        {
            "filename": "sglang-0.5.8.tar.gz",
            "url": "https://mirror.example/simple/sglang/sglang-0.5.8.tar.gz",
            "hashes": {},
        },
    ]


class _PrivateIndex(_Index):
    """An index that answers only requests carrying its one Basic credential."""

    expected = "Basic " + base64.b64encode(b"deploy:s3cret+pass").decode()

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != self.expected:
            self.send_error(401)
            return
        super().do_GET()


@pytest.mark.parametrize("how", ["netrc", "url", "none"])
def test_the_index_pip_is_configured_with_is_used_with_its_credentials(toy, tmp_path, how):
    """pip.conf's index-url (no PATCHKIT_INDEX_URL, no PIP_INDEX_URL) and its credentials, from
    netrc or the URL itself, as `pip download` would use them; none gives a one-line refusal
    that shows no password."""
    served = tmp_path / "served"
    served.mkdir()
    new = make_wheel(served, "3.0", toy_sources("3.0"))
    _PrivateIndex.files = {new.name: new.read_bytes()}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PrivateIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    userinfo = "deploy:s3cret%2Bpass@" if how == "url" else ""
    (tmp_path / "pip.conf").write_text(f"[global]\nindex-url = http://{userinfo}{host}/simple\n")
    (tmp_path / "netrc").write_text(
        "machine 127.0.0.1 login deploy password s3cret+pass\n" if how == "netrc" else ""
    )
    (tmp_path / "netrc").chmod(0o600)
    env = {
        "PATCHKIT_INDEX_URL": "",
        "PIP_INDEX_URL": "",
        "PIP_CONFIG_FILE": str(tmp_path / "pip.conf"),
        "NETRC": str(tmp_path / "netrc"),
    }
    try:
        r = patchkit("rebase", "--target", "toy@3.0", "--write", "--new-line", env=env)
    finally:
        server.shutdown()
    if how == "none":
        assert r.returncode == 2 and "HTTP 401" in r.stderr and "Traceback" not in r.stderr, (
            r.stderr
        )
    else:
        assert r.returncode == 0, r.stdout + r.stderr
    assert "s3cret" not in r.stdout + r.stderr


@pytest.mark.parametrize("keep_bytes", [128 << 20, 40, 0], ids=["all-kept", "some", "none"])
def test_an_import_reads_the_same_sources_whatever_it_keeps(tmp_path, monkeypatch, keep_bytes):
    """The import reads each source member once while checking the wheel (kept up to
    KEEP_BYTES, read again past it): the same layout and the same files either way; a member
    compiled by its ELF head is compiled, whatever its name, and is never imported."""
    from patchkit.upstream import wheel

    files = {**toy_sources("1.0"), "toy/_blob": b"\x7fELF" + bytes(20), "toy/data.txt": b"x" * 30}
    path = make_wheel(tmp_path, "1.0", files)
    monkeypatch.setattr(wheel, "KEEP_BYTES", keep_bytes)
    with zipfile.ZipFile(path) as zf:
        plain = wheel.wheel_layout(zf, "toy")
        kept: dict[str, bytes] = {}
        layout = wheel.wheel_layout(zf, "toy", kept)
        assert layout == plain
        assert sum(map(len, kept.values())) <= keep_bytes
        imported = list(wheel._source_files(zf, layout, "python", kept))
    assert {i.filename for i in layout.compiled} == {
        "toy/_speed.cpython-311-x86_64-linux-gnu.so",
        "toy/_blob",
    }
    assert imported == [
        (f"python/{name}", False, data)
        for name, data in files.items()
        if name in {"toy/__init__.py", "toy/core.py", "toy/data.txt"}
    ]
    assert set(kept) <= {"toy/_blob"}  # each source handed on once, not held twice

"""Generate the hostile-input corpus: malformed and hostile patches, series, sdists and wheels.

    python tests/reliability/make_corpus.py [DIR]      (default: tests/reliability/corpus)

Every case is a directory `DIR/<id>/` with `case.json` (kind, description, what to expect) and
its input files; the output is byte-for-byte the same on every run. The tests regenerate the
corpus into a scratch directory and run each case against the real CLI.

The toy tree these cases are aimed at (tests/reliability/reliability_support.py) holds two
symlinks leading out of it: `escape` (absolute, to a sentinel directory) and `pkg/up` (`../..`).
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

HEADER = (
    "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    "From: Mallory <mallory@example.invalid>\n"
    "Date: Tue, 14 Nov 2023 22:13:20 +0000\n"
    "Subject: [PATCH] {subject}\n"
    "\n"
    "A hostile or malformed patch from the reliability corpus.\n"
    "---\n"
)
FILE = "pkg/mod00/file01.py"  # an existing file of the toy tree (40 lines)


def mbox(diff: str, subject: str = "hostile change", header: str = HEADER) -> bytes:
    return (header.format(subject=subject) + diff).encode()


def new_file(path: str, body: str = "pwned\n", mode: str = "100644") -> str:
    lines = body.splitlines()
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\nindex 0000000..1111111\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n"
        + "".join(f"+{ln}\n" for ln in lines)
    )


def edit(
    path: str = FILE,
    a: str | None = None,
    b: str | None = None,
    hunk: str = "@@ -1,3 +1,3 @@",
    body: str | None = None,
) -> str:
    a, b = a or f"a/{path}", b or f"b/{path}"
    body = (
        body
        if body is not None
        else (
            " line 0 of module 0/1: x\n-line 1 of module 0/1: x\n+changed\n line 2 of module 0/1: x\n"  # noqa: E501
        )
    )
    return f"diff --git {a} {b}\nindex 1111111..2222222 100644\n--- {a}\n+++ {b}\n{hunk}\n{body}"


def rename(src: str, dst: str, kind: str = "rename") -> str:
    return (
        f"diff --git a/{src} b/{dst}\nsimilarity index 100%\n{kind} from {src}\n{kind} to {dst}\n"
    )


def patch_cases() -> dict[str, tuple[str, bytes]]:
    """id -> (description, bytes of the hostile patch)."""
    crlf = mbox(new_file("pkg/ok.py", "a\nb\n")).replace(b"\n", b"\r\n")
    one_crlf = mbox(new_file("pkg/ok.py", "a\nb\n")).replace(b"+a\n", b"+a\r\n")
    truncated = mbox(new_file("pkg/new.py", "".join(f"l{i}\n" for i in range(10))))[:-20]
    return {
        "p01-absolute-path": (
            "absolute path in the diff header",
            mbox(new_file("/etc/patchkit-pwned")),
        ),
        "p02-absolute-target-only": (
            "absolute path only in the +++ line",
            mbox(
                "diff --git a/pkg/x b/pkg/x\nnew file mode 100644\n--- /dev/null\n"
                "+++ /tmp/patchkit-pwned\n@@ -0,0 +1 @@\n+pwned\n"
            ),
        ),
        "p03-dotdot-header": ("'..' climbing out of the tree", mbox(new_file("../pwned.txt"))),
        "p04-dotdot-target-only": (
            "'..' only in the +++ line",
            mbox(
                "diff --git a/pkg/x b/pkg/x\nnew file mode 100644\n--- /dev/null\n"
                "+++ b/pkg/../../pwned\n@@ -0,0 +1 @@\n+pwned\n"
            ),
        ),
        "p05-dotdot-middle": (
            "'..' in the middle of a path",
            mbox(new_file("pkg/mod00/../../../pwned")),
        ),
        "p06-git-config": ("writes .git/config", mbox(new_file(".git/config", "[core]\n"))),
        "p07-git-hook": (
            "creates an executable .git/hooks/post-checkout",
            mbox(new_file(".git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/x\n", mode="100755")),
        ),
        "p08-nested-dotgit": (
            "writes into a nested .git directory",
            mbox(new_file("pkg/.git/hooks/pre-commit", "#!/bin/sh\n")),
        ),
        "p09-dotgit-other-case": (
            "writes .Git/config (same directory on case-insensitive disks)",
            mbox(new_file(".Git/config", "[core]\n")),
        ),
        "p10-rename-to-dotdot": ("renames a file to ../", mbox(rename(FILE, "../pwned.py"))),
        "p11-rename-from-dotgit": (
            "renames .git/config into the tree",
            mbox(rename(".git/config", "pkg/config")),
        ),
        "p12-copy-to-absolute": (
            "copies a file to an absolute path",
            mbox(rename(FILE, "/tmp/pwned.py", kind="copy")),
        ),
        "p13-symlink-absolute": (
            "creates a symlink to /etc/passwd",
            mbox(new_file("pkg/passwd", "/etc/passwd", mode="120000")),
        ),
        "p14-symlink-relative": (
            "creates a symlink climbing out of the tree",
            mbox(new_file("pkg/out", "../../..", mode="120000")),
        ),
        "p15-symlink-mode-change": (
            "turns a file into a symlink (mode change)",
            mbox(f"diff --git a/{FILE} b/{FILE}\nold mode 100644\nnew mode 120000\n"),
        ),
        "p16-through-absolute-symlink": (
            "creates a file through the tree's absolute symlink",
            mbox(new_file("escape/pwned.txt")),
        ),
        "p17-through-relative-symlink": (
            "creates a file through a relative symlink to ../..",
            mbox(new_file("pkg/up/pwned.txt")),
        ),
        "p18-retarget-symlink": (
            "rewrites where an existing symlink points",
            mbox(
                "diff --git a/pkg/up b/pkg/up\nindex 1111111..2222222 120000\n--- a/pkg/up\n"
                "+++ b/pkg/up\n@@ -1 +1 @@\n-../..\n\\ No newline at end of file\n+/etc\n"
                "\\ No newline at end of file\n"
            ),
        ),
        "p19-delete-through-symlink": (
            "deletes a file behind the tree's absolute symlink",
            mbox(
                "diff --git a/escape/precious.txt b/escape/precious.txt\ndeleted file mode 100644\n"
                "index 1111111..0000000\n--- a/escape/precious.txt\n+++ /dev/null\n"
                "@@ -1 +0,0 @@\n-do not touch\n"
            ),
        ),
        "p20-rename-through-symlink": (
            "renames a tree file through a symlink",
            mbox(rename(FILE, "escape/stolen.py")),
        ),
        "p21-git-binary-patch": (
            "a GIT binary patch",
            mbox(
                "diff --git a/pkg/blob.bin b/pkg/blob.bin\nnew file mode 100644\n"
                "index 0000000..1111111\nGIT binary patch\nliteral 5\nMcmZ?wbYx@00ssI2\n\n"
                "literal 0\nHcmV?d00001\n\n"
            ),
        ),
        "p22-binary-files-differ": (
            "a 'Binary files differ' stanza",
            mbox(
                "diff --git a/pkg/blob.bin b/pkg/blob.bin\nnew file mode 100644\n"
                "index 0000000..1111111\nBinary files /dev/null and b/pkg/blob.bin differ\n"
            ),
        ),
        "p23-crlf-everywhere": ("CRLF line endings throughout", crlf),
        "p24-crlf-one-line": ("one CRLF line inside a hunk", one_crlf),
        "p25-truncated-hunk": ("the file ends in the middle of a hunk", truncated),
        "p26-hunk-count-too-large": (
            "hunk header promises more lines than it has",
            mbox(edit(hunk="@@ -1,3 +1,9 @@")),
        ),
        "p27-hunk-count-too-small": (
            "hunk header promises fewer lines than it has",
            mbox(edit(hunk="@@ -1,1 +1,1 @@")),
        ),
        "p28-empty": ("an empty file", b""),
        "p29-whitespace-only": ("only blank lines", b"\n\n   \n\t\n"),
        "p30-not-a-patch-text": ("prose, not a patch", b"Dear maintainer,\nplease apply.\n"),
        "p31-not-a-patch-png": ("a PNG image", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)),
        "p32-latin1-author": (
            "From header in Latin-1",
            mbox(new_file("pkg/ok.py")).replace(b"Mallory", "Mall\u00f6ry".encode("latin-1")),
        ),
        "p33-latin1-body": (
            "message body in Latin-1",
            mbox(new_file("pkg/ok.py")).replace(b"A hostile", "\u00c0 hostile".encode("latin-1")),
        ),
        "p34-no-from-line": ("a bare diff with no mbox From line", new_file("pkg/ok.py").encode()),
        "p35-no-diff": ("mail headers and a message, no diff", mbox("just words\n")),
        "p36-malformed-header": (
            "a header line without a colon",
            mbox(new_file("pkg/ok.py")).replace(b"Subject:", b"Subject"),
        ),
        "p37-no-subject": (
            "no Subject header",
            mbox(new_file("pkg/ok.py")).replace(b"Subject: [PATCH] hostile change\n", b""),
        ),
        "p38-bad-from": (
            "a From header with no address",
            mbox(new_file("pkg/ok.py")).replace(
                b"From: Mallory <mallory@example.invalid>", b"From: <>"
            ),
        ),
        "p39-bad-date": (
            "a Date that is not a date",
            mbox(new_file("pkg/ok.py")).replace(
                b"Date: Tue, 14 Nov 2023 22:13:20 +0000", b"Date: Caturday 99 Smarch 99999"
            ),
        ),
        "p40-nul-in-path": ("a NUL byte in a path", mbox(new_file("pkg/a\0b"))),
        "p41-backslash-path": (
            "a backslash path (a Windows climb)",
            mbox(new_file("pkg\\..\\..\\pwned")),
        ),
        "p42-huge-hunk-numbers": (
            "hunk line numbers beyond any integer type",
            mbox(edit(hunk="@@ -99999999999999999999999,3 +99999999999999999999999,3 @@")),
        ),
        "p43-hunk-before-header": (
            "a hunk before any ---/+++ lines",
            mbox("diff --git a/pkg/x b/pkg/x\n@@ -1 +1 @@\n-a\n+b\n"),
        ),
        "p44-overlong-path": ("a 5000-character path", mbox(new_file("pkg/" + "d" * 5000))),
    }


def series_cases() -> dict[str, tuple[str, str, dict[str, bytes]]]:
    """id -> (description, series text, extra patch files)."""
    ok = mbox(new_file("pkg/ok.py", "fine\n"), subject="a fine patch")
    return {
        "s01-missing-file": (
            "the series names a patch that is not there",
            "toy-01.patch\nnot-there.patch\n",
            {},
        ),
        "s02-listed-twice": (
            "the same patch listed twice",
            "toy-01.patch\nextra.patch\nextra.patch\n",
            {"extra.patch": ok},
        ),
        "s03-climbing-name": (
            "a series entry that climbs out of patches/",
            "toy-01.patch\n../../etc.patch\n",
            {},
        ),
        "s04-not-utf8": ("a series file that is not UTF-8", "toy-01.patch\n# caf\udce9\n", {}),
        "s05-absolute-name": (
            "a series entry with an absolute path",
            "toy-01.patch\n/etc/passwd.patch\n",
            {},
        ),
        "s06-symlinked-patch": (
            "a patch file that is a symlink to a file outside the project",
            "toy-01.patch\nlinked.patch\n",
            {"linked.patch": b"@symlink"},
        ),
    }


def tar_member(
    name: str,
    data: bytes = b"x\n",
    kind: bytes = tarfile.REGTYPE,
    linkname: str = "",
    size: int | None = None,
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mtime = 1700000000
    info.mode = 0o644
    info.size = len(data) if size is None and kind == tarfile.REGTYPE else (size or 0)
    return info, data


def tarball(members: list[tuple[tarfile.TarInfo, bytes]], truncate_data: bool = False) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if truncate_data:
                tar.fileobj.write(info.tobuf(tarfile.GNU_FORMAT))  # header only: a "bomb"
            else:
                tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def sdist_cases() -> dict[str, tuple[str, bytes]]:
    ok = [
        tar_member("toy-1.0/PKG-INFO", b"Name: toy\nVersion: 1.0\n"),
        tar_member("toy-1.0/toy/__init__.py", b"x = 1\n"),
    ]
    return {
        "a01-absolute-member": (
            "an sdist member with an absolute name",
            tarball(ok + [tar_member("/tmp/patchkit-pwned")]),
        ),
        "a02-dotdot-member": (
            "an sdist member climbing out with ..",
            tarball(ok + [tar_member("toy-1.0/../../pwned")]),
        ),
        "a03-symlink-member": (
            "an sdist member that is a symlink out of the tree",
            tarball(ok + [tar_member("toy-1.0/out", kind=tarfile.SYMTYPE, linkname="/etc")]),
        ),
        "a04-hardlink-member": (
            "an sdist member that is a hard link to /etc/passwd",
            tarball(ok + [tar_member("toy-1.0/pw", kind=tarfile.LNKTYPE, linkname="/etc/passwd")]),
        ),
        "a05-fifo-member": (
            "an sdist member that is a FIFO",
            tarball(ok + [tar_member("toy-1.0/fifo", kind=tarfile.FIFOTYPE)]),
        ),
        "a06-two-top-dirs": (
            "an sdist with two top-level directories",
            tarball(ok + [tar_member("other-1.0/x.py")]),
        ),
        "a07-bomb-member": (
            "a member that claims 8 GiB",
            tarball(ok + [tar_member("toy-1.0/bomb.bin", size=8 << 30)], truncate_data=True),
        ),
        "a08-not-gzip": ("an sdist that is not a gzip'd tar", b"PK\x03\x04 not a tarball"),
        "a09-dotgit-member": (
            "an sdist carrying a .git/config (hooks via core.hooksPath)",
            tarball(ok + [tar_member("toy-1.0/.git/config", b"[core]\n\thooksPath = /tmp\n")]),
        ),
    }


def wheel(
    members: list[tuple[str, bytes]],
    extra: list[zipfile.ZipInfo] | None = None,
    zeros: tuple[str, int] | None = None,
) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2023, 11, 14, 22, 13, 20))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
        for info in extra or []:
            zf.writestr(info, b"/etc/passwd")
        if zeros:
            info = zipfile.ZipInfo(zeros[0], date_time=(2023, 11, 14, 22, 13, 20))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as out:
                chunk = bytes(1 << 20)
                for _ in range(zeros[1] >> 20):
                    out.write(chunk)
    return raw.getvalue()


WHEEL_BASE = [
    ("toy/__init__.py", b"x = 1\n"),
    ("toy-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: toy\nVersion: 1.0\n"),
    ("toy-1.0.dist-info/WHEEL", b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    (
        "toy-1.0.dist-info/RECORD",
        b"toy/__init__.py,,\ntoy-1.0.dist-info/METADATA,,\n"
        b"toy-1.0.dist-info/WHEEL,,\ntoy-1.0.dist-info/RECORD,,\n",
    ),
]


def wheel_cases() -> dict[str, tuple[str, bytes]]:
    link = zipfile.ZipInfo("toy/libescape.so", date_time=(2023, 11, 14, 22, 13, 20))
    link.external_attr = 0o120777 << 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate name, on purpose
        dup = wheel(WHEEL_BASE + [("toy/__init__.py", b"import os; os.system('id')\n")])
    return {
        "w01-zip-slip": (
            "a wheel member named ../../pwned.so",
            wheel(WHEEL_BASE + [("../../pwned.so", b"\x7fELF")]),
        ),
        "w02-absolute-member": (
            "a wheel member with an absolute name",
            wheel(WHEEL_BASE + [("/tmp/pwned.so", b"\x7fELF")]),
        ),
        "w03-symlink-member": (
            "a wheel member that is a symlink to /etc/passwd",
            wheel(WHEEL_BASE, extra=[link]),
        ),
        "w04-duplicate-names": ("two members with the same name", dup),
        "w06-no-record": (
            "a wheel without its dist-info RECORD",
            wheel([m for m in WHEEL_BASE if not m[0].endswith("RECORD")]),
        ),
        "w05-bomb-member": (
            "a .so of 256 MiB of zeros, compressed to about 250 KiB",
            wheel(WHEEL_BASE, zeros=("toy/libbomb.so", 256 << 20)),
        ),
    }


def generate(dest: Path) -> list[dict]:
    """Write every case under `dest`; returns the index (also written as dest/index.json)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    index = []

    def case(cid: str, kind: str, description: str, files: dict[str, bytes]) -> None:
        d = dest / cid
        d.mkdir()
        for name, data in files.items():
            (d / name).write_bytes(data)
        meta = {
            "id": cid,
            "kind": kind,
            "description": description,
            "files": sorted(files),
            "expect": "refused with a one- or two-line error, nothing written",
        }
        (d / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
        index.append(meta)

    for cid, (description, data) in patch_cases().items():
        case(cid, "patch", description, {"hostile.patch": data})
    for cid, (description, series, extra) in series_cases().items():
        files = {"series": series.encode("utf-8", "surrogateescape")}
        files.update({f"patch-{name}": data for name, data in extra.items()})
        case(cid, "series", description, files)
    for cid, (description, data) in sdist_cases().items():
        case(cid, "sdist", description, {"toy-1.0.tar.gz": data})
    for cid, (description, data) in wheel_cases().items():
        case(cid, "wheel", description, {"toy-1.0-py3-none-any.whl": data})
    (dest / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("corpus")
    cases = generate(out)
    print(f"{len(cases)} cases written to {out}")

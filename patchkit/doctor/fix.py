"""`doctor draft --fix OUT`: a renamed copy of a draft that SGLang loads.

Tensors are renamed in the headers and their bytes copied unchanged; the config is written in
SGLang's layout when the draft's was another library's.  ``OUT`` must not exist yet (or be an
empty folder); it appears complete or not at all.  ``patchkit-doctor-fix.json`` in it records
the renaming, the config changes and the sha256 of every tensor and file.  The copy is written
beside ``OUT`` and renamed onto it; a killed run's copy is removed by the next patchkit run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import scratch
from patchkit.doctor.checkpoint import INDEX, Checkpoint, load_checkpoint
from patchkit.doctor.draft import DraftReport
from patchkit.doctor.safetensors import tensor_sha256, write_renamed
from patchkit.errors import UsageError

MANIFEST = "patchkit-doctor-fix.json"


@dataclass
class FixResult:
    out: Path
    renamed: dict[str, str]
    config_rewritten: bool
    files: dict[str, str] = field(default_factory=dict)  # file -> sha256
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "out": str(self.out),
            "renamed": self.renamed,
            "config_rewritten": self.config_rewritten,
            "files": self.files,
            "copied": self.copied,
            "skipped": self.skipped,
        }


def write_fixed(report: DraftReport, draft: Path, out: Path) -> FixResult:
    """Write the fixed copy of ``draft`` at ``out`` following ``report``'s rename and config.

    The copy is made in a folder beside ``out`` (``.<out>.fix-*``, recorded in the process's
    scratch folder, so a killed run's copy is removed by the next run) and renamed onto it."""
    out = out.expanduser()
    _refuse_out(out, draft)
    ckpt = load_checkpoint(draft)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(scratch.folder_beside(out, "fix"))
    result = FixResult(out, dict(report.rename), report.fixed_config is not None)
    try:
        tensors = _write_tensors(report, ckpt, staging)
        _write_config_and_index(report, ckpt, draft, staging)
        _copy_other_files(draft, staging, out, result)
        for file in sorted(staging.iterdir()):
            result.files[file.name] = _sha256(file)
        manifest = {
            "source": str(draft.resolve()),
            "sglang": report.source,
            "renamed": report.rename,
            "config": "rewritten in SGLang's layout" if result.config_rewritten else "copied",
            "original_config_sha256": _sha256(draft / "config.json"),
            "tensors": tensors,
            "files": result.files,
            "not_copied": result.skipped,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def _refuse_out(out: Path, draft: Path) -> None:
    """OUT must be a new folder (or an empty one), not a link and not the draft itself."""
    if out.is_symlink():  # the finished folder is renamed into place: never through a link
        raise UsageError(f"--fix {out}: is a link; nothing was written", hint="pass a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"--fix {out}: already exists and is not empty; nothing was written",
            hint="pass a new folder",
        )
    if out.resolve() == draft.resolve():
        raise UsageError("--fix must name a new folder, not the draft itself")


def _write_tensors(report: DraftReport, ckpt: Checkpoint, staging: Path) -> dict[str, dict]:
    """Each shard renamed into ``staging``, every tensor's bytes checked against the source;
    returns the manifest's record of each tensor by its new name."""
    tensors: dict[str, dict] = {}
    for header in ckpt.headers:
        rename = {k: v for k, v in report.rename.items() if k in header.tensors}
        digests = write_renamed(header, rename, staging / header.path.name)
        back = {rename.get(k, k): k for k in header.tensors}
        for new, digest in digests.items():
            original = tensor_sha256(header, header.tensors[back[new]])
            if original != digest:  # the copy must be the same bytes
                raise UsageError(
                    f"copy of {back[new]} differs from the source; nothing was written"
                )
            tensors[new] = {"from": back[new], "file": header.path.name, "sha256": digest}
    return tensors


def _write_config_and_index(report: DraftReport, ckpt: Checkpoint, draft: Path, staging: Path):
    """config.json (in SGLang's layout when the draft's was another) and the shard index with
    the new names."""
    config = report.fixed_config if report.fixed_config is not None else ckpt.config
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if (draft / INDEX).exists():
        index = json.loads((draft / INDEX).read_text())
        index["weight_map"] = {
            report.rename.get(k, k): v for k, v in index.get("weight_map", {}).items()
        }
        (staging / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _copy_other_files(draft: Path, staging: Path, out: Path, result: FixResult) -> None:
    """The draft's other plain files (tokenizer, generation config); code (config.py), links
    and folders stay behind."""
    for entry in sorted(draft.iterdir()):
        name = entry.name
        if name in ("config.json", INDEX, MANIFEST) or name.endswith(".safetensors"):
            continue
        if entry.resolve() in (staging.resolve(), out.resolve()):
            continue  # OUT inside the draft folder
        if entry.is_file() and not entry.is_symlink() and entry.suffix != ".py":
            shutil.copyfile(entry, staging / name)
            result.copied.append(name)
        else:
            result.skipped.append(name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

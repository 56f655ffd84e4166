"""`patchkit.json`: what a patched wheel was made from, stored in its `.dist-info/`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from patchkit.series import Patch, Series
from patchkit.upstream import Base

PROVENANCE_FILE = "patchkit.json"
SCHEMA = 1
URL_RE = re.compile(r"https?://\S+")
LINK_TRAILERS = ("Origin", "Forwarded", "Applied-Upstream", "Bug")


def upstream_links(patch: Patch) -> list[str]:
    """URLs named in the patch's DEP-3 trailers (upstream PR, bug, commit), in trailer order."""
    links: list[str] = []
    for key in LINK_TRAILERS:
        for url in URL_RE.findall(patch.trailer(key) or ""):
            url = url.rstrip(".,;)")
            if url not in links:
                links.append(url)
    return links


@dataclass(frozen=True)
class PatchRecord:
    name: str
    sha256: str
    subject: str
    origin: str | None
    forwarded: str | None
    upstream_links: tuple[str, ...]

    @classmethod
    def of(cls, patch: Patch) -> PatchRecord:
        return cls(
            patch.name,
            patch.sha256,
            patch.subject,
            patch.trailer("Origin"),
            patch.trailer("Forwarded"),
            tuple(upstream_links(patch)),
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "subject": self.subject,
            "origin": self.origin,
            "forwarded": self.forwarded,
            "upstream_links": list(self.upstream_links),
        }


@dataclass(frozen=True)
class Provenance:
    """Everything a patched wheel records about its making."""

    distribution: str
    version: str
    target: str
    upstream_version: str
    upstream_git: str
    upstream_commit: str | None  # the real upstream commit, when known
    base_commit: str  # the mirror commit the series was applied onto
    base_source: str  # git | sdist | upstream
    sdist: str | None
    sdist_sha256: str | None
    series_version: str
    series_hash: str
    result_commit: str
    patches: tuple[PatchRecord, ...]
    profile: dict
    tools: dict[str, str]
    source_date_epoch: int
    schema: int = SCHEMA
    extra: dict = field(default_factory=dict)
    line: str = ""  # the series line the wheel carries
    wheel: str | None = None  # a wheel base: the pinned upstream wheel repacked
    wheel_sha256: str | None = None

    @property
    def series_label(self) -> str:
        line = f" line {self.line}" if self.line else ""
        return f"{self.target}{line} series {self.series_version} ({self.series_hash[:12]})"

    def to_json(self) -> dict:
        return {
            "schema": self.schema,
            "distribution": self.distribution,
            "version": self.version,
            "upstream": {
                "target": self.target,
                "version": self.upstream_version,
                "git": self.upstream_git,
                "commit": self.upstream_commit,
                "base_commit": self.base_commit,
                "source": self.base_source,
                "sdist": self.sdist,
                "sdist_sha256": self.sdist_sha256,
                "wheel": self.wheel,
                "wheel_sha256": self.wheel_sha256,
            },
            "series": {
                "line": self.line,
                "version": self.series_version,
                "hash": self.series_hash,
                "result_commit": self.result_commit,
                "patches": [p.to_json() for p in self.patches],
            },
            "profile": self.profile,
            "tools": dict(sorted(self.tools.items())),
            "source_date_epoch": self.source_date_epoch,
        }

    def dumps(self) -> bytes:
        """Stable bytes (sorted keys, fixed indentation) so rebuilds are byte-identical."""
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: dict) -> Provenance:
        up, series = data.get("upstream", {}), data.get("series", {})
        patches = tuple(
            PatchRecord(
                p.get("name", "?"),
                p.get("sha256", ""),
                p.get("subject", ""),
                p.get("origin"),
                p.get("forwarded"),
                tuple(p.get("upstream_links", [])),
            )
            for p in series.get("patches", [])
        )
        return cls(
            distribution=data.get("distribution", "?"),
            version=data.get("version", "?"),
            target=up.get("target", "?"),
            upstream_version=up.get("version", "?"),
            upstream_git=up.get("git", ""),
            upstream_commit=up.get("commit"),
            base_commit=up.get("base_commit", ""),
            base_source=up.get("source", ""),
            sdist=up.get("sdist"),
            sdist_sha256=up.get("sdist_sha256"),
            series_version=series.get("version", "?"),
            series_hash=series.get("hash", ""),
            result_commit=series.get("result_commit", ""),
            patches=patches,
            profile=data.get("profile", {}),
            tools=data.get("tools", {}),
            source_date_epoch=int(data.get("source_date_epoch", 0)),
            schema=int(data.get("schema", 0)),
            line=series.get("line") or "",
            wheel=up.get("wheel"),
            wheel_sha256=up.get("wheel_sha256"),
        )


def make_provenance(
    *,
    distribution: str,
    version: str,
    base: Base,
    upstream_git: str,
    series: Series,
    series_version: str,
    result_commit: str,
    profile: dict,
    tools: dict[str, str],
    source_date_epoch: int,
    line: str = "",
) -> Provenance:
    """The provenance of one wheel build."""
    release = base.release
    return Provenance(
        distribution=distribution,
        version=version,
        target=series.target,
        upstream_version=release.version if release else "unknown",
        upstream_git=upstream_git,
        upstream_commit=base.upstream_commit,
        base_commit=base.commit,
        base_source=base.source,
        sdist=release.sdist if (release and base.source == "sdist") else None,
        sdist_sha256=base.sdist_sha256,
        series_version=series_version,
        series_hash=series.hash(),
        result_commit=result_commit,
        patches=tuple(PatchRecord.of(p) for p in series.patches),
        profile=profile,
        tools=tools,
        source_date_epoch=source_date_epoch,
        line=line,
        wheel=base.wheel,
        wheel_sha256=base.wheel_sha256,
    )

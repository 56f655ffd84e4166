"""The CycloneDX SBOM of a patched wheel (PEP 770: `.dist-info/sboms/`), via cyclonedx-python-lib.

The component is the patched distribution; `pedigree.ancestors` names the upstream release it
was made from and `pedigree.patches` carries each patch (type `unofficial`) with its diff and
upstream link.  Serial number, timestamp and bom-refs are derived from the inputs, so the same
build gives the same bytes.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from cyclonedx.model import (
    AttachedText,
    ExternalReference,
    ExternalReferenceType,
    HashAlgorithm,
    HashType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import (
    Component,
    ComponentType,
    Diff,
    Patch,
    PatchClassification,
    Pedigree,
)
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

from patchkit import __version__
from patchkit.series import Series
from patchkit.wheels.provenance import Provenance

SBOM_DIR = "sboms"
SBOM_FILE = "patchkit.cdx.json"
SCHEMA_VERSION = SchemaVersion.V1_6
NAMESPACE = uuid.UUID("6f1c7b52-3d0e-4a55-9d43-2b7e0c7a9a10")  # patchkit's uuid5 namespace


def _purl(name: str, version: str) -> PackageURL:
    return PackageURL(type="pypi", name=name.lower().replace("_", "-"), version=version)


def make_sbom(prov: Provenance, series: Series) -> bytes:
    """The SBOM of the wheel `prov` describes, as CycloneDX 1.6 JSON bytes."""
    ancestor = Component(
        type=ComponentType.LIBRARY,
        name=prov.distribution,
        version=prov.upstream_version,
        bom_ref=f"upstream:{prov.distribution}@{prov.upstream_version}",
        purl=_purl(prov.distribution, prov.upstream_version),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=prov.sdist_sha256 or prov.wheel_sha256)]
        if prov.sdist_sha256 or prov.wheel_sha256
        else None,
        external_references=[
            ExternalReference(
                type=ExternalReferenceType.VCS,
                url=XsUri(
                    prov.upstream_git + (f"#{prov.upstream_commit}" if prov.upstream_commit else "")
                ),
            )
        ]
        if prov.upstream_git
        else None,
    )
    patches = []
    for patch in series.patches:
        record = next(r for r in prov.patches if r.name == patch.name)
        link = record.upstream_links[0] if record.upstream_links else None
        patches.append(
            Patch(
                type=PatchClassification.UNOFFICIAL,
                diff=Diff(
                    text=AttachedText(content=patch.diff, content_type="text/x-diff"),
                    url=XsUri(link) if link else None,
                ),
            )
        )
    component = Component(
        type=ComponentType.LIBRARY,
        name=prov.distribution,
        version=prov.version,
        bom_ref=f"{prov.distribution}@{prov.version}",
        purl=_purl(prov.distribution, prov.version),
        description=f"{prov.distribution} {prov.upstream_version} with the patchkit "
        f"{prov.series_label}",
        pedigree=Pedigree(
            ancestors=[ancestor],
            patches=patches,
            notes=f"{prov.series_label}: " + ", ".join(r.name for r in prov.patches),
        ),
        properties=[
            Property(name="patchkit:series:version", value=prov.series_version),
            Property(name="patchkit:series:hash", value=prov.series_hash),
            Property(name="patchkit:base:commit", value=prov.base_commit),
            Property(name="patchkit:profile", value=str(prov.profile.get("name", ""))),
            *(
                Property(name=f"patchkit:patch:{r.name}:sha256", value=r.sha256)
                for r in prov.patches
            ),
        ],
    )
    tools = ToolRepository(
        components=[
            Component(
                type=ComponentType.APPLICATION,
                name="patchkit",
                version=__version__,
                bom_ref=f"tool:patchkit@{__version__}",
            )
        ]
    )
    serial = uuid.uuid5(
        NAMESPACE,
        f"{prov.distribution}=={prov.version}:{prov.series_hash}:"
        f"{prov.base_commit}:{prov.profile.get('sha256', '')}",
    )
    bom = Bom(serial_number=serial)
    bom.metadata.component = component
    bom.metadata.tools = tools
    bom.metadata.timestamp = datetime.fromtimestamp(prov.source_date_epoch, tz=timezone.utc)
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    return (text.rstrip("\n") + "\n").encode("utf-8")


def validate_sbom(data: bytes | str) -> str | None:
    """Check SBOM JSON against the CycloneDX schema (the library's strict validator).

    Returns None when valid, else the validator's message.  Needs the library's
    `json-validation` extra (jsonschema); raises ImportError-derived errors without it.
    """
    from cyclonedx.validation.json import JsonStrictValidator

    text = data.decode("utf-8") if isinstance(data, bytes) else data
    error = JsonStrictValidator(SCHEMA_VERSION).validate_str(text)
    return None if error is None else str(error)

"""Patched wheels: build (apply + PyPA build + reproducible layout), provenance, SBOM, inspect."""

from patchkit.wheels.build import BuildOptions, BuildReport, WheelBuild, build_wheels, wheel_version
from patchkit.wheels.profile import DEFAULT_PROFILE, BuildProfile, load_build_profile

__all__ = [
    "DEFAULT_PROFILE",
    "BuildOptions",
    "BuildProfile",
    "BuildReport",
    "WheelBuild",
    "build_wheels",
    "load_build_profile",
    "wheel_version",
]

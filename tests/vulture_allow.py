"""Names vulture reports as unused that are used: by click, HTMLParser, zipfile, urllib3 or
signal through their protocols, by the tests and benchmarks as oracles, or kept as ELF
constants the tests read. `make lint` runs `vulture patchkit tests/vulture_allow.py`: a new name found
unused anywhere else is dead code to delete."""

# ruff: noqa
SHN_UNDEF  # patchkit/abi/elf.py
STB_GLOBAL  # patchkit/abi/elf.py
STB_GNU_UNIQUE  # patchkit/abi/elf.py
STB_WEAK  # patchkit/abi/elf.py
classify_pending  # patchkit/abi/sources.py
_.format_commands  # patchkit/cli.py
frame  # patchkit/cli.py
draft_command  # patchkit/commands/doctor.py
weight  # patchkit/doctor/expected.py
_.args_  # patchkit/gitops/faults.py
_.args_  # patchkit/gitops/faults.py
ConnectionCls  # patchkit/net/session.py (urllib3's pools read it)
_.pool_classes_by_scheme  # patchkit/net/session.py (urllib3's PoolManager reads it)
__getattr__  # patchkit/upstream/__init__.py
_.handle_starttag  # patchkit/upstream/index.py
_.handle_data  # patchkit/upstream/index.py
_.handle_endtag  # patchkit/upstream/index.py
variant_source  # patchkit/wheels/profile.py
_.create_system  # patchkit/wheels/reproducible.py
_.start_dir  # patchkit/wheels/reproducible.py
check_record  # patchkit/wheels/reproducible.py
validate_sbom  # patchkit/wheels/sbom.py

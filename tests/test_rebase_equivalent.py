"""`rebase`'s equivalence signal (definitions-present) on a small real git upstream.

The shape is that of eagle3-aux-capture-before-cuda-graphs.patch against SGLang 0.5.11+: the
patch adds a method, calls it earlier, and removes the late calls it replaces; upstream did the
same with its own text.  The signal must fire for that, and must not fire when upstream only
added a method of the same name (the replaced calls still there, or no call of it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git, result_of

from patchkit.series import parse_patch

RUNNER = "python/pkg/runner.py"

OLD = """class Runner:
    def initialize(self):
        self.load_model()
        self.init_device_graphs()
        if self.use_aux:
            self.model.set_layers(self.layer_ids)

    def init_device_graphs(self):
        if self.use_aux:
            self.model.set_layers()
        self.capture()
"""

PATCHED = '''class Runner:
    def initialize(self):
        self.load_model()
        # Before graph capture: the graphs bake in the layer choice.
        self.init_aux_capture()
        self.init_device_graphs()

    def init_aux_capture(self):
        """Select the aux layers (before graph capture)."""
        if self.use_aux:
            self.model.set_layers(self.layer_ids)

    def init_device_graphs(self):
        self.capture()
'''

# Upstream's own version: other text, same effect.
UPSTREAM_EQUIVALENT = '''class Runner:
    def initialize(self):
        self.load_model()
        self.init_aux_capture()
        if self.device == "cuda":
            self.init_device_graphs()

    def init_aux_capture(self):
        """Configure aux capture; must run before CUDA graph capture."""
        if not self.use_aux:
            return
        self.model.set_layers(self.layer_ids)

    def init_device_graphs(self):
        # layers were configured by init_aux_capture()
        self.capture()
'''

# Same name added upstream, but the argument-less reset before capture is still there.
UPSTREAM_KEEPS_RESET = UPSTREAM_EQUIVALENT.replace(
    "        # layers were configured by init_aux_capture()\n",
    "        if self.use_aux:\n            self.model.set_layers()\n",
)

# Same name added upstream, never called.
UPSTREAM_UNCALLED = UPSTREAM_EQUIVALENT.replace(
    "        self.init_aux_capture()\n        if", "        if"
)


def _commit(work: Path, text: str, message: str) -> str:
    path = work / RUNNER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-qm", message)
    return git(work, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A bare repository: the old base, the patched tree and three new bases off the old one."""
    work = tmp_path_factory.mktemp("equivalent") / "up"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    git(work, "config", "user.name", "t")
    git(work, "config", "user.email", "t@t.invalid")
    revs = {"old": _commit(work, OLD, "old base")}
    revs["patched"] = _commit(work, PATCHED, "Select aux layers before graph capture")
    diff = git(
        work, "format-patch", "--stdout", "--full-index", "--no-signature", "--zero-commit", "-1"
    )
    for name, text in (
        ("equivalent", UPSTREAM_EQUIVALENT),
        ("keeps-reset", UPSTREAM_KEEPS_RESET),
        ("uncalled", UPSTREAM_UNCALLED),
    ):
        git(work, "checkout", "-q", "-B", name, revs["old"])
        revs[name] = _commit(work, text, f"upstream: {name}")
    bare = work.parent / "up.git"
    git(work.parent, "clone", "-q", "--bare", str(work), str(bare))
    return bare, revs, parse_patch("aux-before-graphs.patch", diff.encode())


def _signal(upstream, new_base: str):
    from patchkit import gitops
    from patchkit.classify.definitions import definitions_signal

    bare, revs, patch = upstream
    return definitions_signal(gitops.Repo.bare_at(bare), revs[new_base], revs["old"], patch)


def test_equivalent_upstream_with_its_call_and_the_resets_gone_fires(upstream):
    signal = _signal(upstream, "equivalent")
    assert signal.fired is True, signal.detail
    assert "1/1 public definitions" in signal.detail and "init_aux_capture" in signal.detail


def test_same_name_but_the_replaced_reset_still_upstream_does_not_fire(upstream):
    signal = _signal(upstream, "keeps-reset")
    assert signal.fired is False
    assert "removed line(s) are still in the new base" in signal.detail


def test_same_name_never_called_upstream_does_not_fire(upstream):
    signal = _signal(upstream, "uncalled")
    assert signal.fired is False
    assert "added statement(s) outside them are not in the new base" in signal.detail


def test_old_base_itself_does_not_fire(upstream):
    signal = _signal(upstream, "old")
    assert signal.fired is False
    assert "0/1 public definitions" in signal.detail


# --- the conflict replay leaves out what upstream already has --------------------------------

KIMI = "kimi-k25-eagle3-delegation.patch"
KIMI_FILE = "python/sglang/srt/models/kimi_k25.py"
SIZES_FILE = "python/sglang/srt/distributed/device_communicators/all_reduce_utils.py"
SM100_LAST = "        8: 128 * MiB,  # 128 MB\n    },\n}\n"
# Upstream adds an entry of its own where the patch adds capability 12: a conflict.
SM11 = "    11: {\n        2: 64 * MiB,\n    },\n"
SM12 = "    12: {\n        2: 32 * MiB,\n    },\n"
SM100_LAST_EDITED = SM100_LAST[: -len("}\n")] + SM11 + "}\n"
# Upstream's own delegation (as SGLang 0.5.10 has it): other text, elsewhere in the class.
KIMI_UPSTREAM = """    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if not hasattr(self.language_model, "set_eagle3_layers_to_capture"):
            raise AttributeError("language_model does not support EAGLE-3.")
        self.language_model.set_eagle3_layers_to_capture(layer_ids)

    def get_embed_and_head(self):
        return self.language_model.get_embed_and_head()

    def set_embed_and_head(self, embed, head):
        self.language_model.set_embed_and_head(embed, head)

"""


@pytest.fixture
def equivalent_project(project, cache, upstream_remote, tmp_path, monkeypatch):
    """A project on v0.5.9 of a git upstream whose next release edits the symm-mem size table
    (the patch conflicts) and has its own Kimi-K2.5 delegation (the patch is upstream as an
    equivalent); the series is those two patches, the conflicting one first."""
    from rebase_fixtures import SYMM_MEM, set_series

    work = tmp_path / "up"
    git(tmp_path, "clone", "-q", str(upstream_remote), str(work))
    git(work, "checkout", "-q", "-B", "next", "v0.5.9")
    sizes = work / SIZES_FILE
    assert sizes.read_text().count(SM100_LAST) == 1
    sizes.write_text(sizes.read_text().replace(SM100_LAST, SM100_LAST_EDITED))
    kimi = work / KIMI_FILE
    anchor = "    def load_weights(self, weights"
    assert kimi.read_text().count(anchor) == 1
    kimi.write_text(kimi.read_text().replace(anchor, KIMI_UPSTREAM + anchor))
    git(work, "commit", "-qam", "Tune SM100 symm-mem sizes; Kimi-K2.5 EAGLE-3 hooks")
    git(work, "tag", "v0.5.9.9")
    bare = tmp_path / "up.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "0")  # the "remote" is a local path
    toml = project / "patches" / "targets.toml"
    head, sep, rest = toml.read_text().partition("[targets.sglang]")
    _, sep2, tail = rest.partition("[targets.flashinfer]")
    base = git(work, "rev-parse", "v0.5.9").strip()
    sglang = (
        f'\ngit = "{bare}"\nsubdir = "python"\ndefault_line = "0.5.9"\n\n'
        '[targets.sglang.lines."0.5.9"]\npin = "0.5.9.0"\nseries = "sglang/0.5.9"\n\n'
        '[[targets.sglang.releases]]\nversion = "0.5.9.0"\ntag = "v0.5.9"\n'
        f'commit = "{base}"\n\n'
    )
    toml.write_text(head + sep + sglang + sep2 + tail)
    set_series(project, "sglang", [SYMM_MEM, KIMI])
    return project


@pytest.mark.slow
def test_replay_after_a_conflict_leaves_out_the_upstreamed_patch(equivalent_project):
    from helpers import patchkit

    r = patchkit("rebase", "--target", "sglang@v0.5.9.9", "--conflict-tree")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CONFLICT  sm120-torch-symm-mem-allreduce.patch" in r.stdout
    assert f"upstreamed  {KIMI}" in r.stdout
    tree = equivalent_project / "work/rebase/sglang"
    sizes = tree / SIZES_FILE
    text = sizes.read_text()
    assert "<<<<<<< " in text
    # Resolve: upstream's capability 11, then the patch's capability 12.
    sizes.write_text(text.split("<<<<<<< ", 1)[0] + SM11 + SM12 + "}\n")
    git(tree, "add", SIZES_FILE)

    r = patchkit("rebase", "--continue")

    assert r.returncode == 0, r.stdout + r.stderr
    assert f"upstreamed  {KIMI}" in r.stdout
    assert "kept by git rebase" not in r.stdout
    kimi = git(tree, "show", f"HEAD:{KIMI_FILE}")
    assert kimi.count("def set_eagle3_layers_to_capture") == 1, "replayed next to upstream's"
    assert "language_model does not support EAGLE-3." in kimi


# --- the real 0.5.9 line onto the real 0.5.12 wheels ------------------------------------------

# What each part-1 patch of the 0.5.9 line is against the 0.5.12 wheels (read in their code):
# the fusion patch's RMSNorm body moved into _forward_with_allreduce_fusion() (conflict); the
# symm-mem files only gained a header (offset); the aux-capture hunks merge; the Kimi hooks are
# upstream since 0.5.10 and the aux layers before graph capture since 0.5.11 (both equivalents);
# a wheel base has no pyproject.toml for the packaging pins, and the wheel's Requires-Dist
# declares the CUDA 13 stack itself (obsolete).
EXPECTED_0512 = {
    "sm120-flashinfer-allreduce-fusion.patch": "conflict",
    "sm120-torch-symm-mem-allreduce.patch": "offset",
    "kimi-k25-eagle3-delegation.patch": "upstreamed",
    "eagle3-aux-capture-post-allreduce.patch": "merged",
    "eagle3-aux-capture-before-cuda-graphs.patch": "upstreamed",
    "cu130-packaging-pins.patch": "obsolete",
}


@pytest.mark.slow
def test_real_0_5_9_line_onto_the_0_5_12_wheels(
    project, sglang_0512_wheels, warm_mirrors, tmp_path, monkeypatch
):

    from helpers import patchkit, private_cache

    monkeypatch.setenv("PATCHKIT_CACHE", str(private_cache(warm_mirrors, tmp_path / "cache")))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "1")

    r = patchkit("rebase", "--target", "sglang@0.5.12", "--line", "0.5.9", "--json")

    assert r.returncode in (0, 1), r.stderr
    doc = result_of(r.stdout)
    labels = {p["name"]: p["label"] for p in doc["patches"]}
    assert {n: labels[n] for n in EXPECTED_0512} == EXPECTED_0512
    by = {p["name"]: p for p in doc["patches"]}
    for name in ("kimi-k25-eagle3-delegation.patch", "eagle3-aux-capture-before-cuda-graphs.patch"):
        fired = [s["name"] for s in by[name]["signals"] if s["fired"]]
        assert fired[0] == "definitions-present", (name, by[name]["signals"])
    pins = {s["name"]: s for s in by["cu130-packaging-pins.patch"]["signals"]}["requires-dist"]
    assert pins["fired"] is True
    assert "cuda-python>=13.0,<14 (release: cuda-python>=13.0)" in pins["detail"]
    assert "torchvision==0.24.1 (release: torchvision)" in pins["detail"]  # left open

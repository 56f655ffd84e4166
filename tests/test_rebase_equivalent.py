"""`rebase`'s equivalence signal (definitions-present) on a small real git upstream.

The shape is that of eagle3-aux-capture-before-cuda-graphs.patch against SGLang 0.5.11+: the
patch adds a method, calls it earlier, and removes the late calls it replaces; upstream did the
same with its own text.  The signal must fire for that, and must not fire when upstream only
added a method of the same name (the replaced calls still there, or no call of it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git

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
    from patchkit.rebase import _definitions_signal

    bare, revs, patch = upstream
    return _definitions_signal(bare, revs[new_base], revs["old"], patch)


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

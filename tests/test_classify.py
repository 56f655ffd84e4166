"""`patchkit.classify`'s evidence on the real series: the patch's own Applied-Upstream trailer,
a packaging patch against a release's Requires-Dist, rename hints that stay inside the
package, and upstream's delta read from `git diff` (renames, definitions added anywhere)."""

from __future__ import annotations

import pytest
from helpers import ROOT

from patchkit.classify.definitions import relocated_signal
from patchkit.classify.delta import read_delta
from patchkit.classify.hints import moved_hint, requires_dist_signal, same_package_namesakes
from patchkit.classify.signals import trailer_signal
from patchkit.series import parse_patch

LINE = ROOT / "patches" / "sglang" / "0.5.9"


def _patch(name: str):
    return parse_patch(name, (LINE / name).read_bytes())


def test_the_trailer_is_evidence_from_the_release_it_names_on():
    patch = _patch("eagle3-aux-capture-before-cuda-graphs.patch")  # Applied-Upstream: 0.5.11
    assert trailer_signal(patch, "0.5.10").fired is False
    for release in ("0.5.11", "0.5.12.post1", "0.5.23"):
        signal = trailer_signal(patch, release)
        assert signal.fired is True and "Applied-Upstream: 0.5.11" in signal.detail
    assert trailer_signal(_patch("sm120-torch-symm-mem-allreduce.patch"), "0.5.23").fired is False


# The Requires-Dist of SGLang 0.5.23's wheel, as its METADATA lists them (the lines that matter).
REQUIRES_0523 = ["cuda-python>=13.0", "torch==2.14.1", "torchaudio==2.11.0", "torchvision"]
# SGLang 0.5.9's own pins (its pyproject.toml): the CUDA 12 stack the patch moves off.
REQUIRES_0509 = ["cuda-python==12.9", "torch==2.9.1", "torchaudio==2.9.1", "torchvision"]


def test_a_packaging_patch_is_met_by_a_release_that_requires_cuda_13():
    signal = requires_dist_signal(_patch("cu130-packaging-pins.patch"), REQUIRES_0523)
    assert signal.fired is True
    assert "met by the release's Requires-Dist: cuda-python>=13.0,<14" in signal.detail
    assert "left open by the release" in signal.detail and "torchvision==0.24.1" in signal.detail


def test_a_packaging_patch_is_contradicted_by_a_cuda_12_release():
    signal = requires_dist_signal(_patch("cu130-packaging-pins.patch"), REQUIRES_0509)
    assert signal.fired is False
    assert "contradicted by the release: cuda-python>=13.0,<14 (release: cuda-python==12.9)" in (
        signal.detail
    )


def test_no_requires_dist_without_a_wheel_base():
    assert requires_dist_signal(_patch("cu130-packaging-pins.patch"), None).fired is None


SRT = "python/sglang/srt"


def test_a_namesake_in_another_package_or_an_old_one_is_no_hint():
    old = {f"{SRT}/layers/communicator.py", f"{SRT}/disaggregation/communicator.py"}
    present = {
        f"{SRT}/disaggregation/communicator.py",  # existed beside it before: not where it went
        "python/sglang/multimodal_gen/runtime/communicator.py",  # another package
        "python/sglang/jit_kernel/pyproject.toml",  # a vendored project file
    }
    assert same_package_namesakes(f"{SRT}/layers/communicator.py", present, old) == []
    assert same_package_namesakes("python/pyproject.toml", present, {"python/pyproject.toml"}) == []


def test_a_namesake_new_beside_the_package_is_a_hint():
    old = {f"{SRT}/managers/scheduler_metrics_mixin.py"}
    present = {f"{SRT}/observability/scheduler_metrics_mixin.py"}
    assert same_package_namesakes(f"{SRT}/managers/scheduler_metrics_mixin.py", present, old) == [
        f"{SRT}/observability/scheduler_metrics_mixin.py"
    ]


DIFF = """diff --git a/pkg/runner.py b/pkg/runner.py
--- a/pkg/runner.py
+++ b/pkg/runner.py
@@ -1,8 +1,5 @@
 class Runner:
     def initialize(self):
-        if self.use_aux:
-            self.model.set_layers(self.layer_ids)
+        setup_aux(model=self.model, use_aux=self.use_aux, layer_ids=self.layer_ids)
         self.capture()
-        if self.use_aux:
-            self.model.set_layers()
diff --git a/pkg/old_helpers.py b/pkg/components/setup.py
similarity index 90%
rename from pkg/old_helpers.py
rename to pkg/components/setup.py
--- a/pkg/old_helpers.py
+++ b/pkg/components/setup.py
@@ -1,2 +1,9 @@
 import os
+
+def setup_aux(*, model, use_aux, layer_ids):
+    \"\"\"Select the aux layers: before graph capture.\"\"\"
+    if use_aux:
+        model.set_layers(layer_ids)
"""

PATCH = b"""From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: t <t@t.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: Select aux layers before capture

diff --git a/pkg/runner.py b/pkg/runner.py
--- a/pkg/runner.py
+++ b/pkg/runner.py
@@ -1,7 +1,8 @@
 class Runner:
     def initialize(self):
-        if self.use_aux:
-            self.model.set_layers(self.layer_ids)
+        self.init_aux_capture()
         self.capture()
-        if self.use_aux:
-            self.model.set_layers()
+
+    def init_aux_capture(self):
+        if self.use_aux:
+            self.model.set_layers(self.layer_ids)
"""


def test_the_delta_reads_renames_and_definitions_added_anywhere():
    delta = read_delta(DIFF)
    assert delta.renames == {"pkg/old_helpers.py": "pkg/components/setup.py"}
    [added] = delta.added
    assert (added.path, added.name) == ("pkg/components/setup.py", "setup_aux")
    assert "set_layers" in added.calls and "layer_ids" in added.names
    assert delta.calls_of("setup_aux") == ["pkg/runner.py"]
    assert delta.net("self.model.set_layers()") == -1


def test_a_definition_upstream_carries_under_another_name_elsewhere_is_relocated():
    patch = parse_patch("aux.patch", PATCH)
    signal = relocated_signal(patch, read_delta(DIFF))
    assert signal.fired is True, signal.detail
    assert "init_aux_capture as setup_aux in pkg/components/setup.py" in signal.detail


def test_not_relocated_while_upstream_keeps_what_the_patch_removes():
    kept = DIFF.replace("-        if self.use_aux:\n-            self.model.set_layers()\n", "")
    signal = relocated_signal(parse_patch("aux.patch", PATCH), read_delta(kept))
    assert signal.fired is False
    assert "line(s) the patch removes upstream did not remove" in signal.detail


def test_a_moved_file_is_named_from_git_rename_detection():
    patch = parse_patch("aux.patch", PATCH.replace(b"pkg/runner.py", b"pkg/old_helpers.py"))
    delta = read_delta(DIFF)
    hint = moved_hint(patch, {"pkg/components/setup.py"}, {"pkg/old_helpers.py"}, delta)
    assert "pkg/old_helpers.py -> pkg/components/setup.py (renamed upstream)" in hint


def test_per_file_trailers_declare_parts_upstream_from_their_release():
    from patchkit.classify.signals import part_claims

    patch = _patch("eagle3-aux-capture-post-allreduce.patch")
    claims = part_claims(patch)
    assert {p.rsplit("/", 1)[1]: str(c.release) for p, c in claims.items()} == {
        "deepseek_v2.py": "0.5.14",
        "glm4_moe.py": "0.5.21",
        "gpt_oss.py": "0.5.21",
        "bailing_moe.py": "0.5.21",
    }
    assert trailer_signal(patch, "0.5.20").fired is False  # only DeepSeek's part by then
    signal = trailer_signal(patch, "0.5.21")
    assert signal.fired is True and "4/4 of its files" in signal.detail


GONE = b"""From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: t <t@t.invalid>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: Accept the new arch in the gate

diff --git a/pkg/layers/comm.py b/pkg/layers/comm.py
--- a/pkg/layers/comm.py
+++ b/pkg/layers/comm.py
@@ -10,6 +10,6 @@ def fusion_applies(batch_size: int):
     return (
-        (_is_a or _is_b)
+        (_is_a or _is_b or _is_c)
         and _available
         and batch_size > 0
         and batch_size <= MAX_BATCH
     )
"""

MOVED = """diff --git a/pkg/layers/boundary/add_norm.py b/pkg/layers/boundary/add_norm.py
new file mode 100644
--- /dev/null
+++ b/pkg/layers/boundary/add_norm.py
@@ -0,0 +1,9 @@
+def other(batch_size: int):
+    return batch_size > 0 and _available
+
+def ar_fusion_applies(batch_size: int):
+    return (
+        (_is_a or _is_b)
+        and _available
+        and batch_size > 0
+        and batch_size <= MAX_BATCH
+    )
"""


def test_a_function_moved_to_a_new_module_under_another_name_is_found():
    from unidiff import PatchSet

    from patchkit.classify.moved import moved_code

    [pf] = PatchSet(parse_patch("gate.patch", GONE).diff)
    moved = moved_code(pf, read_delta(MOVED), "pkg/layers/comm.py")
    assert (moved.path, moved.name, moved.was) == (
        "pkg/layers/boundary/add_norm.py",
        "ar_fusion_applies",
        "fusion_applies",
    )
    # The condition it changes is not there: no home (the file is gone, not moved).
    assert moved_code(pf, read_delta(MOVED.replace("_is_a or _is_b", "_is_x")), "x") is None


@pytest.mark.slow
def test_the_0_5_9_line_on_the_0_5_23_wheel_moved_gate_and_declared_parts(
    project, sglang_0523_wheels, warm_mirrors, tmp_path, monkeypatch
):
    """On real 0.5.23 code: the fusion gate's file is gone but its function moved (renamed)
    into layer_boundary/residual/add_norm.py; the layernorm fallback and the aux capture are
    met differently upstream, as the patches' own Applied-Upstream-Part: trailers say."""
    import dataclasses

    from helpers import private_cache

    from patchkit.classify import carry_series
    from patchkit.lines import line_series
    from patchkit.rebase import new_base_facts
    from patchkit.upstream import Mirror, acquire, resolve_new_base
    from patchkit.workspace import Workspace

    cache = private_cache(warm_mirrors, tmp_path / "cache")
    monkeypatch.setenv("PATCHKIT_CACHE", str(cache))
    monkeypatch.setenv("PATCHKIT_OFFLINE_GIT", "1")
    ws = Workspace.load()
    target = ws.targets.get("sglang", "0.5.9")
    series = line_series(ws.project, target)
    wanted = ("sm120-flashinfer-allreduce-fusion.patch", "eagle3-aux-capture-post-allreduce.patch")
    series = dataclasses.replace(series, patches=[p for p in series.patches if p.name in wanted])
    old = acquire(target, None, cache=cache)
    new = resolve_new_base(target, "0.5.23", cache=cache)[0]

    carry = carry_series(Mirror(target, cache).repo, series, old.commit, new_base_facts(new, cache))

    fusion, aux = carry.outcomes
    parts = {p.path.rsplit("/", 1)[1]: p for p in fusion.parts}
    assert fusion.label == "conflict" and fusion.partly_upstreamed
    assert parts["communicator.py"].state == "moved"
    assert "layer_boundary/residual/add_norm.py" in parts["communicator.py"].detail
    assert "now flashinfer_ar_fusion_applies:" in parts["communicator.py"].detail
    assert "add_norm.py" in fusion.note  # the merge note names the new home, not a namesake
    assert parts["layernorm.py"].state == "upstreamed"
    assert "Applied-Upstream-Part: 0.5.21 layers/layernorm.py" in parts["layernorm.py"].detail
    assert aux.label == "upstreamed", aux.note
    assert "applied-upstream-trailer" in aux.fired

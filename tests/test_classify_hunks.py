"""`patchkit.classify.hunks` and `patchkit.classify.probes` on small sources shaped like the
real cases: a fallback all-reduce upstream wrote in both branches of an `if` (0.5.21) but not
under one other condition (0.5.13's AITER route), a capture handed to the layer (0.5.14), a
hunk of imports, and a probe's trailer."""

from __future__ import annotations

import subprocess

from unidiff import PatchSet

from patchkit.classify.delta import Delta
from patchkit.classify.hunks import hunk_verdicts
from patchkit.classify.probes import Probe, parse_probe, patch_probes, run_probes
from patchkit.series import parse_patch

OLD = """\
def fuse(x, residual):
    if residual is not None:
        fused = try_fused(x, residual)
        if fused is not None:
            return fused

    return norm(x, residual)
"""

FALLBACK = """\
--- a/pkg/norm.py
+++ b/pkg/norm.py
@@ -3,5 +3,6 @@ def fuse(x, residual):
         fused = try_fused(x, residual)
         if fused is not None:
             return fused
+        x = tensor_model_parallel_all_reduce(x)
~
     return norm(x, residual)
""".replace("~", " ")  # a blank context line

BOTH_BRANCHES = """\
def _fuse(x, residual, attn):
    if residual is not None:
        fused = try_fused(x, residual)
        if fused is not None:
            return fused
        # declined: reduce over the group the fused op would have used
        if attn:
            x = attention_tensor_model_parallel_all_reduce(x)
        else:
            x = deferred_post_experts_all_reduce(x)
        return norm(x, residual)
    return norm(x, residual)


def fuse(x, residual):
    return _fuse(x, residual, True)
"""

ONE_CONDITION = """\
def fuse(x, residual):
    if residual is not None:
        fused = try_fused(x, residual)
        if fused is not None:
            return fused

        if _use_aiter and aiter_enabled():
            x = tensor_model_parallel_all_reduce(x)
            return norm(x, residual)
    return norm(x, residual)
"""


def _verdicts(diff: str, old: str, new: str):
    [pf] = PatchSet(diff)
    return hunk_verdicts(pf, "pkg/norm.py", old, new, Delta())


def test_the_same_change_in_both_branches_of_an_if_in_the_function_that_took_the_body():
    [verdict] = _verdicts(FALLBACK, OLD, BOTH_BRANCHES)
    assert (verdict.state, verdict.how) == ("upstream", "same-change")
    assert "attention_tensor_model_parallel_all_reduce(x)" in verdict.evidence
    assert "pkg/norm.py::_fuse (was fuse)" in verdict.evidence


def test_the_same_call_under_one_other_condition_is_another_change():
    [verdict] = _verdicts(FALLBACK, OLD, ONE_CONDITION)
    assert verdict.state == "needed", verdict.evidence


LOOP = """\
class Model:
    def forward(self, hidden_states, residual):
        aux = []
        for i in range(self.start, self.end):
            if i in self.layers_to_capture:
                aux.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux
"""

CAPTURE = """\
--- a/pkg/model.py
+++ b/pkg/model.py
@@ -4,4 +4,6 @@ class Model:
         for i in range(self.start, self.end):
             if i in self.layers_to_capture:
+                if getattr(hidden_states, "_needs_allreduce", False):
+                    hidden_states = tensor_model_parallel_all_reduce(hidden_states)
                 aux.append(hidden_states + residual)
             hidden_states, residual = self.layers[i](hidden_states, residual)
"""

HANDED = """\
class Model:
    def forward(self, hidden_states, residual):
        aux = []
        for i in range(self.start, self.end):
            hidden_states, residual = self.layers[i](
                hidden_states,
                residual,
                capture_output=aux.append if i in self.layers_to_capture else None,
            )
        return hidden_states, aux
"""


def test_a_guarded_capture_handed_to_the_callee_is_delegated():
    [pf] = PatchSet(CAPTURE)
    [verdict] = hunk_verdicts(pf, "pkg/model.py", LOOP, HANDED, Delta())
    assert (verdict.state, verdict.how) == ("upstream", "delegated")
    assert "capture_output=aux.append if i in self.layers_to_capture" in verdict.evidence
    assert "Model.forward" in verdict.evidence
    # The guard still a statement: the hunk's place is still there, it is needed.
    [kept] = hunk_verdicts(pf, "pkg/model.py", LOOP, LOOP.replace("+ residual", "* 2"), Delta())
    assert kept.state == "needed"


# An import hunk before FALLBACK's hunk (its lines one further down).
WITH_IMPORT = FALLBACK.replace(
    "@@ -3,5 +3,6 @@",
    "@@ -1,2 +1,3 @@\n"
    "+from pkg.dist import tensor_model_parallel_all_reduce\n"
    " def fuse(x, residual):\n"
    "     if residual is not None:\n"
    "@@ -3,5 +4,6 @@",
)


def test_a_hunk_of_imports_follows_the_other_hunks_of_its_file():
    upstream = _verdicts(WITH_IMPORT, OLD, BOTH_BRANCHES)
    assert [(v.state, v.how) for v in upstream] == [
        ("upstream", "imports"),
        ("upstream", "same-change"),
    ]
    needed = _verdicts(WITH_IMPORT, OLD, ONE_CONDITION)
    assert [v.state for v in needed] == ["needed", "needed"]


PROBE = (
    "absent `^(?!\\s*(?:from\\s|import\\s|#))(?=.*sm90)(?=.*sm100)(?!.*sm12)` in pkg/ "
    "where `fusion` (every SM90/SM100 gate of the fusion path admits SM120)"
)


def test_a_probe_trailer_parses_and_a_malformed_one_says_why():
    probe = parse_probe(PROBE)
    assert isinstance(probe, Probe)
    assert probe.paths == ("pkg/",) and probe.where == "fusion"
    assert probe.why == "every SM90/SM100 gate of the fusion path admits SM120"
    assert "not 'absent" in parse_probe("grep sm90 (gates)")
    assert "not a regular expression" in parse_probe("absent `(` in pkg/ (x)")
    raw = (
        b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        b"From: t <t@t.invalid>\nDate: Sun, 29 Nov 2026 00:00:00 +0000\nSubject: Gate\n\n"
        b"Why.\n\nPatchkit-Probe: " + PROBE.encode() + b"\n---\n"
        b"diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n"
        b"@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    )
    assert [p.why for p in patch_probes(parse_patch("gate.patch", raw))] == [probe.why]


def test_a_probe_quotes_each_line_that_breaks_it(tmp_path):
    from patchkit import gitops

    files = {
        "pkg/fusion.py": "# fusion\nok = sm90 or sm100 or sm120\n"
        "if not (is_sm90() or is_sm100()):\n",
        "pkg/other.py": "if not (is_sm90() or is_sm100()):  # no fused path here\n",
        "pkg/fused_gate.py": "from x import is_sm90, is_sm100\n# fusion: sm90 sm100\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    tree = subprocess.run(
        ["git", "-C", str(tmp_path), "write-tree"], check=True, capture_output=True, text=True
    ).stdout.strip()
    [result] = run_probes(gitops.Repo.checkout(tmp_path), tree, [parse_probe(PROBE)], "a tree")
    assert not result.passed
    assert result.failures == ["pkg/fusion.py:3: `if not (is_sm90() or is_sm100()):`"]
    assert result.words().startswith("probe fails on a tree: every SM90/SM100 gate")


ROWS_OLD = '''\
class Runner:
    def rows(self) -> int:
        """Rows the buffer needs."""
        per_req = self.tokens_per_req()
        return max(capture_sizes(self, per_req)) * per_req
'''

ROWS = '''\
--- a/pkg/runner.py
+++ b/pkg/runner.py
@@ -2,4 +2,8 @@ class Runner:
     def rows(self) -> int:
-        """Rows the buffer needs."""
-        per_req = self.tokens_per_req()
-        return max(capture_sizes(self, per_req)) * per_req
+        """Rows the buffer needs: the widest graph of any
+        candidate step (say (1, 3, 7))."""
+        best = 0
+        for steps in candidate_steps(self.config):
+            per_req = self.tokens_per_req(steps + 1)
+            best = max(best, max(capture_sizes(self, per_req)) * per_req)
+        return best
'''

ROWS_UPSTREAM = '''\
class Runner:
    def rows(self) -> int:
        """Rows the buffer needs."""
        best = 0
        for steps in candidate_steps(get_spec().config):
            per_req = self.tokens_per_req(num_draft_tokens=steps + 1)
            best = max(best, max(capture_sizes(self, per_req)) * per_req)
        return best
'''


def test_the_same_calls_in_a_loop_upstream_wrote_its_own_way_are_the_same_change():
    """Docstrings are not code (upstream rewords them); a loop's body is not a condition."""
    [pf] = PatchSet(ROWS)
    [verdict] = hunk_verdicts(pf, "pkg/runner.py", ROWS_OLD, ROWS_UPSTREAM, Delta())
    assert (verdict.state, verdict.how) == ("upstream", "same-change"), verdict.evidence
    assert "for steps in candidate_steps(get_spec().config)" in verdict.evidence
    [before] = hunk_verdicts(pf, "pkg/runner.py", ROWS_OLD, ROWS_OLD, Delta())
    assert before.state == "needed"


STEP_OLD = """\
class Worker:
    def step(self, batch, on_publish=None):
        batch.spec_info = verify_input
        batch_output = self.verify(batch, grammar_barrier=grammar_barrier)
        if on_publish is not None:
            on_publish(batch_output.new_seq_lens)
        return batch_output
"""

# the lengths of a step without drafts published before its forward (0.5.17's worker)
PUBLISH_EARLY = """\
--- a/pkg/worker.py
+++ b/pkg/worker.py
@@ -3,5 +3,13 @@ class Worker:
         batch.spec_info = verify_input
-        batch_output = self.verify(batch, grammar_barrier=grammar_barrier)
-        if on_publish is not None:
-            on_publish(batch_output.new_seq_lens)
+        if plain_decode:
+            new_seq_lens = batch.seq_lens + 1
+            if on_publish is not None:
+                on_publish(new_seq_lens)
+        batch_output = self.verify(
+            batch, grammar_barrier=grammar_barrier, plain_decode=plain_decode
+        )
+        if plain_decode:
+            batch_output.new_seq_lens = new_seq_lens
+        elif on_publish is not None:
+            on_publish(batch_output.new_seq_lens)
         return batch_output
"""

# upstream 0.5.21: the same calls, rewrapped, and none of the patch's own state
STEP_UPSTREAM = """\
class Worker:
    def step(self, batch, on_publish=None, pp_proxy_tensors=None):
        batch.spec_info = verify_input
        batch_output = self.verify(
            batch,
            pp_proxy_tensors=pp_proxy_tensors,
            grammar_barrier=grammar_barrier,
        )
        if on_publish is not None:
            on_publish(batch_output.new_seq_lens)
        return batch_output
"""


def test_the_same_calls_without_the_state_the_hunk_keeps_are_another_change():
    """Upstream makes the hunk's calls (`self.verify(`, `on_publish(...)`) but keeps none of
    what it assigns from them (`new_seq_lens = batch.seq_lens + 1`): not upstream.  An
    initial value (`best = 0` above) is no such state."""
    [pf] = PatchSet(PUBLISH_EARLY)
    [verdict] = hunk_verdicts(pf, "pkg/worker.py", STEP_OLD, STEP_UPSTREAM, Delta())
    assert verdict.state == "needed", verdict.evidence

"""bench/spec_threshold.py against stand-in servers on localhost: a stand-in answers SGLang's
``/generate`` (the contract the bench reads: ``meta_info.completion_tokens`` and
``spec_verify_ct``) after a fixed delay per request, so the expected throughput is known. The
real bench code runs: closed-loop levels, the warm-up outside the results, medians and the
ratio to max(baseline, X) for every ``X+threshold``."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import ROOT

spec = importlib.util.spec_from_file_location("bench_spec", ROOT / "bench" / "spec_threshold.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


class StandInServer:
    """``/generate`` taking ``delay_s`` per request; counts the requests it saw."""

    def __init__(self, delay_s: float, tokens_per_verify: float | None = None):
        self.delay_s, self.tokens_per_verify, self.requests = delay_s, tokens_per_verify, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                time.sleep(outer.delay_s)
                n = body["sampling_params"]["max_new_tokens"]
                meta = {"completion_tokens": n}
                if outer.tokens_per_verify:
                    meta["spec_verify_ct"] = round(n / outer.tokens_per_verify)
                data = json.dumps({"meta_info": meta}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = {
        "baseline": StandInServer(0.06),
        "eagle3": StandInServer(0.03, tokens_per_verify=2.5),  # faster than the baseline
        "eagle3+threshold": StandInServer(0.08, tokens_per_verify=2.5),
    }
    yield made
    for server in made.values():
        server.close()


def test_levels_medians_ratios_and_the_warm_up_outside_the_results(servers, tmp_path, capsys):
    results = tmp_path / "runs.json"
    argv = [f"--server={label}={s.url}" for label, s in servers.items()]
    argv += ["--concurrency", "2,4", "--runs", "2", "--requests-per-level", "4"]
    argv += ["--max-new-tokens", "10", "--results", str(results), "--vocab", "300"]
    argv += ["--markdown", str(tmp_path / "table.md")]
    assert bench.main(argv) == 0

    data = json.loads(results.read_text())
    assert set(data) == set(servers)
    for label in servers:
        assert sorted(data[label]) == ["2", "4"]
        assert all(len(runs) == 2 for runs in data[label].values())
        # the warm-up (one pass at the largest level, 2 x 4 requests) is not in the results
        measured = sum(run["requests"] for runs in data[label].values() for run in runs)
        assert measured == 2 * (4 + 8)
        assert len(servers[label].requests) == measured + 8
    # closed loop: C requests in flight, each taking delay_s, 10 tokens each: at most
    # C * 10 / delay_s (a loaded machine only adds time)
    ideal = 4 * 10 / 0.06
    assert 0.3 * ideal < data["baseline"]["4"][0]["output_tok_s"] <= 1.05 * ideal
    assert data["eagle3"]["2"][0]["tokens_per_verify"] == pytest.approx(2.5)
    assert data["baseline"]["2"][0]["tokens_per_verify"] is None

    table = bench.medians(data)
    ratio = bench.ratios(table)
    assert set(ratio) == {"eagle3+threshold"}
    for c in ("2", "4"):
        best = max(table["baseline"][c], table["eagle3"][c])
        assert best == table["eagle3"][c]  # the ratio is to the better of the two
        assert ratio["eagle3+threshold"][c] == pytest.approx(table["eagle3+threshold"][c] / best)
        assert ratio["eagle3+threshold"][c] < bench.GOAL  # slower than the baseline stand-in
    out = capsys.readouterr().out
    assert "eagle3+threshold / max(baseline, eagle3)" in out
    markdown = (tmp_path / "table.md").read_text()
    assert "| eagle3+threshold / max(baseline, eagle3) | **" in markdown
    # the spread of each level's runs under the medians: lowest-highest (runs)
    rows = markdown.split("lowest-highest (runs)", 1)[1].splitlines()
    for label in servers:
        (row,) = [line for line in rows if line.startswith(f"| {label} | ")]
        tok = [run["output_tok_s"] for run in data[label]["4"]]
        assert row.split(" | ")[2].rstrip(" |") == f"{min(tok):,.0f}-{max(tok):,.0f} (2)"  # C=4


def test_rounds_set_the_requests_of_a_level(tmp_path):
    server = StandInServer(0.0)
    try:
        argv = [f"--server=baseline={server.url}", "--concurrency", "3", "--runs", "1"]
        argv += ["--rounds", "4", "--max-new-tokens", "2", "--vocab", "300"]
        assert bench.main(argv + ["--results", str(tmp_path / "runs.json")]) == 0
    finally:
        server.close()
    runs = json.loads((tmp_path / "runs.json").read_text())["baseline"]["3"]
    assert [run["requests"] for run in runs] == [12]  # 4 rounds of 3, above --requests-per-level 8


def test_a_server_label_without_url_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--server", "baseline"])
    assert exit_info.value.code == 2
    assert "--server wants LABEL=URL" in capsys.readouterr().err


def test_without_the_plain_speculation_run_the_ratio_is_to_the_baseline():
    table = {"baseline": {"4": 100.0, "8": 200.0}, "eagle3+threshold": {"4": 120.0, "8": 190.0}}
    assert bench.ratios(table) == {
        "eagle3+threshold": {"4": pytest.approx(1.2), "8": pytest.approx(0.95)}
    }
    text = bench.render(
        {k: {c: [{"output_tok_s": v}] for c, v in row.items()} for k, row in table.items()}, [4, 8]
    )
    assert "eagle3+threshold / baseline (eagle3 not run)" in text, text

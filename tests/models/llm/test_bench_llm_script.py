"""scripts/bench_llm.py without timing anything: the targets' verdicts on fixed figures, the
shared prompt ids, and one in-process ggmlpy round on the tiny file (figures present, the KV
size it assumes equal to the cache's buffers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BPE = ROOT / "tests" / "data" / "tiny_llama_bpe.gguf"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_llm", ROOT / "scripts" / "bench_llm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(**kw):
    base = {"load_s": 0.5, "rss_load_mib": 300.0, "first_token_ms": 60.0, "pp128_tok_s": 900.0,
            "pp512_tok_s": 1000.0, "tg_tok_s": 60.0, "rss_gen_mib": 400.0, "kv_mib": 36.0}
    base.update(kw)
    return base


def test_targets(bench):
    ref = [_row(pp512_tok_s=1000.0, tg_tok_s=100.0, first_token_ms=40.0, load_s=0.2)] * 3
    good = [_row(pp512_tok_s=p, tg_tok_s=60.0) for p in (900.0, 1100.0, 1200.0)]
    s = bench.summarize(good, ref, file_mib=250.0)
    assert s["median"]["ratio_pp512"] == pytest.approx(1.1)
    assert s["median"]["ratio_tg"] == pytest.approx(0.6)
    assert s["median"]["ratio_first_token_time"] == pytest.approx(1.5)
    t = s["targets"]
    assert t["rss_during_generation_mib"]["limit"] == pytest.approx(250.0 + 36.0 + 300.0)
    assert all(v["pass"] for v in t.values()) and s["all_pass"]
    bad = [_row(pp512_tok_s=990.0, tg_tok_s=49.0, load_s=1.01, first_token_ms=81.0,
                rss_gen_mib=587.0)] * 3
    t = bench.summarize(bad, ref, file_mib=250.0)["targets"]
    assert [k for k, v in t.items() if v["pass"]] == []


def test_prompt_ids_shared_and_in_range(bench):
    a = bench.prompt_ids(128, 2, 262144)
    assert a == bench.prompt_ids(128, 2, 262144) and len(a) == 128 and a[0] == 2
    assert all(1000 <= i < 20000 for i in a[1:])
    small = bench.prompt_ids(16, None, 320)
    assert len(small) == 16 and all(80 <= i < 320 for i in small)


def test_ggmlpy_round_in_process(bench):
    r = bench.worker("ggmlpy", str(BPE), threads=1, gen=3, device="CPU", ngl=0)
    for k in ("load_s", "first_token_ms", "pp128_tok_s", "pp512_tok_s", "tg_tok_s"):
        assert r[k] > 0
    assert r["rss_gen_mib"] >= r["rss_load_mib"] * 0.5 > 0
    # tiny_llama_bpe: 2 layers, 2 KV heads of 16, 1024 cells, K and V in F32
    assert r["kv_mib"] == pytest.approx(2 * 1024 * 2 * (16 + 16) * 4 / 2**20)

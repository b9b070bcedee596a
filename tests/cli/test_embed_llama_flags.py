"""``python -m ggmlpy embed`` with llama-embedding's flags: -p/--embd-separator, -f, -c, -b/-ub,
--pooling, --embd-normalize (llama.cpp's common_embd_normalize), --embd-output-format
array|json|json+, -o, --list-devices, --version, -ts; and the messages of the embed CLI (empty
input, stdin not read, out of memory, a damaged GGUF, abbreviated flags). Values are checked
against the sentence-transformers fixture (minilm_public.json) or float64 NumPy formulas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.cli import main as cli_main
from ggmlpy.models.bert import layer_chunks
from ggmlpy.models.embd_output import embd_normalize

ROOT = Path(__file__).resolve().parents[2]
EMB_MAX_ABS = 1e-5  # as tests/models/test_model_bert.py


@pytest.fixture(scope="module")
def public(fixtures_dir: Path) -> dict:
    with open(fixtures_dir / "minilm_public.json", encoding="utf-8") as f:
        d = json.load(f)
    d["ref"] = np.asarray(d["embeddings"], np.float64)
    return d


def _run(capsys, argv):
    rc = cli_main(["embed", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------------------------
# --embd-normalize as llama.cpp's common_embd_normalize

def test_embd_normalize_matches_llama_cpp_rules():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    x[3] = 0.0
    v = x.astype(np.float64)
    np.testing.assert_array_equal(embd_normalize(x, -1), x)
    maxabs = np.abs(v[:3]).max(1, keepdims=True)
    np.testing.assert_allclose(embd_normalize(x, 0)[:3], v[:3] * 32760.0 / maxabs, rtol=1e-6)
    assert np.abs(embd_normalize(x, 0)[:3]).max(1) == pytest.approx([32760.0] * 3)
    for p in (1, 2, 3, 5):
        want = v[:3] / (np.abs(v[:3]) ** p).sum(1, keepdims=True) ** (1 / p)
        np.testing.assert_allclose(embd_normalize(x, p)[:3], want, rtol=1e-6)
    for p in (0, 1, 2, 3):
        np.testing.assert_array_equal(embd_normalize(x, p)[3], 0.0)  # zero row stays 0
    with pytest.raises(ValueError, match="norm must be an int >= -1"):
        embd_normalize(x, -2)


@pytest.mark.model
def test_embd_normalize_applies_to_the_pooled_vector(model_dir, public, capsys):
    s = public["sentences"][:2]
    rc, out, _ = _run(capsys, ["--json", "--embd-normalize", "-1", *s])
    raw = np.asarray(json.loads(out)["embeddings"], np.float64)
    assert rc == 0 and np.all(np.abs(np.linalg.norm(raw, axis=1) - 1) > 0.1)  # not normalised
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), public["ref"][:2],
                               rtol=0, atol=EMB_MAX_ABS)
    rc, out, _ = _run(capsys, ["--json", "--embd-normalize", "1", *s])
    taxi = np.asarray(json.loads(out)["embeddings"], np.float64)
    np.testing.assert_allclose(np.abs(taxi).sum(1), 1.0, atol=1e-6)
    ref = public["ref"][:2]
    np.testing.assert_allclose(taxi, ref / np.abs(ref).sum(1, keepdims=True), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# inputs and output formats

@pytest.mark.model
def test_prompt_separator_and_openai_json(model_dir, public, capsys):
    s = public["sentences"]
    rc, out, _ = _run(capsys, ["-p", f"{s[0]}|{s[1]}", "--embd-separator", "|",
                               "--embd-output-format", "json+"])
    assert rc == 0
    doc = json.loads(out)
    assert doc["object"] == "list" and [d["index"] for d in doc["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in doc["data"])
    got = np.asarray([d["embedding"] for d in doc["data"]])
    np.testing.assert_allclose(got, public["ref"][:2], rtol=0, atol=EMB_MAX_ABS)
    r = public["ref"][:2] / np.linalg.norm(public["ref"][:2], axis=1, keepdims=True)
    np.testing.assert_allclose(doc["cosineSimilarity"], r @ r.T, atol=2e-5)
    rc, out, _ = _run(capsys, ["-p", f"{s[0]}\n{s[1]}", "--embd-output-format", "array"])
    arr = np.asarray(json.loads(out))
    assert rc == 0 and arr.shape == (2, 384)
    np.testing.assert_allclose(arr, public["ref"][:2], rtol=0, atol=EMB_MAX_ABS)


@pytest.mark.model
def test_file_with_separator_and_ubatch(model_dir, public, capsys, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text(" ;; ".join(public["sentences"]) + " ;; ", encoding="utf-8")
    rc, out, _ = _run(capsys, ["-f", str(f), "--embd-separator", " ;; ", "-b", "3", "-ub", "40",
                               "--json"])
    doc = json.loads(out)
    assert rc == 0 and doc["input_source"] == [str(f)] * 8 and doc["input_index"] == list(range(8))
    np.testing.assert_allclose(doc["embeddings"], public["ref"], rtol=0, atol=EMB_MAX_ABS)
    assert doc["truncated"] == [n > 256 for n in public["untruncated_token_counts"]]
    assert doc["max_seq_length"] == 256 and doc["max_seq_length_source"] == "sentence_bert_config.json"


@pytest.mark.model
def test_ctx_size_cuts_and_says_so(model_dir, public, capsys):
    ids = public["token_ids"][0]  # 12 tokens
    rc, out, _ = _run(capsys, ["-c", "8", "--json", public["sentences"][0], "Hi"])
    doc = json.loads(out)
    assert rc == 0 and doc["n_tokens"] == [8, 3] and doc["truncated"] == [True, False]
    assert doc["max_seq_length"] == 8 and doc["max_seq_length_source"] == "max_seq_length argument"
    rc, out, _ = _run(capsys, ["-c", "8", public["sentences"][0]])
    assert rc == 0 and "tokens   8 (cut)" in out and "max_seq_length 8" in out
    assert len(ids) == 12
    rc, _, err = _run(capsys, ["--max-seq-length", "600", "x"])
    assert rc == 2 and "--max-seq-length/-c must be in 2..512, got 600" in err


@pytest.mark.model
def test_pooling_none_gives_token_rows(model_dir, public, capsys):
    s = public["sentences"][:2]
    rc, out, _ = _run(capsys, ["--pooling", "none", "--json", *s])
    doc = json.loads(out)
    n0, n1 = (len(t) for t in public["token_ids"][:2])
    assert rc == 0 and len(doc["embeddings"]) == n0 + n1
    assert doc["token_of"] == [[0, j] for j in range(n0)] + [[1, j] for j in range(n1)]
    rows = np.asarray(doc["embeddings"], np.float64)
    for k, (a, b) in enumerate(((0, n0), (n0, n0 + n1))):  # mean pooling + Normalize = ST's
        m = rows[a:b].mean(0)
        np.testing.assert_allclose(m / np.linalg.norm(m), public["ref"][k], rtol=0,
                                   atol=EMB_MAX_ABS)


# ---------------------------------------------------------------------------------------------
# -ts / --tensor-split

def test_layer_chunks_follow_llama_cpp_split():
    assert layer_chunks(6, 2) == [3, 3] and layer_chunks(4, 3) == [2, 1, 1]
    assert layer_chunks(6, 2, [1, 2]) == [2, 4]       # layer j -> first k with cum_k > j/6
    assert layer_chunks(6, 2, [3, 1]) == [5, 1]       # 0,1/6..4/6 < 0.75; 5/6 -> device 1
    assert layer_chunks(6, 3, [0, 1, 1]) == [0, 3, 3]
    with pytest.raises(ValueError):
        layer_chunks(6, 2, [1])


def test_tensor_split_places_layers_and_keeps_the_values(model_dir, public, sim_devices):
    from ggmlpy.models.bert import BertModel

    devs = sim_devices(2)
    with BertModel.load(model_dir, device=devs, n_gpu_layers=6, tensor_split=[1, 2]) as m:
        placed = [lw.w_up.buffer.buft.name for lw in m.layers]
        assert placed == [devs[0].name] * 2 + [devs[1].name] * 4
        np.testing.assert_allclose(m.encode(public["sentences"][:2]), public["ref"][:2], rtol=0,
                                   atol=EMB_MAX_ABS)


@pytest.mark.parametrize("argv, needle", [
    (["-ts", "1,2", "x"], "-ts/--tensor-split needs several --device names"),
    (["--device", "SIM0,SIM1", "-ts", "1,x", "x"], "expected numbers joined by commas"),
    (["--device", "SIM0,SIM1", "-ts", "1,2,3", "x"], "3 shares for 2 devices"),
    (["--embd-normalize", "-2", "x"], "--embd-normalize must be -1, 0, 1, 2 or a p-norm"),
    (["-ub", "0", "x"], "-ub/--ubatch-size must be >= 1"),
    (["--simil", "x"], "unrecognized arguments: --simil"),  # no abbreviations
    (["--embd-separator", "", "-p", "x"], "--embd-separator must not be empty"),
    (["-o", "/no/such/folder/out.json", "x"], "folder '/no/such/folder' does not exist"),
])
def test_flag_errors_are_one_line_exit_2(model_dir, capsys, argv, needle):
    rc, out, err = _run(capsys, argv)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


# ---------------------------------------------------------------------------------------------
# messages

def test_empty_input_file_is_named(model_dir, capsys, tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("")
    rc, _, err = _run(capsys, ["--input", str(f)])
    assert rc == 2 and err.strip() == f"ggmlpy embed: --input {f} holds no sentences (it is empty)"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGMLPY_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_stdin_without_input_dash_is_named():
    r = subprocess.run([sys.executable, "-m", "ggmlpy", "embed"], input="a sentence\n",
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == ("ggmlpy embed: no sentences: pass SENTENCE arguments, -p TEXT or "
                                "--input FILE; standard input is not read unless you pass "
                                "--input - (or -f -)")


@pytest.mark.model
def test_out_of_memory_names_device_bytes_and_flags(model_dir):
    env = {**_env(), "GGMLPY_SIM_MEMORY_MB": "8", "GGMLPY_SIM_DEVICES": "1"}
    r = subprocess.run([sys.executable, "-m", "ggmlpy", "embed", "--device", "SIM0", "-ngl", "6",
                        "x"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("ggmlpy embed: out of memory on SIM0: ") and "bytes requested" in line
    assert "8388608 bytes free" in line  # all of the 8 MiB device: nothing else was on it
    assert "-ngl/--n-gpu-layers, now 6" in line and "--batch-size, now 32" in line


@pytest.mark.model
def test_damaged_gguf_is_one_line_naming_the_file(model_dir, tmp_path, capsys):
    pytest.importorskip("gguf")
    from ggmlpy.models.gguf_bert import convert

    good = Path(convert(model_dir, tmp_path / "m.gguf", "q8_0")["path"])
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # truncated download
    rc, out, err = _run(capsys, ["--model", str(bad), "x"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"ggmlpy embed: {bad}"), err


def test_version_and_list_devices(capsys):
    from importlib.metadata import version

    for argv in (["--version"], ["embed", "--version"]):
        assert cli_main(argv) == 0
        assert capsys.readouterr().out == f"ggmlpy {version('ggmlpy')}\n"
    assert cli_main(["embed", "--list-devices"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("name") and "\nCPU " in out

"""The README's and docs/' Python examples run as written and print what they claim; every
relative link in them points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _run_blocks(path: Path) -> dict:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    ns: dict = {"print": lambda *a, **k: None}
    for code in blocks:
        exec(compile(code, str(path), "exec"), ns)
    return ns


def test_api_page_examples_run_and_give_the_softmax():
    ns = _run_blocks(ROOT / "docs" / "api.md")
    import ggmlpy as gp

    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(np.float64)
    c = np.ones((2, 4)) @ a.T * 0.5
    e = np.exp(c - c.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    # float32 softmax of values up to ~33 against float64: 1e-6 relative
    np.testing.assert_allclose(gp.backend_tensor_get(ns["d"])[0, 0], ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gp.backend_tensor_get(ns["d2"])[0, 0], ref, rtol=1e-6, atol=1e-7)
    # the scheduler example really runs on the device, with b copied over from the CPU
    splits = ns["report"]["splits"]
    assert splits[0]["backend"] == "SIM0"
    assert [i["name"] for i in splits[0]["inputs"]] == ["b"]


def test_readme_embedding_and_generation_examples(model_dir, fixtures_dir, monkeypatch):
    import json

    from ggmlpy.core import env

    # the generation example on the tiny BPE file instead of Gemma 3 (not in the repository)
    monkeypatch.setenv(env.GEMMA3_GGUF, str(ROOT / "tests" / "data" / "tiny_llama_bpe.gguf"))
    ns = _run_blocks(ROOT / "README.md")
    fx = json.loads((fixtures_dir / "minilm_public.json").read_text())
    # the example's two sentences are the fixture's first two: sentence-transformers' vectors
    assert fx["sentences"][:2] == ["The quick brown fox jumps over the lazy dog.", "Hi"]
    ref = np.asarray(fx["embeddings"][:2], np.float32)
    assert ns["emb"].shape == (2, 384) and ns["emb"].dtype == np.float32
    # an exact float32 implementation is within ~5e-7 of the fixture (fixture README)
    np.testing.assert_allclose(ns["emb"], ref, rtol=0, atol=1e-6)
    # greedy text = llama.cpp's 16 greedy tokens on that file (tests/data/tiny_llama_bpe_logits.npz)
    ids = np.load(ROOT / "tests" / "data" / "tiny_llama_bpe_logits.npz")["fox/greedy_ids"]
    tok = ns["model"].tokenizer
    assert ns["text"] == b"".join(tok.token_to_bytes(int(i)) for i in ids).decode("utf-8", "replace")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_exist(page: Path):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


class _Parsed(Exception):
    """Raised instead of running a command once its arguments parsed."""


def _documented_commands() -> list[tuple[str, str]]:
    """(page, command line) of every ``python -m ggmlpy ...`` in the pages' sh blocks."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.splitlines():
                line = line.split("  #")[0]
                for part in line.split("&&"):
                    part = part.strip()
                    m = re.search(r"(?:^|\s)python -m ggmlpy (.*)$", part)
                    if m:
                        out.append((page.name, m.group(1)))
    return out


def test_documented_commands_parse(monkeypatch):
    """Every command the README and docs show is accepted by the CLI as written (its arguments
    parse; nothing runs): a renamed or removed flag fails here."""
    import shlex

    from ggmlpy import cli
    from ggmlpy.core.check import OneLineArgumentParser

    orig = OneLineArgumentParser.parse_args

    def parse_only(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        raise _Parsed

    monkeypatch.setattr(OneLineArgumentParser, "parse_args", parse_only)
    commands = _documented_commands()
    assert len(commands) >= 10
    for page, command in commands:
        with pytest.raises(_Parsed):
            status = cli.main(shlex.split(command))
            raise AssertionError(f"{page}: `python -m ggmlpy {command}` exited {status}")

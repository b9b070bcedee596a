"""Fixtures of the LLM tests: GGUF tokenizer metadata and llama.cpp's reference data.

The reference JSON files and ``tiny_llama_bpe.gguf`` are committed under ``tests/data/`` (made by
``scripts/make_llm_reference.py``). The Gemma 3 270M file is large and not committed: the tests
that need it use the ``gemma_gguf`` fixture (``find_default_gemma3``: ``$GGMLPY_GEMMA3_GGUF``, else the
file ``python -m ggmlpy download gemma3-270m`` wrote), which marks them ``model``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ggmlpy.gguf.reader import GGUFReader
from ggmlpy.gguf.strings import StringArray

DATA = Path(__file__).resolve().parents[2] / "data"


def read_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The ``tokenizer.*`` and ``general.*`` metadata of a GGUF file, read with
    :class:`ggmlpy.gguf.reader.GGUFReader`: string arrays as lists of str, numeric arrays as NumPy
    arrays, scalars as Python values (the form ``Tokenizer.from_gguf_metadata`` documents)."""
    reader = GGUFReader(path)
    meta: dict[str, Any] = {}
    for key, value in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")):
            meta[key] = value.tolist() if isinstance(value, StringArray) else value
    return meta


def _load_json(name: str) -> dict[str, Any]:
    path = DATA / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: llama.cpp reference data missing (scripts/make_llm_reference.py "
                                f"writes it)")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def bpe_ref() -> dict[str, Any]:
    """llama.cpp's ids / detokenizations for the strings of ``llm_ref_strings`` on the BPE file."""
    return _load_json("bpe_tokenizer.json")


@pytest.fixture(scope="session")
def gemma_ref() -> dict[str, Any]:
    """llama.cpp's ids / detokenizations for the same strings on Gemma 3 270M."""
    return _load_json("gemma3_tokenizer.json")


@pytest.fixture(scope="session")
def bpe_meta() -> dict[str, Any]:
    """Tokenizer metadata of ``tests/data/tiny_llama_bpe.gguf`` (gpt2 model, pre ``gpt-2``)."""
    path = DATA / "tiny_llama_bpe.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the committed tiny BPE GGUF is missing")
    return read_tokenizer_metadata(path)


@pytest.fixture(scope="session")
def gemma_meta(gemma_gguf: Path) -> dict[str, Any]:
    """Tokenizer metadata of the Gemma 3 270M GGUF (the ``gemma_gguf`` fixture: skips when there
    is none; its users are marked ``model``)."""
    return read_tokenizer_metadata(gemma_gguf)

"""One-line usage errors found by a new-user pass: each names the argument and the violated
condition (convert's bad --type, a file given as a model directory, a bad Scheduler
alloc_policy, a CPU thread count beyond ggml's 512)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ggmlpy as gp


@pytest.mark.parametrize("argv, expect", [
    (["all-MiniLM-L6-v2", "--type", "q5_0", "-o", "x.gguf"], "argument --type: invalid choice"),
    (["all-MiniLM-L6-v2", "--type", "Q8_0", "-o", "x.gguf"], "argument --type: invalid choice"),
    (["all-MiniLM-L6-v2"], "-o/--output"),
])
def test_convert_usage_error_is_one_line(argv: list[str], expect: str, capsys) -> None:
    from ggmlpy.models.convert_cli import convert_main

    assert convert_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ggmlpy convert: ") and expect in err


def test_file_is_not_a_model_directory(tmp_path: Path) -> None:
    from ggmlpy.models.loader import ModelNotFoundError, check_model_dir

    f = tmp_path / "sentences.txt"
    f.write_text("hello\n", encoding="utf-8")
    with pytest.raises(ModelNotFoundError, match="is a file, not a model directory"):
        check_model_dir(f)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        check_model_dir(tmp_path / "missing")


@pytest.mark.parametrize("bad", ["nope", "GGML", ""])
def test_scheduler_names_alloc_policy(bad: str) -> None:
    from ggmlpy.sched.scheduler import Scheduler

    cpu = gp.backend_cpu_init()
    try:
        with pytest.raises(ValueError, match=r"Scheduler: alloc_policy must be one of"):
            Scheduler([cpu], alloc_policy=bad)
    finally:
        cpu.free()

"""The GPU-only scripts refuse bad batch lists before touching a GPU (argparse, exit 2)."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("module, args", [
    ("benchmark.gpu.gpu_check", ["--batches", "1,x"]),
    ("benchmark.gpu.gpu_check", ["--ttfa-lookahead", "-5"]),
    ("benchmark.gpu.fp8_check", ["--batches", "0"]),
    ("benchmark.gpu.decode_attention", ["--batch", "256,0"]),
    ("benchmark.gpu.decode_attention", ["--kernel", "cuda-cores,tpu"]),
])
def test_bad_lists_are_refused_with_a_message(module, args, capsys) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "expected" in err and args[0] in err

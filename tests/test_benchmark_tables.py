"""benchmarks/codec_table.py: shares of the full table and seed-noise verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package

from benchmarks.codec_table import codec_rows  # noqa: E402


def _results(lora: list[float]) -> pd.DataFrame:
    rows = []
    for codec, values in (("full", [0.50, 0.52, 0.54]), ("lora", lora)):
        for seed, hr in enumerate(values):
            rows.append({"dataset": "d", "protocol": "strict", "method": "fedmf", "mode": "none",
                         "codec": codec, "seed": seed, "hr10_sampled": hr, "hr10_full": hr / 5,
                         "bytes_up_last": 27_168 if codec == "lora" else 107_648,
                         "bytes_up": 30_000 if codec == "lora" else 107_648})
    return pd.DataFrame(rows)


def test_codec_table_shares_and_verdicts():
    far = codec_rows(_results([0.60, 0.62, 0.64]))
    lora = next(line for line in far if "| lora |" in line)
    assert "| 3 | 0.6200 ± 0.0200 |" in lora and "| 27.2; 30.0 |" in lora
    assert "| 119% |" in lora and "+0.1000" in lora and "beyond" in lora
    near = next(line for line in codec_rows(_results([0.51, 0.53, 0.55])) if "| lora |" in line)
    assert "+0.0100" in near and "within" in near


def test_codec_table_refuses_private_runs():
    frame = _results([0.6, 0.6, 0.6])
    frame.loc[0, "mode"] = "ldp-laplace"
    with pytest.raises(SystemExit, match="private runs"):
        codec_rows(frame)

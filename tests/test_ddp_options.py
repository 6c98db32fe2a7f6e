"""ddp-skellam's options under another privacy mode are refused in one line, exit 2."""

from __future__ import annotations

import pytest

from fedem_private.cli import main
from fedem_private.errors import UserError
from fedem_private.privacy.config import PrivacyConfig

FLAGS = [("--ddp-bits", "16"), ("--ddp-scale", "3"), ("--ddp-tolerance", "0.2"),
         ("--dropout", "0.1")]


@pytest.mark.parametrize(("flag", "value"), FLAGS)
@pytest.mark.parametrize("mode", ["cdp-gaussian", "none"])
def test_a_ddp_flag_under_another_mode_is_one_line_exit_2(
        flag: str, value: str, mode: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    budget = ["--epsilon", "4"] if mode == "cdp-gaussian" else []
    # --ddp-bits 16 is the default value: the command line refuses it all the same
    code = main(["run", "--privacy", mode, *budget, flag, value, "--rounds", "1",
                 "--dry-run", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert flag in err and "ddp-skellam" in err and repr(mode) in err


def test_the_config_refuses_a_ddp_setting_under_another_mode() -> None:
    with pytest.raises(UserError, match="--dropout .* is for --privacy ddp-skellam"):
        PrivacyConfig(mode="cdp-gaussian", epsilon=4.0, dropout=0.1)
    # and accepts it under ddp-skellam
    assert PrivacyConfig(mode="ddp-skellam", epsilon=4.0, dropout=0.1).dropout == 0.1


def test_the_summary_line_shows_bits_bytes_and_released_rounds() -> None:
    from fedem_private.cli import privacy_text

    ddp = {"bits": 14, "dropout": 0.1, "rounds_released": 9, "rounds_aborted": [{"round": 3}],
           "bytes_per_client": {"masked_input": 14336, "upload_keys_bytes": 64.0,
                                "upload_shares_bytes": 1242.0,
                                "upload_masked_input_bytes": 13619.2,
                                "upload_unmask_bytes": 359.0, "download_bytes": 2394.0}}
    line = privacy_text({"mode": "ddp-skellam", "delta": 1e-5,
                         "epsilon": {"reported": 3.5}, "ddp_skellam": ddp})
    assert "\n" not in line and "eps spent (worst client) 3.5" in line
    assert "14 bits an entry, 14.0 KiB masked input" in line
    assert f"{(64 + 1242 + 13619.2 + 359) / 1024:.1f} KiB uploaded" in line
    assert "dropout 0.1: 9 rounds released, 1 aborted" in line

"""An unknown flag gets a "did you mean", in the koordlet, koord-manager and koord-scheduler."""

from __future__ import annotations

import pytest

from kubeclient.flags import SuggestingParser, closest, duration_flag, go_bool_flag, suggestion
from manager import cli as manager_cli
from scheduler_plugins import cli as scheduler_cli


def test_the_closest_option_is_suggested_for_a_typo() -> None:
    known = ["--addr", "--state-dir", "--sync-period", "--help"]
    assert closest("--adr", known) == "--addr"
    assert closest("--adr=:9316", known) == "--addr"
    assert closest("--sync-perod", known) == "--sync-period"
    assert closest("--zzzzzz", known) is None
    assert closest("value", known) is None  # not an option


def test_the_message_names_each_close_option_once() -> None:
    p = SuggestingParser(prog="x")
    p.add_argument("--addr")
    p.add_argument("--state-dir")
    msg = suggestion(p, "unrecognized arguments: --adr x --stat-dir y --adr z")
    assert msg.endswith("(did you mean --addr or --state-dir?)")
    assert suggestion(p, "argument --addr: expected one argument") == (
        "argument --addr: expected one argument"
    )


def test_koord_manager_suggests_a_subcommands_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        manager_cli.main(["run", "--sync-perod", "3"])
    assert done.value.code == 2
    assert "(did you mean --sync-period?)" in capsys.readouterr().err


def test_koord_scheduler_suggests_a_subcommands_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        scheduler_cli.main(["extender", "--adr", "127.0.0.1:1"])
    assert done.value.code == 2
    assert "(did you mean --addr?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--elect", "True"], True),
        (["--elect", "0"], False),
        (["--elect"], True),  # nargs="?" with const, as the binaries declare --leader-elect
    ],
)
def test_go_bool_flag_reads_go_spellings(argv: list[str], expected: bool) -> None:
    parser = SuggestingParser(prog="x")
    parser.add_argument("--elect", type=go_bool_flag, nargs="?", const=True)
    assert parser.parse_args(argv).elect is expected


def test_go_bool_and_duration_flags_refuse_with_a_usage_error_naming_the_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = SuggestingParser(prog="x")
    parser.add_argument("--elect", type=go_bool_flag)
    parser.add_argument("--lease", type=duration_flag)
    assert parser.parse_args(["--lease", "1m30s"]).lease == 90.0
    for argv, bad in ((["--elect", "yes"], "'yes'"), (["--lease", "15"], "'15'")):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert argv[0] in err
        assert bad in err

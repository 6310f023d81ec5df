"""Command-line parsing the binaries share: an unknown flag gets a "did you mean".

:class:`SuggestingParser` is an ``argparse.ArgumentParser`` whose usage errors for unrecognized
arguments name the closest known option of the parser that failed (``unrecognized arguments:
--adr=:9316 (did you mean --addr?)``), as Python 3.14's ``suggest_on_error`` does for choices.
Subcommand parsers made with ``add_subparsers`` are of the same class, so each suggests among its
own options. The koordlet, koord-manager, koord-scheduler and koord-runtime-proxy use it (their
exit code for a usage error stays 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from typing import NoReturn

from apis.duration import parse_duration
from apis.gobool import parse_go_bool

UNRECOGNIZED = "unrecognized arguments: "
"""How argparse starts the message for arguments no option takes."""


def go_bool_flag(text: str) -> bool:
    """An argparse ``type`` for a boolean flag read as Go's ``strconv.ParseBool``
    (:func:`apis.gobool.parse_go_bool`); another spelling is a usage error naming it."""
    try:
        return parse_go_bool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def duration_flag(text: str) -> float:
    """An argparse ``type`` for a Go duration flag (``15s``, ``1m30s``), in seconds
    (:func:`apis.duration.parse_duration`); a bad one is a usage error naming it."""
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known option closest to ``word`` (``--adr=:1`` → ``--addr``), None when none is close
    enough (difflib's ratio ≥ 0.6)."""
    name = word.split("=", 1)[0]
    if not name.startswith("-"):
        return None
    import difflib  # only for a misspelt option: not worth its import on every start

    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return match[0] if match else None


def options(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every option string of ``parser`` and of its subcommands' parsers (argparse reports a
    subcommand's unknown flags from the top-level parser)."""
    for action in parser._actions:
        yield from action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from options(sub)


def suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """``message`` with " (did you mean X?)" for each unknown option that has a close match."""
    if not message.startswith(UNRECOGNIZED):
        return message
    known = sorted(set(options(parser)))
    hints = []
    for word in message[len(UNRECOGNIZED) :].split():
        match = closest(word, known)
        if match is not None and match not in hints:
            hints.append(match)
    if not hints:
        return message
    return f"{message} (did you mean {' or '.join(hints)}?)"


class SuggestingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose "unrecognized arguments" error suggests the closest flag."""

    def error(self, message: str) -> NoReturn:
        super().error(suggestion(self, message))

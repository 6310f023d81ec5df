"""The ``koordlet`` command: parse the configuration, set up logging, run the daemon on uvloop.

``koordlet [FLAGS]`` runs the daemon; ``koordlet COMMAND ...`` runs one of :data:`COMMANDS`
instead (``host-app``, ``status``), and ``koordlet --help`` lists them after the flags.

Exit codes: 0 after a clean stop (Ctrl-C included); 2 for a bad flag, config file or NodeSLO
file, and for a start-up failure the configuration causes (``--addr`` in use, no
``--cgroup-root-dir``, no kubeconfig outside a cluster): one line ``koordlet: <flag or file>:
<what>`` on stderr, the traceback only with ``-v``/``--log-level debug``; otherwise what
``koordlet.daemon.run`` returns. uvloop is installed here and nowhere else, and so is the one
process-wide allocator setting (glibc's arena limit, ``koordlet.system.malloc``).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping, Sequence

import uvloop

from apis.records import frozen
from koordlet.config import KoordletConfig, load_config, load_node_slo
from koordlet.errors import ConfigError
from koordlet.system.malloc import limit_malloc_arenas

logger = logging.getLogger(__name__)

EXIT_CONFIG = 2
"""Exit code for configuration errors (as argparse uses for usage errors)."""

MALLOC_ARENAS = 1
"""glibc arenas for the daemon's threads (``koordlet.system.malloc``): they allocate in turns."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""One line per record; newlines inside a message or traceback are written as ``\\n``."""


@frozen
class Command:
    """A subcommand: a module whose ``main(argv) -> int`` takes the words after its name."""

    module: str
    """The module, imported only when the command runs."""
    help: str
    """Its line in ``koordlet --help``."""


COMMANDS: Mapping[str, Command] = {
    "host-app": Command(
        "koordlet.hostapp",
        "start a host application in its reserved cgroup (run), or list the declared ones",
    ),
    "status": Command(
        "koordlet.status",
        "summarize the running koordlet: mode, usage, BE allowance, strategies, capabilities",
    ),
    "reset": Command(
        "koordlet.reset",
        "put back what this koordlet wrote (BE quota and cpuset, QoS knobs, sysctls); "
        "--dry-run shows it",
    ),
}
"""Every subcommand, by the name it is called with."""


class _OneLineFormatter(logging.Formatter):
    """Keeps a record, traceback included, on one line so that log collectors see one event."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\\n")


def _install_logging(level: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


def _load(argv: Sequence[str]) -> KoordletConfig:
    """The configuration, with the NodeSLO file checked before anything starts."""
    cfg = load_config(argv, commands={name: c.help for name, c in COMMANDS.items()})
    if cfg.nodeslo_file is not None:
        load_node_slo(cfg.nodeslo_file)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """Run the koordlet with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    ``koordlet COMMAND ...`` runs that command of :data:`COMMANDS` instead.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 0 and args[0] in COMMANDS:
        command = importlib.import_module(COMMANDS[args[0]].module)
        return command.main(args[1:])  # type: ignore[no-any-return]
    try:
        cfg = _load(args)
    except ConfigError as err:
        print(f"koordlet: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0

    root_level = logging.getLogger().level
    handler = _install_logging(cfg.log_level)
    try:
        # Before any thread starts: an arena once given to a thread stays its own.
        limit_malloc_arenas(MALLOC_ARENAS)
        # Imported only when running: the daemon knows every component, the CLI needs none.
        daemon = importlib.import_module("koordlet.daemon")

        logger.info(
            "koordlet starting: node %s, %s, config %s",
            cfg.node_name,
            "standalone" if cfg.standalone else "with the API server",
            cfg.config_file or "flags only",
        )
        try:
            code: int = uvloop.run(daemon.run(cfg, own_process=True))
        except KeyboardInterrupt:
            logger.info("interrupted; stopped")
            return 0
        except ConfigError as err:  # raised by a start stage, after what started was stopped
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("start-up failed", exc_info=True)
            print(f"koordlet: {err}", file=sys.stderr)
            return EXIT_CONFIG
        return code
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(root_level)


if __name__ == "__main__":
    sys.exit(main())

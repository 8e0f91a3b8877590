"""What every ``gradwire`` command shares: one-line errors and checked argument types.

A bad invocation gets one line on stderr, ``gradwire <command>: error: <what
was wrong and what is valid>``, and exit code 2 (argparse's convention), never
a traceback and never minutes of work before the refusal. The types below run
while argparse parses, so a bad number or an unwritable output path is refused
before anything starts.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from gradwire._files import OutputPathError, check_output_dir, check_output_file

if TYPE_CHECKING:
    from gradwire.net import NetSpec

__all__ = ["MAX_SIZE", "Parser", "byte_size", "check_command", "check_net_fits", "command_after_dashes", "default_nets", "fail", "one_line", "input_file", "net_spec", "output_dir", "output_file", "positive_int", "seconds"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: no usage block above them.

    ``add_subparsers`` creates sub-parsers of the parser's own class, so every
    command inherits this.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def _typed(name: str, check: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type`` that reports ``check``'s ValueError text as the error."""

    def convert(text: str) -> object:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


output_file = _typed("output_file", check_output_file)
"""``type=``: a file to write later (see :func:`gradwire._files.check_output_file`)."""

output_dir = _typed("output_dir", check_output_dir)
"""``type=``: a folder to write into later (see :func:`gradwire._files.check_output_dir`)."""


def _input_file(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise ValueError(f"{text!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{text!r} is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{text!r} is not readable")
    return path


input_file = _typed("input_file", _input_file)
"""``type=``: an existing, readable file."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number of seconds > 0, got {text!r}") from None
    if not 0 < value < math.inf:
        raise ValueError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


seconds = _typed("seconds", _seconds)
"""``type=``: a timeout, a finite number of seconds > 0."""


def positive_int(minimum: int, maximum: int | None = None) -> Callable[[str], object]:
    """``type=``: an integer in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    valid = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer {valid}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"must be an integer {valid}, got {value}")
        return value

    return _typed("int", check)


#: the largest buffer any command takes (1 PiB)
MAX_SIZE = 1 << 50


def _byte_size(text: str) -> int:
    from gradwire.net.units import parse_buffer_size  # nccl-tests' 64K / 16M, or 16MiB, 1GB

    size = parse_buffer_size(text)
    if not 1 <= size <= MAX_SIZE:
        raise ValueError(f"a buffer size must be from 1 byte to 1 PiB, got {text!r}")
    return size


byte_size = _typed("size", _byte_size)
"""``type=``: a buffer size, ``4096``, ``64K`` / ``16M`` (nccl-tests: powers of 1024), ``16MiB``, ``1GB``."""


def check_command(program: str) -> None:
    """Raise ValueError unless ``program`` can be started (a path to an executable, or a name on PATH)."""
    if os.sep in program:
        path = Path(program)
        if not path.exists():
            raise ValueError(f"cannot run {program!r}: no such file")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise ValueError(f"cannot run {program!r}: not an executable file")
    elif shutil.which(program) is None:
        raise ValueError(f"cannot run {program!r}: no such command on PATH")


def command_after_dashes(remainder: list[str], usage: str, required: bool = True,
                         scripts: bool = False) -> list[str]:
    """The command a ``gradwire`` command runs: what follows ``--`` (``argparse.REMAINDER``), checked.

    One rule for compare, profile and emulate: the command goes after ``--``
    (anything else left over is an unknown option), it can be started, and
    ``required=False`` allows none (``--plan``, compare's bundled models).
    ``scripts=True``: a ``.py`` file may stand first, as after torchrun (it
    runs under Python).
    """
    if remainder and remainder[0] != "--":
        raise ValueError(f"unrecognized arguments: {' '.join(remainder)} (the command goes after --: `{usage}`)")
    cmd = list(remainder[1:])
    if not cmd:
        if required or remainder:
            raise ValueError(f"no command after --: use `{usage}`")
        return cmd
    if scripts and cmd[0].endswith(".py"):
        if not Path(cmd[0]).is_file():
            raise ValueError(f"cannot run {cmd[0]!r}: no such file")
        return cmd
    check_command(cmd[0])
    return cmd


def net_spec(text: str) -> NetSpec:
    """``type=`` of every ``--net`` (and ``net describe SPEC``): the spec the user gave, parsed once, here.

    The commands pass the :class:`~gradwire.net.spec.NetSpec` on; its text
    form goes only to a process boundary (``$GRADWIRE_NET`` of a child).
    A bad spec is refused while argparse parses, in one line.
    """
    from gradwire.net import parse_spec

    try:
        return parse_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_nets(given: "list[NetSpec] | None", default: "Sequence[str]") -> "list[NetSpec]":
    """A repeatable ``--net``'s specs, or the command's ``default`` (spec strings) parsed as ``--net`` would be."""
    return list(given) if given else [net_spec(text) for text in default]


def check_net_fits(spec: NetSpec, world: int) -> None:
    """Refuse a network that cannot hold ``world`` ranks: a topology of another size, a straggler past the last rank,
    a recorded device (``device=profile:DIR``) recorded at another world size.

    The network model's own check, run before any rank starts (a spec whose
    topology is resolved later, ``topology=auto``, is left to the backend).
    """
    from gradwire.device import parse_device
    from gradwire.net import NetworkModel

    if not isinstance(spec.topology, str):
        NetworkModel(spec, world)  # ValueError naming what the world size must be
    if spec.device is not None:
        device = parse_device(spec.device)
        if device.kind == "recorded":  # a recording of another world size: refused before any rank starts
            device.recording.check_world(world)


#: longest message :func:`fail` prints; an echoed 100,000-character input is cut
MAX_MESSAGE = 500


def one_line(message: object) -> str:
    """``message`` on one line, cut to :data:`MAX_MESSAGE` characters."""
    text = " ".join(str(message).split())
    if len(text) > MAX_MESSAGE:
        text = f"{text[:MAX_MESSAGE]}... ({len(text)} characters)"
    return text


def fail(command: str, message: object, code: int = 2) -> int:
    """Print ``gradwire <command>: error: <message>`` on one line; return ``code``."""
    print(f"gradwire {command}: error: {one_line(message)}", file=sys.stderr)
    return code

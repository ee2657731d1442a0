"""Shared by the stand-in programs in bin/: print what a recorded machine printed.

The scenario is the directory named by $RECORDED_MACHINE. A recording is a file there (the stdout),
with optional ``<file>.stderr`` and ``<file>.exit`` (the exit status, 0 without one). A scenario that
differs from another in a few outputs holds just those and names the other in its ``based-on``
file. A command line with no recording fails loudly (exit 2) instead of printing something made up.

A scenario captured on a real machine (``h200-1gpu``) holds a ``commands`` file instead: each
capture with the exact command line it answers, replayed byte for byte; any other command line fails.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIO_VAR = "RECORDED_MACHINE"
BASED_ON = "based-on"
CAPTURED = "commands"  # in a captured scenario: `<file>: <command line>` per capture
# The nccl-tests sweep the all_reduce_perf recordings were made with.
ALL_REDUCE_SWEEP = ["-b", "8", "-e", "1G", "-f", "2", "-g", "1"]


def scenarios() -> list[str]:
    return sorted(d.name for d in HERE.iterdir() if d.is_dir() and d.name not in ("bin", "__pycache__"))


def fail(program: str, message: str) -> None:
    print(f"{program} (stand-in, tests/recorded_machines): {message}", file=sys.stderr)
    sys.exit(2)


def scenario_dir(program: str) -> Path:
    scenario = os.environ.get(SCENARIO_VAR)
    if not scenario or not (HERE / scenario).is_dir():
        fail(program, f"set {SCENARIO_VAR} to one of {', '.join(scenarios())} (it is {scenario!r})")
    return HERE / scenario


def captured_commands(directory: Path) -> dict[str, str] | None:
    """A captured scenario's command lines and the files that answer them; None for the others."""
    listing = directory / CAPTURED
    if not listing.is_file():
        return None
    pairs = (line.split(": ", 1) for line in listing.read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {command: name for name, command in pairs}


def recording(program: str, name: str) -> Path:
    directory = scenario_dir(program)
    scenario = directory.name
    while not (directory / name).is_file():
        base = directory / BASED_ON
        if not base.is_file():
            fail(program, f"scenario {scenario} has no recording {name}")
        directory = HERE / base.read_text().strip()
    return directory / name


def replay(program: str, name: str, stdout: str | None = None) -> None:
    """Prints the recording ``name`` (or ``stdout``, a selection from it), its stderr, and exits
    with its status."""
    path = recording(program, name)
    sys.stdout.write(path.read_text() if stdout is None else stdout)
    stderr = path.with_name(path.name + ".stderr")
    if stderr.is_file():
        sys.stderr.write(stderr.read_text())
    status = path.with_name(path.name + ".exit")
    sys.stdout.flush()
    sys.exit(int(status.read_text()) if status.is_file() else 0)


def nvidia_smi_csv(name: str, fields: list[str], fmt: list[str]) -> str:
    """The columns ``fields`` of a recorded ``--format=csv`` table, as nvidia-smi prints them."""
    if "csv" not in fmt:
        fail("nvidia-smi", f"only --format=csv is recorded, not {','.join(fmt)}")
    header, *rows = recording("nvidia-smi", name).read_text().splitlines()
    columns = [c.strip() for c in header.split(",")]
    for field in fields:
        if field not in columns:
            fail("nvidia-smi", f'field "{field}" is not in {name} (nvidia-smi itself answers an unknown '
                               f'field with: Field "{field}" is not a valid field to query.)')
    picked = [[row.split(", ")[columns.index(f)] for f in fields] for row in rows]
    lines = ([] if "noheader" in fmt else [", ".join(fields)]) + [", ".join(r) for r in picked]
    return "".join(line + "\n" for line in lines)


def main(program: str, args: list[str]) -> None:
    directory = scenario_dir(program)
    captured = captured_commands(directory)
    if captured is not None:
        line = " ".join([program, *args])
        if line in captured:
            replay(program, captured[line])
        fail(program, f"no capture of: {line} ({directory.name} answers only the command lines in its "
                      f"{CAPTURED} file)")
    if program == "nvidia-smi":
        if args == ["-L"]:
            replay(program, "nvidia-smi-L.txt")
        queries = [a for a in args if a.startswith("--query-")]
        formats = [a for a in args if a.startswith("--format=")]
        if len(args) == 2 and len(queries) == 1 and len(formats) == 1:
            kind, fields = queries[0].removeprefix("--query-").split("=", 1)
            name = f"nvidia-smi-query-{kind}.csv"
            replay(program, name, nvidia_smi_csv(name, fields.split(","),
                                                 formats[0].removeprefix("--format=").split(",")))
    elif program == "fi_info" and args == ["-p", "efa", "-t", "FI_EP_RDM"]:
        replay(program, "fi_info-p-efa-t-FI_EP_RDM.txt")
    elif program == "dcgmi" and args in (["diag", "-r", "1"], ["diag", "--run", "1"]):
        replay(program, "dcgmi-diag-r1.txt")
    elif program == "dmesg" and not args:
        replay(program, "dmesg.txt")
    elif program == "all_reduce_perf" and args == ALL_REDUCE_SWEEP:
        replay(program, "all_reduce_perf.txt")
    fail(program, f"no recording of: {program} {' '.join(args)}")

"""The deployment's settings file: where a deployment's choices live between commands.

`settings.json` at the repository root (another with `-c settings_file=PATH`, which must exist)
holds the values the user chose, over the defaults in infra/config.py. Every `cdk synth/diff/deploy/destroy` of
any stack reads it, so a later command cannot fall back to defaults the user never chose (a
worker group shrinking to one node, an EFS created anew, FSx deleted under mounted nodes).
`-c key=value` still overrides a setting for one command, and says so on stderr.

    maskrcnn settings show [--json]            every setting, its value and where it came from
    maskrcnn settings set worker_count=3 instance_type=p4d.24xlarge
    maskrcnn settings unset ssh_cidr key_pair_name

`set` validates the whole resulting configuration before it writes anything, and writes the file
atomically. The file is ignored by git (each checkout is one deployment); a team that keeps its
deployment in its own repository can commit it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from infra.config import _PARSERS, SETTINGS, AppConfig, ConfigError, unknown_setting

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATH = REPO_ROOT / "settings.json"
# The context key that names another settings file (several deployments from one checkout);
# "none" reads no file: the defaults and -c flags only (the smoke test's separate deployment).
FILE_KEY = "settings_file"
NO_FILE = "none"

DEFAULT, FILE, COMMAND_LINE = "default", "settings file", "-c"


@dataclass(frozen=True)
class Resolved:
    config: AppConfig
    path: Path | None
    sources: dict[str, str]                 # setting -> DEFAULT, FILE or COMMAND_LINE
    # setting -> (value as given with -c, the value it replaces, where that one came from)
    overrides: dict[str, tuple[Any, Any, str]]

    def override_notes(self) -> list[str]:
        """One line per `-c` override, for stderr: what it replaces, and how to keep it."""
        return [f"note: -c {key}={value} overrides the {origin}'s {json.dumps(replaced)} for this "
                f"command only; keep it with `maskrcnn settings set {key}={value}`"
                for key, (value, replaced, origin) in self.overrides.items()]


def settings_path(context: Mapping[str, Any] | None = None) -> Path | None:
    raw = (context or {}).get(FILE_KEY)
    if raw == NO_FILE:
        return None
    return named_file(raw, f"-c {FILE_KEY}={raw}") if raw else DEFAULT_PATH


def named_file(raw: str | os.PathLike, flag: str) -> Path:
    """A settings file the user named with `flag`. It must exist: a mistyped name read as "no
    file yet" would mean all defaults, and a deploy would update another deployment's stacks (the
    unprefixed ones) or price another cluster. Only the default file may be absent."""
    path = Path(raw).expanduser().resolve()
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(
            f"settings file {path} (named by {flag}) {what}; check the path, or create the file "
            f"with `maskrcnn settings --file {path} set KEY=VALUE ...`; without {flag} the "
            f"commands read {DEFAULT_PATH.name} at the repository root (all defaults while it "
            f"does not exist)")
    return path


def read_file(path: Path | None) -> dict[str, Any]:
    """The settings stored in `path` ({} when there is no file yet, or no path)."""
    if path is None:
        return {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"settings file {path} is not valid JSON ({error}); fix or delete it "
                          "(`maskrcnn settings show` lists the settings)") from None
    if not isinstance(values, dict):
        raise ConfigError(f"settings file {path} must hold one JSON object of setting: value")
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"settings file {path} has an unknown setting {unknown[0]!r}; known "
                          f"settings: {', '.join(sorted(SETTINGS))}")
    return values


def resolve(context: Mapping[str, Any], path: Path | None = None) -> Resolved:
    """The configuration of one command: defaults, then the settings file, then `context` (the
    `-c` flags, as the CDK CLI passes them). Raises ConfigError on any bad value."""
    path = path if path is not None else settings_path(context)
    stored = read_file(path)
    given = {key: value for key, value in context.items() if key != FILE_KEY}
    config = AppConfig.from_context({**stored, **given})   # also refuses unknown settings
    own = {key: value for key, value in given.items() if key in SETTINGS}
    sources = {key: COMMAND_LINE if key in own else FILE if key in stored else DEFAULT
               for key in SETTINGS}
    overrides = {}
    for key, raw in own.items():
        value = _typed(key, raw)
        before = _typed(key, stored[key]) if key in stored else SETTINGS[key].default
        if value != before:
            overrides[key] = (raw, before, FILE if key in stored else DEFAULT)
    return Resolved(config=config, path=path, sources=sources, overrides=overrides)


def load_config(path: Path | None = None, overrides: Mapping[str, Any] | None = None, *,
                flag: str = "--settings-file") -> AppConfig:
    """The deployment's configuration, as the next `cdk deploy` would use it (launchers and the
    pre-flight read it from here). `path`: a file the user named with `flag`, which must exist;
    None: the default file, all defaults while it does not exist."""
    path = named_file(path, flag) if path is not None else DEFAULT_PATH
    return resolve(dict(overrides or {}), path).config


def _typed(key: str, raw: Any) -> Any:
    value = _PARSERS[key](key, raw)
    return list(value) if isinstance(value, tuple) else value


def write(path: Path, values: Mapping[str, Any]) -> None:
    """Validates `values` as a whole configuration, then replaces `path` atomically."""
    AppConfig.from_context(values)
    ordered = {key: values[key] for key in SETTINGS if key in values}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(ordered, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def set_values(path: Path, assignments: Sequence[str]) -> dict[str, Any]:
    """Applies `key=value` assignments (values as typed on a command line); returns the file's
    new contents. Nothing is written unless every value and the result are valid."""
    values = read_file(path)
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"{assignment!r} is not key=value; e.g. worker_count=3")
        if key not in SETTINGS:
            raise unknown_setting(key)
        values[key] = _typed(key, raw)
    write(path, values)
    return values


def unset_values(path: Path, keys: Sequence[str]) -> dict[str, Any]:
    values = read_file(path)
    for key in keys:
        if key not in SETTINGS:
            raise unknown_setting(key)
        values.pop(key, None)
    write(path, values)
    return values


def show(path: Path, as_json: bool) -> str:
    resolved = resolve({}, path)
    rows = [(key, getattr(resolved.config, key), resolved.sources[key]) for key in SETTINGS]
    if as_json:
        return json.dumps({key: {"value": list(v) if isinstance(v, tuple) else v, "source": src}
                           for key, v, src in rows}, indent=2)
    width = max(len(key) for key in SETTINGS)
    lines = [f"settings file: {path}" + ("" if path.exists() else " (none yet: all defaults)")]
    for key, value, source in rows:
        shown = ",".join(value) if isinstance(value, tuple) else json.dumps(value)
        lines.append(f"  {key:<{width}}  {shown:<24} ({source})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="maskrcnn settings",
        description="The deployment's settings, kept in a file that every cdk command reads.",
        epilog="example: maskrcnn settings set instance_type=p4d.24xlarge worker_count=3 "
               "(EFA is on by default where the type has it; efa=false turns it off)")
    parser.add_argument("--file", type=Path, default=DEFAULT_PATH,
                        help=f"settings file (default: {DEFAULT_PATH.name} at the repository root; "
                             "pass the same path to cdk with -c settings_file=PATH)")
    commands = parser.add_subparsers(dest="command", required=True)
    show_cmd = commands.add_parser("show", help="every setting with its value and source")
    show_cmd.add_argument("--json", action="store_true", help="machine-readable output")
    set_cmd = commands.add_parser("set", help="set settings: key=value ...")
    set_cmd.add_argument("assignments", nargs="+", metavar="key=value")
    unset_cmd = commands.add_parser("unset", help="back to the default: key ...")
    unset_cmd.add_argument("keys", nargs="+", metavar="key")
    args = parser.parse_args(argv)
    path = args.file.expanduser().resolve()
    try:
        if args.command == "show":
            print(show(path, args.json))
        elif args.command == "set":
            set_values(path, args.assignments)
            print(show(path, False))
        else:
            unset_values(path, args.keys)
            print(show(path, False))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

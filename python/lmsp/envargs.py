"""Command-line options that may also be set in the environment (`--max-loaded` from
`LMSP_MAX_LOADED`), for services started by systemd units, containers or launchers that set
variables more easily than arguments. A flag given on the command line wins."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

__all__ = ["EnvArgumentParser", "byte_size", "duration"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
_NOT_SETTINGS = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


class EnvArgumentParser(argparse.ArgumentParser):
    """With `env_prefix`, every option added is also read from `<prefix><FLAG>` (`--no-x`:
    `<prefix>NO_X`, or the `env=` given to add_argument), and its help names the variable. A list option
    (`action="append"`) splits its variable at `env_separator` (default `,`). Without a
    prefix it is a plain ArgumentParser (the parser class of every subcommand)."""

    def __init__(self, *args: Any, env_prefix: str | None = None, **kwargs: Any) -> None:
        self.env_prefix = env_prefix  # before super().__init__, which adds -h
        self._from_env: list[tuple[argparse.Action, str, str, Any]] = []
        super().__init__(*args, **kwargs)

    def add_argument(
        self, *args: Any, env: str | None = None, env_separator: str = ",", **kwargs: Any
    ) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if self.env_prefix is None or not action.option_strings or isinstance(action, _NOT_SETTINGS):
            return action
        flag = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
        var = env or self.env_prefix + flag.lstrip("-").upper().replace("-", "_")
        self._from_env.append((action, var, env_separator, action.default))
        if action.help is not argparse.SUPPRESS:
            action.help = f"{action.help} [env {var}]" if action.help else f"[env {var}]"
        return action

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # Read when this parser parses, not when it is built: a bad variable for `serve`
        # must not break `lmsp token list`.
        for action, var, separator, default in self._from_env:
            raw = os.environ.get(var)
            action.default = (
                default if raw is None or raw == "" else self._env_value(action, var, raw, separator, default)
            )
        return super().parse_known_args(args, namespace)

    def _env_value(self, action: argparse.Action, var: str, raw: str, separator: str, default: Any) -> Any:
        if isinstance(action, _FLAGS):
            if raw.lower() in _TRUE:
                return action.const
            if raw.lower() in _FALSE:
                return default
            self.error(f"environment variable {var}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)}")
        if isinstance(action, argparse._AppendAction):
            return [self._convert(action, var, part) for part in raw.split(separator) if part]
        return self._convert(action, var, raw)

    def _convert(self, action: argparse.Action, var: str, raw: str) -> Any:
        try:
            value = self._get_value(action, raw)
            self._check_value(action, value)
        except argparse.ArgumentError as exc:
            self.error(f"environment variable {var}={raw!r}: {exc.message}")
        return value


_DURATION = re.compile(r"(?P<number>-?\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)?")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration(text: str) -> float:
    """Seconds, from `300`, `90s`, `5m`, `1.5h` (Ollama's keep-alive spellings); any negative
    value is -1 (for ever)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 300, 90s, 5m, 1h, 0, -1)")
    seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"]]
    return -1.0 if seconds < 0 else seconds


_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B?|B)?", re.IGNORECASE)
_UNIT_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}


def byte_size(text: str) -> int:
    """Bytes, from `1073741824`, `512M`, `1.5GiB`, `2G` (K, M, G, T: powers of 1024, the way
    memory is counted)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 0, 800M, 4G, 4294967296)")
    unit = (match["unit"] or "b")[0].lower()
    return int(float(match["number"]) * 1024 ** _UNIT_POWER.get(unit, 0))

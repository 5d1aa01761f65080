"""What a user reads from the command line before anything runs: every --help names each flag's environment
variable and default, every command's errors start "kvwatch <command>: error:", an argument is named as the
argument it is, and a replay's worst moment is a time a reader can place. In-process: no server is started."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime

import pytest

from kvwatch import cli, demo, logs, report
from kvwatch.config import Settings
from kvwatch.recording import recording_files
from kvwatch.sim import cli as sim_cli
from tests.helpers.ports import free_port
from tests.helpers.recordings import FIXTURES

ENV_COMMANDS = ("run", "diagnose", "record", "report")  # the commands whose flags are settings (kvwatch.config)
PARSERS = {
    "sim": sim_cli.build_parser,
    "demo": demo.build_parser,
    "logs": logs.build_parser,
    "report": report.build_parser,
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("KVWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal's width: one line per flag
    # main() configures the root logger for the process it runs in; here that is pytest's
    monkeypatch.setattr(cli, "_setup_logging", lambda settings: None)


def _parser(command: str) -> argparse.ArgumentParser:
    if command in PARSERS:
        return PARSERS[command]()
    top = cli.build_parser()
    return next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def _entries(help_text: str) -> dict[str, str]:
    """Each option's entry in a --help, by its first option string, its lines joined."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"^  (-[-\w]+)", line)
        if m:
            current = m.group(1)
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("command", cli.SUBCOMMANDS)
def test_every_help_names_each_flags_environment_variable_and_default(command, capsys):
    rc, out, _ = _run([command, "--help"], capsys)
    assert rc == 0 and out.startswith(f"usage: kvwatch {command}"), out[:200]
    entries = _entries(out)
    flags = [a for a in _parser(command)._actions if a.option_strings and a.dest != "help"]
    assert flags and len(entries) == len(flags) + 1, (sorted(entries), [a.option_strings for a in flags])
    for action in flags:
        text = entries[action.option_strings[0]]
        if not isinstance(action, argparse._StoreTrueAction):  # a switch is off unless given
            assert re.search(r"\b(default|required)\b", text), text
        if command in ENV_COMMANDS and action.dest in Settings.model_fields:
            assert f"env KVWATCH_{action.dest.upper()}" in text, text
    if command not in ENV_COMMANDS:
        assert "None of these flags has an environment variable." in out


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--interval", "abc"],
        ["run", "--frobnicate"],
        ["diagnose", "--frobnicate"],
        ["diagnose", "--duration", "0", "http://h/metrics"],
        ["record", "http://h/metrics", "--out", "/etc/hostname/rec", "--duration", "1"],
        ["plan", "--model-config", "/nonexistent/config.json"],
        ["plan"],
        ["sim", "--port", "-1"],
        ["demo", "--duration", "0"],
        ["demo", "--seed", "x"],
        ["logs"],
    ],
)
def test_every_commands_errors_start_the_same_way(argv, capsys):
    rc, _, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"kvwatch {argv[0]}: error: "), err


def test_demo_seed_says_what_it_does(capsys):
    _, out, _ = _run(["demo", "--help"], capsys)
    assert re.search(r"--seed SEED +\S", out), out


@pytest.mark.parametrize("command", ["diagnose", "record"])
def test_a_url_without_a_scheme_names_the_argument_not_a_flag(command, capsys, tmp_path):
    extra = ["--out", str(tmp_path), "--duration", "1"] if command == "record" else []
    rc, _, err = _run([command, "127.0.0.1:8000/metrics", *extra], capsys)
    assert rc == 2 and err.startswith(f"kvwatch {command}: error: invalid argument URL: "), err
    assert "--target" not in err and "KVWATCH_TARGET" not in err and "'127.0.0.1:8000/metrics'" in err, err


def test_diagnose_takes_its_target_from_the_environment_as_run_does(capsys, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    monkeypatch.setenv("KVWATCH_TARGET", dead)
    rc, out, err = _run(["diagnose", "--duration", "1", "--interval", "0.5"], capsys)
    assert rc == 1 and out.startswith(f"{dead}: unreachable: "), (out, err)  # it scraped the env's target


def test_diagnose_without_a_target_says_where_one_comes_from(capsys):
    rc, _, err = _run(["diagnose"], capsys)
    assert rc == 2 and "URL" in err and "KVWATCH_TARGET" in err and "--replay" in err, err


def test_the_worst_moment_of_a_replay_is_a_utc_time_and_an_offset(capsys):
    d = FIXTURES / "kv_cache"
    _, out, _ = _run(["diagnose", "--replay", str(d), "--json"], capsys)
    worst = json.loads(out)["summary"]["worst"]["timestamp"]
    first = recording_files(d)[0][0]
    rc, out, _ = _run(["diagnose", "--replay", str(d)], capsys)
    when = datetime.fromtimestamp(worst, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert rc == 0 and f"worst moment ({when}, {worst - first:.1f} s into the recording):" in out, out
    assert not re.search(r"t=\d{9,}", out), out  # no raw unix time

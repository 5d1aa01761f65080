"""``kvwatch logs FILE|- [--json] [--follow]``: the diagnosis from vLLM's own log.

vLLM prints a stats line per engine every ~10 s. This command finds every complete one in a file, on
standard input (``kubectl logs -f POD | kvwatch logs -``) or in a growing file (``--follow``), turns each
into the core's ``Signals`` and diagnosis (``kvwatch.logs.analyze``), and prints either a report (a
timeline of states, the dominant bottleneck, recommendations with evidence) or, with ``--json``, one
JSON object per stats record as soon as it is read.

Pipeline: bytes -> ``lines.Unframer`` (collector framing, ANSI, progress bars) -> ``records.Assembler``
(stats records wherever they sit, wrapped or glued; start-up lines) -> ``analyze.LogAnalyzer`` -> output.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from kvwatch.diagnose import Hints
from kvwatch.logs.analyze import LogAnalyzer, RecordResult
from kvwatch.logs.lines import Unframer
from kvwatch.logs.records import Assembler, Event, StatsRecord
from kvwatch.logs.report import Summary, render_report, render_row

__all__ = ["LogSession", "main"]

MAX_LINE = 1 << 20  # a longer physical line is read in pieces (no stats record is that long)
QUEUED_LINES = 64  # standard input: lines read ahead of the parser (at most 64 MiB of them, if each were MAX_LINE)
IDLE_FLUSH = 0.5  # seconds without input before a held record is given out (stdin, --follow)
POLL = 0.2  # --follow: seconds between looks at the file


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"kvwatch logs: error: {message} (see kvwatch logs --help)\n")
        raise SystemExit(2)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kvwatch logs",
        description="Diagnose a vLLM server from its own log: the periodic stats lines "
        "('Avg prompt throughput: ...') and the start-up lines that give its KV capacity and limits.",
        epilog="examples:\n  kvwatch logs server.log\n  kubectl logs -f POD | kvwatch logs -\n"
        "  kvwatch logs --follow /var/log/vllm.log --json\n\n"
        "exit status: 0 when at least one stats record was read, 1 when none, 2 on bad usage.\n\nNone of these flags has an environment variable.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE|-", help="vLLM's log file, or - for standard input")
    p.add_argument("--json", action="store_true", help="one JSON object per stats record, as it is read")
    p.add_argument("--follow", action="store_true", help="keep reading FILE as it grows (until interrupted)")
    p.add_argument(
        "--max-num-seqs", type=_positive_int, metavar="N", help="vLLM's --max-num-seqs (default: from the log)"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        metavar="N",
        help="vLLM's --max-num-batched-tokens (default: from the log)",
    )
    p.add_argument(
        "--max-model-len", type=_positive_int, metavar="N", help="vLLM's --max-model-len (default: from the log)"
    )
    return p


class LogSession:
    """One pass over one log: physical lines in, diagnosed records out (to ``on_record``), and the report's
    ``summary``. With ``keep_results`` (a library caller's default) every record's result is also kept in
    ``results``; the command keeps none, so its memory does not grow with the log."""

    def __init__(
        self,
        hints: Hints = Hints(),
        on_record: Callable[[RecordResult], None] | None = None,
        keep_results: bool = True,
    ):
        self.unframer = Unframer()
        self.assembler = Assembler()
        self.analyzer = LogAnalyzer(hints, keep_results=keep_results)
        self.summary = Summary()
        self.on_record = on_record
        self.lines = 0

    def _handle(self, items) -> None:
        for it in items:
            if isinstance(it, Event):
                self.analyzer.event(it)
            elif isinstance(it, StatsRecord):
                res = self.analyzer.record(it)
                self.summary.add(res)
                if self.on_record is not None:
                    self.on_record(res)

    def feed(self, raw: str, line: int) -> None:
        self.lines = max(self.lines, line)
        for lg in self.unframer.feed(raw, line):
            self._handle(self.assembler.feed(lg))

    def idle(self) -> None:
        """No input for a while: give out what is held (a record waiting to see if the next line continues it)."""
        if self.assembler.holding:
            self._handle(self.assembler.flush())

    def finish(self) -> None:
        for lg in self.unframer.flush():
            self._handle(self.assembler.feed(lg))
        self._handle(self.assembler.flush())

    @property
    def results(self) -> list[RecordResult]:
        return self.analyzer.results


def _decode(chunk: bytes) -> str:
    return chunk.decode("utf-8", errors="replace").removesuffix("\n")


def _read_lines(f: BinaryIO, start: int = 0) -> Iterator[tuple[str, int]]:
    n = start
    while True:
        chunk = f.readline(MAX_LINE)
        if not chunk:
            return
        n += 1
        yield _decode(chunk), n


def _stdin_lines(session: LogSession, stream: BinaryIO) -> None:
    """Standard input as it arrives (a pipe from ``kubectl logs -f``): records are given out within ~0.5 s."""
    q: queue.Queue = queue.Queue(maxsize=QUEUED_LINES)

    def reader():
        try:
            for chunk in iter(lambda: stream.readline(MAX_LINE), b""):
                q.put(chunk)
        finally:
            q.put(None)

    threading.Thread(target=reader, name="kvwatch-logs-stdin", daemon=True).start()
    n = 0
    while True:
        try:
            chunk = q.get(timeout=IDLE_FLUSH)
        except queue.Empty:
            session.idle()
            continue
        if chunk is None:
            return
        n += 1
        session.feed(_decode(chunk), n)


def _follow(session: LogSession, path: str) -> None:
    """Read ``path`` to its end, then keep reading what is appended. A file that was replaced (logrotate's
    create), truncated (copytruncate) or rewritten under us is read again from its start: the bytes
    just before our position must still be the ones we read."""
    f = open(path, "rb")  # noqa: SIM115 - reopened on rotation, closed in finally
    ino = os.fstat(f.fileno()).st_ino
    n = 0
    partial = b""
    seen = b""  # the last bytes read, to recognise the same file at the same place
    idle_since = None
    try:
        while True:
            chunk = f.readline(MAX_LINE)
            if chunk:
                partial += chunk
                seen = (seen + chunk)[-64:]
                if partial.endswith(b"\n") or len(partial) >= MAX_LINE:
                    n += 1
                    session.feed(_decode(partial), n)
                    partial = b""
                idle_since = None
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            elif now - idle_since >= IDLE_FLUSH:
                session.idle()
            time.sleep(POLL)
            try:
                st = os.stat(path)
            except OSError:
                continue  # rotated away; the new file is not there yet
            pos = f.tell()
            same = st.st_ino == ino and st.st_size >= pos
            if same and seen:
                try:
                    same = os.pread(f.fileno(), len(seen), pos - len(seen)) == seen
                except OSError:
                    same = False
            if not same:
                f.close()
                f = open(path, "rb")  # noqa: SIM115
                ino = os.fstat(f.fileno()).st_ino
                n, partial, seen = 0, b"", b""
    finally:
        if partial:
            n += 1
            session.feed(_decode(partial), n)
        f.close()


class _Stop(Exception):
    pass


def _unreadable(path: str) -> str | None:
    """Why ``path`` cannot be read as a log, or None."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    if os.path.isdir(path):
        return f"cannot read {path}: is a directory"
    return None


def _feed(session: LogSession, args) -> None:
    if args.file == "-":
        _stdin_lines(session, sys.stdin.buffer)
    elif args.follow:
        _follow(session, args.file)
    else:
        with open(args.file, "rb") as f:
            for raw, n in _read_lines(f):
                session.feed(raw, n)


def _stop_on_sigterm():
    """Let SIGTERM end a stream like Ctrl-C does (the report is still printed); the previous handler."""

    def stop(signum, frame):
        raise _Stop()

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (an embedding caller): Ctrl-C still works
        return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    hints = Hints(args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len)
    name = "<stdin>" if args.file == "-" else args.file
    streaming = args.file == "-" or args.follow
    if args.file != "-" and (why := _unreadable(args.file)):
        sys.stderr.write(f"kvwatch logs: error: {why}\n")
        return 2

    def on_record(res: RecordResult) -> None:
        if args.json:
            print(json.dumps(res.as_dict()), flush=True)
        elif streaming:
            print(render_row(res), flush=True)

    session = LogSession(hints, on_record, keep_results=False)
    previous = _stop_on_sigterm() if streaming else None
    try:
        try:
            _feed(session, args)
        except (KeyboardInterrupt, _Stop):
            pass  # --follow and pipes end here: report what was read
        session.finish()
        if not session.summary.count:
            sys.stderr.write(f"kvwatch logs: no vLLM stats line found in {name} ({session.lines} lines read)\n")
            return 1
        if not args.json:
            if streaming:
                print()
            a = session.assembler
            print(render_report(name, session.analyzer, session.summary, a.skipped_count, a.skipped), flush=True)
        return 0
    except BrokenPipeError:  # `kvwatch logs ... | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

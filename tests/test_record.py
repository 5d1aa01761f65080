"""`kvwatch record` writes each snapshot whole or not at all (a temporary file in the same directory, fsync,
rename), and on a full disk or a read-only directory it stops with one clear line and no partial file.

The real cases run the real command against a fake vLLM on loopback, into a real tmpfs of 64 KiB (full after one
52 KB capture) or a read-only one. Mounting needs root; CI runs as root, so a mount that fails fails the test (a
skip could only hide a broken environment), as tests/test_dockerfile.py's image run does.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.recording import check_writable, recording_files, write_snapshot
from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.recordings import captures


def test_a_snapshot_is_written_whole(tmp_path):
    path = write_snapshot(tmp_path, 1796120533.3264, "a 1\n")
    assert path.name == "1796120533.326.prom" and path.read_text() == "a 1\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert recording_files(tmp_path) == [(1796120533.326, path)]


@pytest.mark.parametrize("where", ["write", "fsync", "rename"])
def test_a_failed_write_leaves_no_file_at_all(tmp_path, monkeypatch, where):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = {
        "write": "kvwatch.recording.os.fdopen",
        "fsync": "kvwatch.recording.os.fsync",
        "rename": "kvwatch.recording.os.replace",
    }
    if where == "write":
        real = os.fdopen

        class Full:
            def __init__(self, fd, mode):
                self.f = real(fd, mode)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])  # half of it reached the disk
                full()

        monkeypatch.setattr(target[where], Full)
    else:
        monkeypatch.setattr(target[where], full)
    with pytest.raises(OSError) as e:
        write_snapshot(tmp_path, 1.0, "a 1\n" * 1000)
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # neither the snapshot nor its temporary file


def test_the_directory_is_checked_at_start(tmp_path):
    check_writable(tmp_path / "new" / "dir")  # created
    assert (tmp_path / "new" / "dir").is_dir() and list((tmp_path / "new" / "dir").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        check_writable(tmp_path / "file")


# --- the real command -------------------------------------------------------------------------------


async def _record(out: Path, url: str, duration: float, on_start=None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvwatch",
        "record",
        url,
        "--out",
        str(out),
        "--duration",
        str(duration),
        "--interval",
        "0.2",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    if on_start is not None:
        await on_start()
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out_b.decode(), err_b.decode()


def _mount(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs at {where} (needs root; CI runs as root): {proc.stderr.strip() or proc.returncode}"
        )


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _error_lines(err: str) -> list[str]:
    """stderr but the scrape warnings: a loaded machine (CI, pytest-xdist beside it) can time a 0.2-s scrape out,
    and kvwatch says so in a WARNING line; the one error line must still be the last line."""
    lines = err.strip().splitlines()
    kept = [line for line in lines if " WARNING kvwatch: scrape failed: " not in line]
    assert lines and kept and lines[-1] == kept[-1], err
    return kept


def _complete_snapshots_only(directory: Path, bodies: list[str]) -> int:
    names = sorted(p.name for p in directory.iterdir())
    files = recording_files(directory)
    assert [p.name for _, p in files] == names, names  # nothing else: no temporary file left behind
    for _, p in files:
        assert p.read_text() in bodies, f"{p.name} is not a whole snapshot ({p.stat().st_size} bytes)"
    return len(files)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_full_disk_stops_the_recording_with_one_line(tmp_path):
    mnt = tmp_path / "mnt"
    _mount(mnt, "size=64k")
    try:
        async with FakeVllm() as up:
            up.serve_dir("kv_cache")
            code, out, err = await _record(mnt, up.url, 30)
        assert code == 1, (code, out, err)
        lines = _error_lines(err)
        assert len(lines) == 1 and lines[0].startswith("kvwatch record: error: cannot write a snapshot to "), err
        assert "No space left on device" in lines[0] and "no partial file left" in lines[0]
        assert out == ""
        assert _complete_snapshots_only(mnt, captures("kv_cache")) >= 1  # the first fitted; the second did not
    finally:
        _umount(mnt)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_read_only_directory_is_refused_at_start_with_exit_2(tmp_path):
    mnt = tmp_path / "ro"
    _mount(mnt, "ro,size=64k")
    try:
        code, out, err = await _record(mnt, "http://127.0.0.1:9/metrics", 5)
        assert code == 2, (code, out, err)
        assert err.strip().splitlines() == [
            f"kvwatch record: error: invalid setting --out: cannot write to {str(mnt)!r}: Read-only file system"
        ]
        assert list(mnt.iterdir()) == []
    finally:
        _umount(mnt)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_directory_that_turns_read_only_stops_the_recording(tmp_path):
    mnt = tmp_path / "mnt"
    _mount(mnt, "size=8m")
    try:
        async with FakeVllm() as up:
            up.serve_dir("kv_cache")

            async def remount_when_recording():
                for _ in range(600):
                    if recording_files(mnt):
                        break
                    await asyncio.sleep(0.05)
                subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)

            code, out, err = await _record(mnt, up.url, 60, remount_when_recording)
        assert code == 1, (code, out, err)
        lines = _error_lines(err)
        assert len(lines) == 1 and "Read-only file system" in lines[0] and "no partial file left" in lines[0], err
        assert _complete_snapshots_only(mnt, captures("kv_cache")) >= 1
    finally:
        _umount(mnt)


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_an_out_that_is_a_file_is_refused_with_exit_2(tmp_path):
    (tmp_path / "f").write_text("x")
    code, out, err = await _record(tmp_path / "f", "http://127.0.0.1:9/metrics", 5)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "invalid setting --out" in err, (code, err)

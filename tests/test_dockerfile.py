"""The container image (Dockerfile, .dockerignore), checked without a Docker engine.

Two kinds of proof:

- the Dockerfile's facts: a base image pinned to a patch release (no floating tag, no ``latest``), every Python
  dependency installed at the version constraints.txt pins (each of pyproject.toml's, within its range), a numeric
  non-root ``USER``, ``ENTRYPOINT ["kvwatch"]`` naming the console script pyproject.toml declares, kvwatch's
  default port exposed, OCI labels, and a build context (``.dockerignore``) holding exactly what is copied;
- the build itself: the build stage's ``RUN`` steps, read from the Dockerfile and run verbatim by ``/bin/sh -c``
  (Docker's shell) in a copy of the build context, produce a venv in which ``kvwatch --help`` works, every
  module is compiled to bytecode that is never rewritten, no pip is left and every distribution in it is one
  constraints.txt pins, at that version; then kvwatch is started the way
  the image runs it: the final stage's ``ENV``, ``WORKDIR``, ``USER`` (65532:65532, no capabilities, no new
  privileges), ``ENTRYPOINT`` + ``CMD``, as PID 1 of its own PID namespace, with every mount of the root
  filesystem read-only and a tmpfs on /tmp (``docker run --read-only --tmpfs /tmp``). It must serve /healthz,
  /readyz and /metrics while its vLLM target is down, and stop on SIGTERM.

The second needs root (mount namespaces), util-linux ``unshare``/``setpriv``, a system Python of the base
image's minor version that uid 65532 may run, and PyPI for kvwatch's dependencies, as the real build does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.ports import free_port
from tests.helpers.process import Process, ProcessExited

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONSTRAINTS = REPO / "constraints.txt"


# -- a small Dockerfile reader ----------------------------------------------------------------------------


@dataclass
class Instruction:
    cmd: str  # upper case
    args: str  # the rest, continuation lines joined
    line: int


@dataclass
class Stage:
    base: str  # as written (may hold ${ARG})
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for ins in self.all("ENV"):
            env.update(_key_values(ins.args))
        return env


def _key_values(args: str) -> dict[str, str]:
    """``ENV``/``LABEL``/``ARG`` arguments in the ``k=v k2="v 2"`` form."""
    out = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        out[key] = value if sep else ""
    return out


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Handles comments, blank lines and backslash continuations."""
    instructions: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        cmd, _, args = buf.partition(" ")
        instructions.append(Instruction(cmd.upper(), args.strip(), start))
        buf = ""
    assert not buf, "Dockerfile ends inside a line continuation"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.cmd == "FROM":
            words = ins.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert ins.cmd == "ARG", f"line {ins.line}: only ARG may precede the first FROM"
            global_args.update(_key_values(ins.args))
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


def expand(value: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m[1] or m[2], m[0]), value)


GLOBAL_ARGS, STAGES = parse_dockerfile(DOCKERFILE.read_text())
BUILD = STAGES[0]
FINAL = STAGES[-1]


def _exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), ins
    return value


# -- the Dockerfile's facts --------------------------------------------------------------------------------


def test_multi_stage_and_the_runtime_stage_copies_only_the_venv():
    assert len(STAGES) >= 2 and BUILD.name, "a named build stage, then the runtime stage"
    copies = FINAL.all("COPY")
    assert copies, "the runtime stage copies the venv from the build stage"
    for ins in copies:
        assert ins.args.startswith(f"--from={BUILD.name} "), (
            f"line {ins.line}: runtime stage copies from the build context"
        )
    venv = BUILD.env()["VENV"]
    assert [c.args.split()[1:] for c in copies] == [[venv, venv]], "the venv keeps its path (its scripts hard-code it)"


def test_base_image_is_a_slim_python_pinned_to_a_patch_release():
    bases = {expand(s.base, GLOBAL_ARGS) for s in STAGES}
    assert len(bases) == 1, f"build and runtime stages must share one base (the venv links its interpreter): {bases}"
    (base,) = bases
    assert "latest" not in base
    m = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base)
    assert m, f"{base!r} is not python:X.Y.Z-slim[-distro][@digest]"
    required = PYPROJECT["project"]["requires-python"]
    low = tuple(int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", required).groups())
    assert (int(m[1]), int(m[2])) >= low, f"{base} does not satisfy requires-python {required}"


def test_no_floating_tags_anywhere():
    text = DOCKERFILE.read_text()
    assert not re.search(r":latest\b", text)
    for s in STAGES:
        image = expand(s.base, GLOBAL_ARGS)
        assert ":" in image or image in {st.name for st in STAGES}, f"untagged base {image!r}"


def pins() -> dict[str, str]:
    """constraints.txt as {canonical name: version}; every line that is not a comment is ``name==version``."""
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][0-9A-Za-z.+!-]*)", line.strip())
            assert m, f"constraints.txt: {line!r} is not name==version"
            out[canonicalize_name(m[1])] = m[2]
    return out


def test_dependencies_install_at_the_versions_constraints_txt_pins():
    (install,) = [i for i in BUILD.all("RUN") if " install " in i.args]
    assert re.search(rf"(?:--constraint|-c)[ =]{CONSTRAINTS.name}(?:\s|$)", install.args), (
        f"line {install.line}: the pip install does not pass --constraint {CONSTRAINTS.name}"
    )
    copied = [src for srcs, _ in _copy_sources(BUILD) for src in srcs]
    assert CONSTRAINTS.name in copied and in_build_context(CONSTRAINTS.name), "COPY constraints.txt into WORKDIR"
    pinned = pins()
    for dependency in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dependency)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} (pyproject.toml) is not pinned in constraints.txt"
        assert req.specifier.contains(pinned[name]), (
            f"constraints.txt pins {req.name} {pinned[name]}, not {req.specifier}"
        )


def test_the_pin_check_refuses_a_loose_line(tmp_path, monkeypatch):
    loose = tmp_path / "constraints.txt"
    loose.write_text(CONSTRAINTS.read_text() + "httpx>=0.27\n")
    monkeypatch.setattr(sys.modules[__name__], "CONSTRAINTS", loose)
    with pytest.raises(AssertionError, match="not name==version"):
        pins()


def test_runs_as_a_numeric_non_root_user():
    users = FINAL.all("USER")
    assert users, "the runtime stage sets USER"
    m = re.fullmatch(r"(\d+):(\d+)", users[-1].args)
    assert m, f"USER {users[-1].args!r} must be numeric UID:GID (a name fails the kubelet's runAsNonRoot check)"
    assert int(m[1]) != 0 and int(m[2]) != 0
    assert FINAL.instructions.index(users[-1]) > max(
        FINAL.instructions.index(i) for i in FINAL.all("RUN") + FINAL.all("COPY")
    ), "USER comes after every RUN/COPY of the runtime stage"


def test_entrypoint_is_the_console_script_and_cmd_the_sidecar():
    (entry,) = FINAL.all("ENTRYPOINT")
    assert _exec_form(entry) == ["kvwatch"]
    assert "kvwatch" in PYPROJECT["project"]["scripts"], "pyproject.toml declares the kvwatch console script"
    (cmd,) = FINAL.all("CMD")
    assert _exec_form(cmd) == ["run"]
    venv = BUILD.env()["VENV"]
    assert FINAL.env()["PATH"].split(":")[0] == f"{venv}/bin", "the venv's scripts come first on PATH"


def test_exposes_kvwatchs_default_port():
    from kvwatch.config import Settings

    default_port = int(Settings.model_fields["listen"].default.rpartition(":")[2])
    assert [e.args for e in FINAL.all("EXPOSE")] == [str(default_port)]


def test_oci_labels():
    labels: dict[str, str] = {}
    for ins in FINAL.all("LABEL"):
        labels.update(_key_values(ins.args))
    args: dict[str, str] = {}
    for ins in FINAL.all("ARG"):
        args.update(_key_values(ins.args))
    for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
        assert f"org.opencontainers.image.{key}" in labels, key
    assert labels["org.opencontainers.image.title"] == PYPROJECT["project"]["name"]
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]["text"]
    assert labels["org.opencontainers.image.description"] == PYPROJECT["project"]["description"]
    assert expand(labels["org.opencontainers.image.version"], args) == PYPROJECT["project"]["version"]


def test_nothing_writes_at_run_time():
    env = FINAL.env()
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("HOME") == "/tmp" and env.get("TMPDIR") == "/tmp", "HOME and TMPDIR on the one tmpfs"
    build_steps = " ".join(i.args for i in BUILD.all("RUN"))
    assert "compileall" in build_steps and "unchecked-hash" in build_steps


# -- .dockerignore -----------------------------------------------------------------------------------------


def _dockerignore_rules() -> list[tuple[bool, str]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, line.lstrip("!").strip("/")))
    return rules


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: ``*`` and ``?`` stay inside one path element, ``**`` spans any number."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            j = pattern.index("]", i)
            out, i = out + pattern[i : j + 1], j + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def _pattern_matches(pattern: str, rel: str) -> bool:
    """A pattern that matches a file or any of its parent directories covers the file."""
    rx = _pattern_regex(pattern)
    parts = rel.split("/")
    return any(rx.match("/".join(parts[:i])) for i in range(1, len(parts) + 1))


def in_build_context(rel: str) -> bool:
    included = True
    for negate, pattern in _dockerignore_rules():
        if _pattern_matches(pattern, rel):
            included = negate
    return included


def _copy_sources(stage: Stage) -> list[tuple[list[str], str]]:
    out = []
    for ins in stage.all("COPY"):
        if ins.args.startswith("--from="):
            continue
        words = ins.args.split()
        out.append((words[:-1], words[-1]))
    return out


def _context_files(src: str) -> list[str]:
    path = REPO / src
    if path.is_file():
        return [src.strip("/")]
    return sorted(str(p.relative_to(REPO)) for p in path.rglob("*") if p.is_file())


def test_dockerignore_admits_what_is_copied_and_nothing_else():
    copied = [src for srcs, _ in _copy_sources(BUILD) for src in srcs]
    assert copied, "the build stage COPYs its sources"
    for src in copied:
        files = [f for f in _context_files(src) if in_build_context(f)]
        assert files, f"COPY {src}: nothing of it is in the build context"
        assert all(not f.endswith((".pyc", ".pyo")) and "__pycache__" not in f for f in files)
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    sent = {f for f in tracked if in_build_context(f)}
    expected = {f for src in copied for f in _context_files(src) if in_build_context(f) and f in tracked}
    assert sent == expected, f"the build context also holds {sorted(sent - expected)[:10]}"
    for private in (".git/config", ".venv/pyvenv.cfg", "tests/test_dockerfile.py", "grafana/generate.py"):
        assert not in_build_context(private), private


# -- the build, run for real -------------------------------------------------------------------------------


def _world_usable(path: Path) -> bool:
    """Can uid 65532 (no groups) execute this file? Every directory on the way must be o+x."""
    path = path.resolve()
    for parent in list(path.parents)[:-1]:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(path.stat().st_mode & stat.S_IXOTH)


def _system_python(minor: tuple[int, int]) -> str:
    """A Python of the base image's minor version, with pip, that a non-root uid can run (the image's
    interpreter is /usr/local/bin/python; here: whichever system one fits)."""
    candidates = [
        f"/usr/local/bin/python{minor[0]}.{minor[1]}",
        f"/usr/bin/python{minor[0]}.{minor[1]}",
        getattr(sys, "_base_executable", sys.executable),
    ]
    tried = []
    for c in candidates:
        p = Path(c)
        if not p.exists() or not _world_usable(p):
            tried.append(f"{c}: missing or not executable by others")
            continue
        probe = subprocess.run(
            [c, "-c", "import sys, pip, venv; print(*sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode != 0 or tuple(map(int, probe.stdout.split())) != minor:
            tried.append(f"{c}: {probe.stdout.strip() or probe.stderr.strip()[-200:]}")
            continue
        return str(p.resolve())
    pytest.fail(
        f"no Python {minor[0]}.{minor[1]} with pip that uid 65532 can run; tried: {tried} "
        f"(Debian: apt-get install python3 python3-pip python3-venv)"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Run the build stage's RUN steps verbatim; returns (root dir, venv dir). Outside /tmp on purpose: the
    run below mounts a fresh tmpfs over /tmp."""
    if os.geteuid() != 0:
        pytest.fail("the image run needs root (mount namespaces, setpriv); CI runs as root")
    base = expand(BUILD.base, GLOBAL_ARGS)
    minor = tuple(int(x) for x in re.match(r"python:(\d+)\.(\d+)", base).groups())
    python = _system_python(minor)

    root = Path(tempfile.mkdtemp(prefix="kvwatch-image-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        # The build context, through .dockerignore, laid out in WORKDIR as the build stage's COPYs do.
        src = root / "src"
        src.mkdir()
        for sources, dest in _copy_sources(BUILD):
            for s in sources:
                if (REPO / s).is_dir():
                    pairs = [(f, src / dest / Path(f).relative_to(s.strip("/"))) for f in _context_files(s)]
                else:
                    pairs = [(s, src / dest / Path(s).name if dest.endswith("/") else src / dest)]
                for f, target in pairs:
                    if in_build_context(f):
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(REPO / f, target)

        shim = root / "bin"
        shim.mkdir()
        (shim / "python").symlink_to(python)
        env = {
            "PATH": f"{shim}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(root),
            **{k: v for k, v in os.environ.items() if k.startswith(("PIP_INDEX", "PIP_EXTRA_INDEX", "PIP_TRUSTED"))},
            **BUILD.env(),
            "VENV": str(root / "opt" / "kvwatch"),
            "WHEELHOUSE": str(root / "wheelhouse"),
        }
        for ins in BUILD.all("RUN"):
            proc = subprocess.run(
                ["/bin/sh", "-c", ins.args], cwd=src, env=env, capture_output=True, text=True, timeout=900
            )
            assert proc.returncode == 0, (
                f"Dockerfile line {ins.line} failed ({proc.returncode}):\n{ins.args}\n"
                f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
            )
        yield root, Path(env["VENV"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_build_steps_produce_a_compiled_venv_without_pip(built):
    _, venv = built
    help_out = subprocess.run([venv / "bin" / "kvwatch", "--help"], capture_output=True, text=True)
    assert help_out.returncode == 0, help_out.stderr
    assert "run" in help_out.stdout
    assert not (venv / "bin" / "pip").exists(), "no pip in the runtime venv"
    (site,) = list(venv.glob("lib/python3.*/site-packages"))
    assert not list(site.glob("pip/")), "no pip in the runtime venv"
    modules = sorted((site / "kvwatch").rglob("*.py"))
    assert len(modules) > 5
    for py in modules + sorted((site / "aiohttp").glob("*.py"))[:20]:
        (pyc,) = list((py.parent / "__pycache__").glob(f"{py.stem}.*.pyc"))
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == 0b01, f"{pyc}: not an unchecked-hash pyc (flags {flags:#b})"


@pytest.mark.slow
def test_the_image_holds_exactly_the_pinned_versions(built):
    """Nothing unpinned slipped in: every distribution of the venv but kvwatch is in constraints.txt, at its version,
    and every pin is installed (a stale pin would name a package nothing needs any more)."""
    _, venv = built
    listing = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import importlib.metadata as m; print(*(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    installed = {canonicalize_name(n): v for n, _, v in (x.partition("==") for x in listing)}
    assert installed.pop("kvwatch") == PYPROJECT["project"]["version"]
    assert installed == pins()


def _final_runtime_env(venv: Path) -> dict[str, str]:
    image_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the python image's PATH
    env = {}
    for key, value in FINAL.env().items():
        value = value.replace(BUILD.env()["VENV"], str(venv))
        env[key] = expand(value, {"PATH": image_path, **env})
    return env


def _child_pid(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


@pytest.mark.slow
def test_image_runs_as_65532_on_a_read_only_root_with_a_tmpfs(built):
    root, venv = built
    uid, gid = FINAL.all("USER")[-1].args.split(":")
    (workdir,) = [i.args for i in FINAL.all("WORKDIR")][-1:]
    port, dead = free_port(), free_port()
    env = {
        **_final_runtime_env(venv),
        # The sidecar's listen address, here on loopback; a target nobody serves (vLLM still loading).
        "KVWATCH_LISTEN": f"127.0.0.1:{port}",
        "KVWATCH_TARGET": f"http://127.0.0.1:{dead}/metrics",
    }
    command = _exec_form(FINAL.all("ENTRYPOINT")[-1]) + _exec_form(FINAL.all("CMD")[-1])
    script = f"""
set -e
# docker run --read-only: every mount except the kernel's pseudo file systems becomes read-only
awk '{{print $2}}' /proc/self/mounts | grep -Ev '^/(proc|sys|dev)(/|$)' | sort -u | while read -r m; do
    mount -o remount,bind,ro "$m" 2>/dev/null || true
done
if touch /var/tmp/.kvwatch-rw-probe 2>/dev/null || touch {root}/.rw-probe 2>/dev/null; then
    echo "root file system is still writable" >&2; exit 97
fi
# --tmpfs /tmp
mount -t tmpfs -o size=16m,mode=1777,nosuid,nodev tmpfs /tmp
cd {shlex.quote(workdir)}
exec setpriv --reuid {uid} --regid {gid} --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all \\
    -- {" ".join(shlex.quote(c) for c in command)}
"""
    log = root / "kvwatch.log"
    with log.open("wb") as out:  # kvwatch's output only (no command line: the checks below read it all)
        proc = Process(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--", "/bin/sh", "-c", script],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        ).start()
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5, trust_env=False)
        try:
            proc.wait_for_url(f"http://127.0.0.1:{port}/readyz", timeout=60, what="kvwatch /readyz")
        except ProcessExited:
            raise AssertionError(f"kvwatch exited {proc.returncode}:\n{log.read_text()[-3000:]}") from None
        assert client.get("/healthz").status_code == 200
        # The status page's files are package data: in the wheel, read from the read-only venv.
        assert client.get("/").status_code == 200 and client.get("/static/page.js").status_code == 200
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert re.search(r"^kvwatch_up\{[^}]*\} 0(\.0)?$", metrics.text, re.M), "target down: kvwatch_up 0"

        # It runs as PID 1 of its namespace, as the container's entrypoint does: SIGTERM must stop it.
        pid1 = _child_pid(proc.pid)
        assert pid1 is not None
        status = Path(f"/proc/{pid1}/status").read_text()
        assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s+{uid}\s+{uid}$", status, re.M), status
        assert re.search(r"^CapEff:\s+0+$", status, re.M)
        assert re.search(r"^NSpid:\s+\d+\s+1$", status, re.M), "kvwatch is PID 1 in its namespace"
        os.kill(pid1, signal.SIGTERM)
        proc.wait(timeout=30)
        text = log.read_text()
        assert "Read-only file system" not in text and "PermissionError" not in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        proc.stop(sig=signal.SIGKILL)

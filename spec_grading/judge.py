"""Running the judge: one trusted ``pytest`` process per submission, watched from the grader.

The judge is ``python -m pytest <spec_tests files> --spec-remote=<staged submission>
-p spec_grading.collector ...``: it computes expected values with the live reference, compares and
decides; the submission runs only in the judge's worker (sandboxed where possible). The grader
(this module) never imports the submission or the suite: it starts the judge in a new process
group, kills that group at the whole-run limit, gives it a few seconds to exit after its last
result, and reads the verdicts it wrote (``collector.py``). Whatever happens to the judge, every
test ends with an outcome: a judge that dies or is killed leaves the tests it finished with their
verdicts and the rest "not run", with the reason.

Each judge's files live in its own folder of the grader's run folder (``workspace.py``): the
staged submission, the worker's folder, the judge's output and log.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from spec_tests.harness.judging.results import VERDICTS, Status

from . import forkserver
from .collector import FINAL_NAME, FORMAT, PROGRESS_NAME
from .packages import import_root, package_dir
from .textsafe import clean

HYPOTHESIS_PROFILE = "spec-grading"
EXIT_GRACE_S = 10.0  # after its verdicts are written, the judge has this long to exit
JUDGE_MEMORY_EXTRA_MB = 2048  # the judge's address space: the worker's limit plus this


def judge_memory_bytes(worker_memory_mb: int) -> int:
    """The judge's own memory limit (0: none). The judge decodes the worker's replies and computes the
    reference around them (composition, diagnosis); this bounds what a reply can make it allocate, so
    one that would need more fails as that test's error instead of exhausting the host.

    How, on every device (``limit_judge_memory``): a cgroup v2 group of its own (``memory.max``, no
    swap) where the grader can make one; otherwise ``RLIMIT_AS`` on CPU and, with ``--device cuda``
    (whose driver reserves far more address space than it uses, so ``RLIMIT_AS`` would stop CUDA
    from starting), ``RLIMIT_DATA``: the private writable memory the judge allocates, which is what
    the decoded replies take on the host."""
    return (worker_memory_mb + JUDGE_MEMORY_EXTRA_MB) * 1024 * 1024 if worker_memory_mb > 0 else 0


def judge_rlimit(device: str) -> int:
    """The resource limit that bounds the judge's memory without a cgroup, for ``device``."""
    return resource.RLIMIT_AS if str(device).split(":")[0] == "cpu" else resource.RLIMIT_DATA


@dataclass(frozen=True)
class Limits:
    test_timeout_s: float = 60.0
    run_timeout_s: float = 1200.0
    memory_mb: int = 4096


@dataclass
class Verdict:
    """One test's outcome as the judge saw it (``status`` one of ``results.VERDICTS``, or ``not_run``)."""

    status: str
    message: str = ""
    root_cause: list[str] = field(default_factory=list)
    failed_checks: list[dict] = field(default_factory=list)


@dataclass
class JudgeResult:
    verdicts: dict[str, Verdict]
    could_not_run: str | None = None
    subject: dict = field(default_factory=dict)
    stopped: str | None = None  # why the judge did not finish normally, if it did not
    staff_notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    described: dict = field(default_factory=dict)  # the manifest pass: each test's rubric facts


def grader_dir() -> Path:
    return Path(__file__).resolve().parent


def spec_tests_dir() -> Path:
    """The suite's folder, wherever it is installed (found by the import system, not by a path)."""
    return package_dir("spec_tests")


def import_roots() -> list[str]:
    """Folders that make ``spec_tests``, ``reference`` and ``spec_grading`` import, in a child process,
    from where they import here (a checkout, an installed copy, or the current folder, as in the
    Gradescope autograder), so that the judge runs the very code this process hashed and trusts."""
    roots: list[str] = []
    for name in ("spec_tests", "reference", "spec_grading"):
        root = import_root(name)
        if root is not None and str(root) not in roots:
            roots.append(str(root))
    return roots


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a trusted child (judge, recording pass): no SPEC_/PYTEST_/HYPOTHESIS_
    settings of the caller, the project importable as it is here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEC_", "PYTEST_", "HYPOTHESIS_"))}
    env["PYTHONPATH"] = os.pathsep.join([*import_roots(), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def judge_env(sandbox: str) -> dict[str, str]:
    env = child_env()
    env.update(
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
        SPEC_SANDBOX=sandbox,
        SPEC_TORCH_THREADS="1",
    )
    for key in ("SPEC_SANDBOX_UID_BASE",):  # the sandbox's own settings pass through
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def judge_command(
    staged: Path,
    out: Path,
    *,
    tests_file: Path | None,
    files: list[str] | None,
    capabilities: list[str],
    limits: Limits,
    device: str = "cpu",
    worker_dir: Path,
    protect: list[Path] = (),
    select: str | None = None,
    describe: bool = False,
    seed_file: Path | None = None,
) -> list[str]:
    suite = spec_tests_dir()
    targets = [str(suite / f) for f in files] if files else [str(suite)]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-q",
        "--no-header",
        "--tb=no",
        "-rN",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:benchmark",  # the suite has no benchmarks; the plugin would probe the machine (git, file) at start
        "-p",
        "spec_grading.collector",
        f"--rootdir={suite.parent}",
        f"--spec-remote={staged}",
        f"--spec-capabilities={','.join(capabilities)}",
        f"--spec-test-timeout={limits.test_timeout_s:g}",
        f"--spec-memory-mb={limits.memory_mb}",
        f"--spec-device={device}",
        f"--spec-workdir={worker_dir}",
        f"--hypothesis-profile={HYPOTHESIS_PROFILE}",
        f"--grading-out={out}",
        f"--grading-parent-pid={os.getpid()}",
    ]
    cmd += [f"--spec-protect={p}" for p in protect]
    if seed_file is not None:  # grading inputs: from a seed in a file of the judge's folder, not its command line
        cmd += [f"--spec-seed=@{seed_file}", "--spec-conceal-exact"]
    if tests_file is not None:
        cmd.append(f"--grading-tests={tests_file}")
    if select:
        cmd.append(f"-k={select}")
    if describe:
        cmd.append("--grading-describe")
    return cmd


class JudgeRun:
    """One judge process: ``start()``, then ``poll()`` until it returns True, then ``result()``."""

    def __init__(
        self,
        staged: Path,
        folder: Path,
        test_ids: list[str] | None,
        *,
        capabilities: list[str],
        limits: Limits,
        device: str = "cpu",
        sandbox: str = "auto",
        select: str | None = None,
        describe: bool = False,
        on_result=None,
        protect=(),
        seed: int | None = None,
    ):
        """``seed``: the spec seed the judge draws every input from (``--spec-seed``), kept in a file of
        the judge's folder; None: the suite's own inputs (the trusted manifest pass)."""
        self.folder = Path(folder)
        self.out = self.folder / "judge"
        self.test_ids = list(test_ids) if test_ids is not None else None
        self.limits, self.on_result = limits, on_result
        self.device = device
        self.out.mkdir(parents=True, exist_ok=True)
        tests_file = None
        files = None
        self.seed = seed
        seed_file = None
        if seed is not None:
            seed_file = self.out / "spec-seed.txt"
            seed_file.write_text(f"{int(seed)}\n", encoding="ascii")
            seed_file.chmod(0o600)
        if self.test_ids is not None:
            tests_file = self.folder / "tests.txt"
            tests_file.write_text("".join(f"{t}\n" for t in self.test_ids), encoding="utf-8")
            files = sorted({t.split("::", 1)[0] for t in self.test_ids})
        self.command = judge_command(
            staged,
            self.out,
            tests_file=tests_file,
            files=files,
            capabilities=capabilities,
            limits=limits,
            device=device,
            worker_dir=self.folder / "worker",
            # for the fallback's in-process guard (the sandbox shows none of these): the judge's files,
            # and the code that judges, which graded code must not rewrite
            protect=[self.folder / "judge", self.folder / "tests.txt", spec_tests_dir(), grader_dir(), *protect],
            select=select,
            describe=describe,
            seed_file=seed_file,
        )
        self.env = judge_env(sandbox)
        self.proc: subprocess.Popen | forkserver.ForkedJudge | None = None
        self.log_path = self.folder / "judge.log"
        self.started = 0.0
        self.finished_at: float | None = None
        self.stopped: str | None = None
        self._offset = 0
        self._partial = b""
        self.progress: dict[str, dict] = {}
        self.exit_grace_s = EXIT_GRACE_S
        self._cgroup = None  # the judge's own memory group, where one can be made
        self.memory_limit = "none"
        self.fork_failed: str | None = None  # why the fork server did not start this judge, if it did not

    def start(self) -> None:
        self.started = time.monotonic()
        judge_limit = judge_memory_bytes(self.limits.memory_mb)
        command = self.command
        self.memory_limit = "none"
        if judge_limit:
            from spec_tests.harness.remote import cgroup

            self._cgroup = cgroup.create(f"spec-judge-{os.getpid()}-{id(self) % 1000003}", judge_limit)
            if self._cgroup is not None:
                command = self._cgroup.wrap(command)
                self.memory_limit = f"{judge_limit >> 20} MiB (cgroup v2 memory.max)"
        which = judge_rlimit(self.device)
        rlimit = (which, judge_limit) if judge_limit and self._cgroup is None else None
        self.proc = self._fork(rlimit) if self._forkable() else None
        if self.proc is None:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    command,
                    cwd=self.out,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if rlimit is not None:
                try:  # the judge decodes what the worker sends: bound what that can make it allocate
                    resource.prlimit(self.proc.pid, which, (judge_limit, judge_limit))
                except (OSError, ValueError):
                    rlimit = None
        if rlimit is not None:
            name = "RLIMIT_AS" if which == resource.RLIMIT_AS else "RLIMIT_DATA"
            self.memory_limit = f"{judge_limit >> 20} MiB ({name})"

    def _forkable(self) -> bool:
        """Whether this judge is the suite run ``judge_command`` builds (a test may give another command)."""
        return forkserver.enabled() and self.command[:3] == [sys.executable, "-m", "pytest"]

    def _fork(self, rlimit) -> forkserver.ForkedJudge | None:
        """The judge forked from this process's fork server (``forkserver.py``); None: start it plainly."""
        try:
            server = forkserver.server_for({k: v for k, v in self.env.items() if k != "SPEC_SANDBOX"})
            parent = f"--grading-parent-pid={server.pid}"  # the judge dies with the server, which dies with us
            request = {
                "argv": [parent if a.startswith("--grading-parent-pid=") else a for a in self.command[3:]],
                "cwd": os.path.abspath(self.out),  # the server's own working folder is /
                "env": self.env,
                "log": os.path.abspath(self.log_path),
                "cgroup_procs": str(self._cgroup.procs) if self._cgroup is not None else None,
                "rlimit": list(rlimit) if rlimit is not None else None,
            }
            return server.spawn(request)
        except (OSError, ValueError) as exc:
            self.fork_failed = f"{type(exc).__name__}: {exc}"
            return None

    def _release_cgroup(self) -> None:
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> bool:
        """Advance: read new results, enforce the limits. True once the judge is gone."""
        self._read_progress()
        if self.proc.poll() is not None:
            self._read_progress()
            self._release_cgroup()
            return True
        now = time.monotonic()
        if self.finished_at is None and (self.out / FINAL_NAME).exists():
            self.finished_at = now
        if now - self.started > self.limits.run_timeout_s:
            self.kill(f"grading reached its whole-run limit of {self.limits.run_timeout_s:g} s")
            return True
        if self.finished_at is not None and now - self.finished_at > self.exit_grace_s:
            self.kill(None)  # it wrote everything and then did not exit: no loss
            return True
        return False

    def kill(self, reason: str | None) -> None:
        """SIGKILL the judge's whole process group (its worker dies with it: see sandbox.py)."""
        if self.proc is None:
            return
        if reason and self.stopped is None:
            self.stopped = reason
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._release_cgroup()
        self._read_progress()

    def _read_progress(self) -> None:
        path = self.out / PROGRESS_NAME
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                entry = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"] not in self.progress:
                self.progress[entry["id"]] = entry
                if self.on_result is not None:
                    self.on_result(entry["id"], entry.get("status"))

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - chars))
                return clean(f.read().decode("utf-8", "replace"), chars)
        except OSError:
            return ""

    def result(self) -> JudgeResult:
        elapsed = time.monotonic() - self.started
        final = _read_final(self.out / FINAL_NAME)
        entries = final["tests"] if final is not None else self.progress
        verdicts = {tid: v for tid, v in ((tid, _verdict(e)) for tid, e in entries.items()) if v is not None}
        result = JudgeResult(verdicts, elapsed_s=elapsed, stopped=self.stopped)
        if final is not None:
            result.could_not_run = _text_or_none(final.get("could_not_run"))
            result.subject = final.get("subject") if isinstance(final.get("subject"), dict) else {}
            result.described = final.get("described") if isinstance(final.get("described"), dict) else {}
            tail = final.get("worker_log_tail")
            if isinstance(tail, str) and tail.strip():
                result.staff_notes.append("what the submission printed (tail):\n" + clean(tail, 2000))
        else:
            code = self.proc.returncode if self.proc is not None else None
            if result.stopped is None:
                how = _exit_text(code)
                result.stopped = f"the grading process {how} before finishing"
            result.staff_notes.append(f"judge log tail:\n{self.log_tail()}")
        if self.test_ids is not None:
            if result.could_not_run:
                reason = "your implementation could not be loaded (see 'Could not run your implementation')"
            else:
                reason = result.stopped or "the judge did not run this test"
            for tid in self.test_ids:
                if tid not in verdicts:
                    verdicts[tid] = Verdict(Status.NOT_RUN, clean(f"not run: {reason}"))
            for tid in [t for t in verdicts if t not in set(self.test_ids)]:
                del verdicts[tid]  # nothing the grader did not ask for
        return result


def _exit_text(code: int | None) -> str:
    if code is None:
        return "did not end"
    if code < 0:
        try:
            return f"was ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"ended with exit status {code}"


def _read_final(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("finished") is not True:
        return None
    if not isinstance(data.get("tests"), dict):
        return None
    return data


def _text_or_none(value) -> str | None:
    return clean(value) if isinstance(value, str) and value else None


def _verdict(entry) -> Verdict | None:
    if not isinstance(entry, dict) or entry.get("status") not in VERDICTS:
        return None
    root = entry.get("root_cause")
    checks = entry.get("failed_checks")
    return Verdict(
        entry["status"],
        clean(entry.get("message", "")),
        [clean(r, 100) for r in root] if isinstance(root, list) else [],
        [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else [],
    )

"""The judge fork server (spec_grading/forkserver.py): a forked judge is what ``Popen`` gave.

Each request here runs a one-test pytest file (not the suite) that writes what its process sees, so that
the server's promises are checked one by one: a new session, the judge's environment, working folder,
log and memory limit, the server as parent, fresh random state in every judge, the exit status relayed,
and no judge outliving a server that is stopped or a grader that dies.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from spec_grading import forkserver

PROBE = textwrap.dedent(
    """
    import json, os, random, resource, sys

    def test_probe():
        seen = {
            "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
            "cwd": os.getcwd(), "marker": os.environ.get("PROBE_MARKER"), "random": random.random(),
            "as_limit": resource.getrlimit(resource.RLIMIT_AS)[0], "stdin": os.read(0, 10).decode(),
        }
        print("judge says hello")
        with open(os.environ["PROBE_OUT"], "w") as f:
            json.dump(seen, f)
        assert os.environ.get("PROBE_FAIL") != "1"
    """
)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SPEC_"))}
    return {**env, **extra}


def _request(tmp: Path, name: str, **extra) -> dict:
    folder = tmp / name
    folder.mkdir()
    (folder / "test_probe.py").write_text(PROBE)
    env = _env(PROBE_OUT=str(folder / "seen.json"), PROBE_MARKER=name, **extra)
    argv = [str(folder / "test_probe.py"), "-q", "-p", "no:cacheprovider", f"--rootdir={folder}"]
    return {"argv": argv, "cwd": str(folder), "env": env, "log": str(folder / "log.txt"), "cgroup_procs": None}


def _finish(judge: forkserver.ForkedJudge, limit: float = 120) -> int:
    return judge.wait(timeout=limit)


def test_a_forked_judge_is_what_popen_gave(tmp_path):
    server = forkserver.Server(_env())
    try:
        limit = 6 << 30
        first = server.spawn({**_request(tmp_path, "one"), "rlimit": [resource.RLIMIT_AS, limit]})
        second = server.spawn({**_request(tmp_path, "two", PROBE_FAIL="1"), "rlimit": None})
        assert _finish(first) == 0 and _finish(second) == 1  # exit statuses relayed: pytest's 0, and 1 (a failure)
        one = json.loads((tmp_path / "one" / "seen.json").read_text())
        two = json.loads((tmp_path / "two" / "seen.json").read_text())
        assert one["ppid"] == server.pid  # the judge's parent is the server, which dies with the grader
        assert one["sid"] == one["pgid"] == one["pid"]  # a session (and process group) of its own
        assert one["cwd"] == str(tmp_path / "one") and one["marker"] == "one" and two["marker"] == "two"
        assert one["as_limit"] == limit and two["as_limit"] != limit  # each judge's own limit
        assert one["stdin"] == ""  # /dev/null
        assert one["random"] != two["random"]  # reseeded after the fork, as a new interpreter is
        assert "judge says hello" not in (tmp_path / "one" / "log.txt").read_text()  # captured by pytest
        assert "1 passed" in (tmp_path / "one" / "log.txt").read_text()
        assert "1 failed" in (tmp_path / "two" / "log.txt").read_text()
    finally:
        server.stop()


def test_a_stopped_server_leaves_no_judge(tmp_path):
    server = forkserver.Server(_env())
    request = _request(tmp_path, "hang")
    (tmp_path / "hang" / "test_probe.py").write_text("import time\n\ndef test_hang():\n    time.sleep(600)\n")
    judge = server.spawn(request)
    time.sleep(0.5)
    assert judge.poll() is None
    server.stop()
    stop = time.monotonic() + 20
    while _alive(judge.pid) and time.monotonic() < stop:
        time.sleep(0.1)
    assert not _alive(judge.pid)


def test_a_judge_dies_with_a_grader_killed_by_sigkill(tmp_path):
    """The grader is a child process here: it starts a server and a judge, then is SIGKILLed."""
    request = _request(tmp_path, "orphan")
    (tmp_path / "orphan" / "test_probe.py").write_text("import time\n\ndef test_hang():\n    time.sleep(600)\n")
    script = (
        "import json, sys, time\n"
        "from spec_grading import forkserver\n"
        f"server = forkserver.Server({_env()!r})\n"
        f"judge = server.spawn({request!r})\n"
        "print(server.pid, judge.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    grader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid, judge_pid = map(int, grader.stdout.readline().split())
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    stop = time.monotonic() + 20
    while (_alive(server_pid) or _alive(judge_pid)) and time.monotonic() < stop:
        time.sleep(0.1)
    assert not _alive(server_pid) and not _alive(judge_pid)


def test_the_switch_starts_judges_plainly(tmp_path, monkeypatch):
    from spec_grading import judge

    monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    run = judge.JudgeRun(tmp_path / "code", tmp_path / "sub", ["t1"], capabilities=[], limits=judge.Limits())
    assert not run._forkable()
    monkeypatch.setenv(forkserver.ENV_SWITCH, "1")
    assert run._forkable()
    run.command = [sys.executable, "-c", "pass"]  # not the suite: started plainly
    assert not run._forkable()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

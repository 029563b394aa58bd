"""Runs hpcvm command lines for tests/integration/test_hostile_paths.py, fast.

Started once, as the test user, with the Python of the user's hpcvm venv (its text is
passed with ``python -c``: a checkout under /root is not readable by that user). It
imports every hpcvm module once, then for each request on stdin (a JSON line: argv,
environment, working directory) forks a child that runs ``hpcvm.cli.main.main(argv)``
there, exactly what the ``hpcvm`` script runs, with stdin and stdout on /dev/null and
stderr in a file; it answers with a JSON line: the exit code and stderr. An exception
that escapes ``main`` prints its traceback and exits 1, as the interpreter would.
Why: each ``hpcvm`` process spends most of a refusal's second importing; 300 cases
would take minutes, and the walk is meant to be quick.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import signal
import sys
import tempfile
import traceback


def preload() -> None:
    """Import every hpcvm module (and so what they import) before forking."""
    import hpcvm

    for module in pkgutil.walk_packages(hpcvm.__path__, "hpcvm."):
        with contextlib.suppress(Exception):
            importlib.import_module(module.name)


def child(request: dict[str, object], stderr_fd: int) -> None:
    """In the forked child: become the request's process and run hpcvm; never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(stderr_fd, 2)
        os.environ.clear()
        os.environ.update(dict(request["env"]))  # type: ignore[call-overload]
        os.chdir(str(request["cwd"]))
        signal.alarm(int(request["timeout"]))  # type: ignore[call-overload]
        from hpcvm.cli.main import main

        code = main(list(request["argv"]))  # type: ignore[call-overload]
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(request, err.fileno())
            _, status = os.waitpid(pid, 0)
            err.seek(0)
            text = err.read().decode(errors="replace")
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "stderr": text}), flush=True)


if __name__ == "__main__":
    serve()

"""What every bench script shares (no torch import): the commit a result names, and the library's
environment changed within one process.

commit_id(): MXMOE_COMMIT when the caller sets it (a tree without .git, or a device copy whose .git is
another commit's); else `git rev-parse --short HEAD` of this source tree, with "+dirty" when tracked
files differ from it (the device tool's copy carries the last landed commit's .git under the working
tree being tested: without the mark its rows would name a commit that did not run); else `fallback`.
"""
import contextlib
import ctypes
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def commit_id(fallback: str = "not recorded") -> str:
    env = os.environ.get("MXMOE_COMMIT", "").strip()
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                              timeout=10).stdout.strip()
        if not head:
            return fallback
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=HERE, timeout=30).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return fallback


@contextlib.contextmanager
def library_env(env, lib):
    """os.environ updated by `env` (a None value unsets) for the block. libmxmoe reads its MXMOE_*
    variables once per process, so each change is followed by mxmoe_reload_env on `lib` (the caller's
    ctypes handle of libmxmoe). An empty `env` changes nothing."""
    if not env:
        yield
        return
    lib.mxmoe_reload_env.restype = ctypes.c_int
    lib.mxmoe_last_error.restype = ctypes.c_char_p
    saved = {k: os.environ.get(k) for k in env}

    def apply(values):
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if lib.mxmoe_reload_env() != 0:
            raise RuntimeError(f"reload_env: {lib.mxmoe_last_error().decode()}")

    try:
        apply(env)
        yield
    finally:
        apply(saved)


if __name__ == "__main__":
    print(commit_id())

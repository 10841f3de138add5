"""The commit a benchmark result names, for every bench script (no torch import).

commit_id(): MXMOE_COMMIT when the caller sets it (a tree without .git, or a device copy whose .git is
another commit's); else `git rev-parse --short HEAD` of this source tree, with "+dirty" when tracked
files differ from it (the device tool's copy carries the last landed commit's .git under the working
tree being tested: without the mark its rows would name a commit that did not run); else `fallback`.
"""
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


if __name__ == "__main__":
    print(commit_id())

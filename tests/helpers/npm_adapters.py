"""Real ACP adapters from npm, for the tests that drive them: installed once into a cache, or the test skips.

The cache is `$LOOP_HARNESS_NPM_CACHE`, default `~/.cache/loop-harness/npm`; an flock keeps pytest-xdist workers
from installing at once. Without node/npm or the registry the calling test is skipped, saying why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def npm_cache() -> Path:
    return Path(os.environ.get("LOOP_HARNESS_NPM_CACHE") or Path.home() / ".cache/loop-harness/npm")


def npm_adapter(package: str, relative: str) -> Path:
    """`relative` (a file of `package`) under the cache, installing the package first if it is not there."""
    cache = npm_cache()
    target = cache / relative
    if target.exists():
        return target
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        pytest.skip(f"node and npm are needed to install {package} (not on PATH)")
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".install.lock").open("w") as lock:  # pytest-xdist workers install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        try:
            done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), package],
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm install {package} took over 300 s (is the npm registry reachable?)")
    if done.returncode != 0 or not target.exists():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[:6])[:600]
        pytest.skip(f"npm install {package} failed (exit {done.returncode}; is the npm registry reachable?): {tail}")
    return target

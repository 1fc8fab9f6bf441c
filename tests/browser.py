"""A headless browser for the report tests: Debian's `chromium-headless-shell` (apt-get install
chromium-headless-shell). Without it the tests that need one are skipped locally and fail under CI=true."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

from support import unavailable

BROWSER = "chromium-headless-shell"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files", "--hide-scrollbars")


def need_browser() -> str:
    """The browser's path; skips (fails under CI) without one."""
    found = shutil.which(BROWSER)
    if found is None:
        unavailable(f"no {BROWSER} on PATH (apt-get install -y {BROWSER})")
    return found


def _run(browser: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    # A profile of its own: nothing is read from or left in the user's home.
    with tempfile.TemporaryDirectory(prefix="draftscope-browser-") as profile:
        return subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def dump_dom(browser: str, page: Path) -> str:
    """The page's DOM after the browser rendered it."""
    done = _run(browser, "--dump-dom", page.resolve().as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def screenshot(browser: str, page: Path, out: Path, size: tuple[int, int] = (1280, 2400)) -> Path:
    done = _run(browser, f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", page.resolve().as_uri())
    assert done.returncode == 0 and out.is_file(), done.stderr[-2000:]
    return out


def png_facts(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct colours) of a PNG, through Pillow."""
    from PIL import Image

    with Image.open(path) as img:
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
        return rgb.width, rgb.height, len(colours) if colours is not None else 1 << 20


def compressed_ratio(path: Path) -> float:
    """Raw pixel bytes over their zlib size: a blank page compresses hundreds of times."""
    from PIL import Image

    with Image.open(path) as img:
        raw = img.convert("RGB").tobytes()
    return len(raw) / len(zlib.compress(raw, 6))

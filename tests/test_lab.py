"""The README's start command brings up JupyterLab on the course notebooks, and a student can use it:
in a real browser (Debian's Chromium driven by Playwright) the doctor runs through the UI, and a lesson
shows its kernels as code cells."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from course_utils import chromium

# One test process (pytest-xdist) runs this module: its module-scoped fixture
# (the JupyterLab server) is made once.
pytestmark = pytest.mark.xdist_group("test_lab")

ROOT = Path(__file__).resolve().parent.parent
needs_venv = pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "jupyter").exists(),
                                reason="needs the .venv made by the installer")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The README's start command on a free port, without a token; yields its base URL.

    JupyterLab saves a notebook it runs (autosave), which would write outputs into the committed
    notebooks: its settings and workspaces live in a scratch folder here, with autosave off, and the
    notebooks are checked to be byte for byte what they were."""
    scratch = tmp_path_factory.mktemp("jupyterlab")
    settings = scratch / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"autosave": false}')
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"))
    before = {path: path.read_bytes() for path in (ROOT / "notebooks").glob("*.ipynb")}
    port = _free_port()
    cmd = [sys.executable, "-m", "course_utils", "lab", f"--port={port}", "--no-browser",
           "--IdentityProvider.token=", "--ServerApp.password="]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("JupyterLab did not answer within 90 s")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    changed = [path.name for path, data in before.items() if path.read_bytes() != data]
    assert not changed, f"running notebooks in JupyterLab rewrote {changed}"


@needs_venv
def test_lab_serves_the_notebooks(lab):
    with urllib.request.urlopen(f"{lab}/api/contents/notebooks", timeout=10) as r:
        body = r.read().decode()
    assert "00_setup.ipynb" in body and "02_first_kernels.ipynb" in body
    with urllib.request.urlopen(f"{lab}/lab", timeout=10) as r:
        assert r.status == 200 and "JupyterLab" in r.read().decode()


def _open(tab, url: str):
    """Open a notebook in a workspace of its own (no tabs restored from an earlier session) and wait until
    its kernel is idle; accept the kernel dialog if JupyterLab asks which kernel to start."""
    base, _, path = url.partition("/lab/tree/")
    tab.goto(f"{base}/lab/workspaces/test-{uuid.uuid4().hex[:8]}/tree/{path}")
    tab.wait_for_load_state("networkidle")
    tab.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    dialog = tab.locator(".jp-Dialog .jp-mod-accept")
    if dialog.count():
        dialog.first.click()
    tab.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                "#jp-main-statusbar :text('Idle')").first.wait_for(timeout=60_000)


@needs_venv
@pytest.mark.skipif(chromium.available() is not None, reason=str(chromium.available()))
def test_a_student_runs_the_doctor_in_the_browser(lab):
    with chromium.page(width=1400, height=1000) as tab:
        _open(tab, f"{lab}/lab/tree/notebooks/00_setup.ipynb")
        tab.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook is the panel Run All acts on
        tab.get_by_role("menuitem", name="Run", exact=True).click()
        tab.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
        doctor = tab.locator(".jp-OutputArea-output", has_text=re.compile(r"tiny kernel\s+ok"))
        try:
            doctor.first.wait_for(state="attached", timeout=240_000)
        except Exception:
            tab.screenshot(path=str(ROOT / "exports" / "test_lab_doctor.png"))  # exports/ is git-ignored
            outputs = tab.locator(".jp-OutputArea-output").all_text_contents()
            pytest.fail(f"no 'tiny kernel ok' in the page; outputs: {[o[:120] for o in outputs]}")


@needs_venv
@pytest.mark.skipif(chromium.available() is not None, reason=str(chromium.available()))
def test_a_lesson_shows_its_kernels_as_code(lab):
    with chromium.page(width=1400, height=1000) as tab:
        _open(tab, f"{lab}/lab/tree/notebooks/02_first_kernels.ipynb")
        kernels = tab.locator(".jp-CodeCell .jp-InputArea-editor", has_text="@triton.jit")
        kernels.first.wait_for(state="attached", timeout=30_000)
        assert kernels.count() >= 1

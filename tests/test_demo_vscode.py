"""VS Code in `jupyterhub-gpu demo`: a research member chooses it on the spawn form, and
a real code-server renders in headless Chromium, its explorer showing the research
group's dataset; nothing it asks for leaves this machine, and stopping the server
stops code-server.

The demo runs as a subprocess, as the README's command starts it (code-server is
installed, once, before it starts); the test takes from it what it prints and what
a user could see in /proc.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse

import pytest
from playwright.async_api import TimeoutError as PlaywrightTimeout

from browser import log_in
from demo_helpers import Demo, api, cmdline, processes_under, still_running
from jupyterhub_gpu_dev import codeserver
from jupyterhub_gpu_dev.localcluster import sockets
from jupyterhub_gpu_dev.localcluster.cluster import free_port
from kube_helpers import eventually

PASSWORD = "jupyterhub-gpu"
USER = "research-1"
#: a loaded two-core machine: the first start of a server and of VS Code can be slow
SPAWN_TIMEOUT_MS = 240_000
PAGE_TIMEOUT_MS = 90_000
#: what a page may load besides the demo's own address: inline and in-memory content
LOCAL_SCHEMES = ("data:", "blob:", "about:", "vscode-", "chrome-extension:")


@pytest.fixture(scope="module")
def demo(built):
    codeserver.ensure_code_server()  # cached: the demo's own start finds it installed
    running = Demo(free_port())
    try:
        yield running.wait_until_up()
    finally:
        running.make_sure_it_is_gone()


def code_server_processes(demo: Demo) -> dict[int, str]:
    """The demo's processes run from the cached code-server install."""
    install = str(codeserver.install_dir())
    return {
        pid: started
        for pid, started in processes_under(demo.process.pid).items()
        if install in cmdline(pid)
    }


def off_machine(urls: list[str]) -> list[str]:
    """The URLs that are neither the loopback interface nor inline content."""
    far = []
    for url in urls:
        if url.startswith(LOCAL_SCHEMES):
            continue
        host = urllib.parse.urlsplit(url).hostname or ""
        if not (host == "localhost" or sockets.is_loopback(f"{host}:0")):
            far.append(url)
    return far


def explorer_row(page, name: str):
    """The explorer's row for ``name`` (a file or folder shown in the tree)."""
    return page.locator(".explorer-folders-view .monaco-list-row").filter(
        has=page.locator(".monaco-icon-label", has_text=re.compile(rf"^{re.escape(name)}$"))
    )


async def open_dataset_folder(page) -> None:
    """Expand data/ and data/research/ in the explorer. VS Code shows a folder whose only
    child is a folder as one row ("data/research") once it knows its children."""
    await explorer_row(page, "data").first.click()
    readme, research = explorer_row(page, "README.md"), explorer_row(page, "research")
    await readme.or_(research).first.wait_for()
    if await readme.count() == 0:
        await research.first.click()


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_research_member_opens_vs_code_with_the_research_data(browser, demo):
    banner = demo.output
    assert f'VS Code in the browser: as {USER}, start "Research" with Open: VS Code' in banner
    assert f"{demo.url}/user/{USER}/vscode/" in banner
    token = demo.wait_for(r"JUPYTERHUB_API_TOKEN=(\S+)", timeout=5).group(1)

    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    requested: list[str] = []
    context.on("request", lambda request: requested.append(request.url))
    page = await context.new_page()
    page.on("websocket", lambda socket: requested.append(socket.url))
    try:
        await log_in(page, demo.url, USER, PASSWORD)
        form = await page.inner_text("#spawn_form")
        assert "data: Research data at /data/research (read-only)" in form
        await page.check("#profile-item-research--research")
        interface = "select[name='profile-option-research--research--interface']"
        assert await page.eval_on_selector_all(
            f"{interface} option", "options => options.map(o => o.textContent.trim())"
        ) == ["JupyterLab", "VS Code"]
        await page.select_option(interface, "vscode")
        await page.click("#spawn_form button[type=submit]")
        try:
            # through spawn-pending to the server's default URL: VS Code, not JupyterLab
            await page.wait_for_url(f"{demo.url}/user/{USER}/vscode/**", timeout=SPAWN_TIMEOUT_MS)
            await page.wait_for_selector(".monaco-workbench", timeout=SPAWN_TIMEOUT_MS)
        except PlaywrightTimeout:
            log = (demo.hub_dir / "jupyterhub.log").read_text(errors="replace")[-4000:]
            raise AssertionError(
                f"VS Code did not render; the page is {page.url}:\n"
                f"{await page.inner_text('body')}\n\nthe hub log ends:\n{log}"
            ) from None
        # the explorer shows the server's home, with the dataset where it is mounted
        await open_dataset_folder(page)
        await explorer_row(page, "sample.csv").first.wait_for()
        await explorer_row(page, "README.md").first.dblclick()
        tab = page.locator(".tabs-container .tab", has_text="README.md")
        await tab.wait_for()
        editor = page.locator(".editor-instance .view-lines")
        await editor.filter(has_text="Research data").wait_for()
        assert "127.0.0.1:/export/research" in await editor.inner_text()
        await asyncio.sleep(3)  # what the workbench asks for once it has settled
    finally:
        await context.close()

    assert off_machine(requested) == [], off_machine(requested)
    assert any("/vscode/" in url for url in requested), requested[:20]

    # code-server runs under the demo (pod runner, server, jupyter-server-proxy), on loopback
    running = code_server_processes(demo)
    assert running, [cmdline(pid) for pid in processes_under(demo.process.pid)]
    listening = [a for found in sockets.listening_addresses(list(running)).values() for a in found]
    assert listening, "code-server listens on no address"
    assert [a for a in listening if not sockets.is_loopback(a)] == []

    status, body = await asyncio.to_thread(api, demo, token, "DELETE", f"/users/{USER}/server")
    assert status in (202, 204), body

    async def gone():
        return still_running(running) == []

    await eventually(gone, "code-server's processes to end with the server", within=60)
    assert code_server_processes(demo) == {}
    # the dataset's link goes with the server; the data stays in the demo's state folder
    home = demo.cluster_dir / "pods" / "homes" / f"default_{USER}"
    export = demo.cluster_dir / "nfs" / "127.0.0.1" / "export" / "research"

    async def unlinked():
        return not (home / "data").exists()

    await eventually(unlinked, "the dataset's link to go with the server", within=60)
    assert (export / "README.md").is_file()


def test_without_code_server_the_demo_says_why_vs_code_will_not_open_and_goes_on(
    tmp_path, monkeypatch, capsys
):
    """A machine that cannot install code-server (here: no ripgrep) still runs the demo."""
    from jupyterhub_gpu.cli import dev_commands

    real_which = codeserver.shutil.which
    monkeypatch.setenv("JUPYTERHUB_GPU_CACHE", str(tmp_path))  # nothing installed there
    monkeypatch.setattr(
        codeserver.shutil, "which", lambda name: None if name == "rg" else real_which(name)
    )
    dev_commands._demo_servers_can_run()  # no error: the demo would start
    said = capsys.readouterr().err
    assert (
        "jupyterhub-gpu demo: VS Code will not open in the demo's servers (the rest of the "
        "demo runs): code-server 4.100.3 cannot be installed here; missing: `rg` "
        "(apt-get install ripgrep)"
    ) in said, said
    assert codeserver.installed_bin_dir() is None

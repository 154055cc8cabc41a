"""The dashboard in a real browser: Playwright driving the distribution's Chromium (`apt-get
install chromium`, done by `make test` through scripts/browser.sh) against a real API server on
the real log. The grid shows the fleet, a submitted job appears and turns running without a
reload, its page shows its timeline, and a team's token does not see another team's jobs.

GANGWAY_SCREENSHOT=PATH stores a screenshot of the admin's view there (docs/dashboard.png).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from schemas.base import Event
from schemas.jobs import JobAdmitted, TaskStarted
from services.runtime import EventStore, Settings
from tests.api.builders import node, reserved

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser(api_url: str, settings: Settings) -> Iterator[Browser]:
    """Started after the async fixtures: Playwright's sync API holds an event loop in this
    thread while it runs."""
    assert CHROMIUM, "the distribution's chromium is missing (scripts/browser.sh installs it)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def append(settings: Settings, stream: str, version: int, events: list[Event]) -> None:
    async def write() -> None:
        store = await EventStore.connect(settings)
        try:
            await store.append(stream, version, events)
        finally:
            await store.close()

    # Playwright's sync API keeps an event loop in this thread: the write runs in another.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, write()).result()


def open_dashboard(browser: Browser, url: str, token: str) -> Page:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    expect(page.locator("#live")).to_have_text("live")
    return page


def test_the_dashboard_shows_the_fleet_and_jobs_live_and_keeps_teams_apart(
    api_url: str, settings: Settings, browser: Browser
) -> None:
    admin_token = os.environ["GANGWAY_TOKEN"]
    admin = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {admin_token}"})
    tokens = {
        team: admin.post("/v1/teams", json={"name": team, "guaranteed_gpus": 8}).json()["token"]
        for team in ("nlp", "vision")
    }
    for index, rack in enumerate(("r1", "r1", "r2", "r2")):
        append(settings, f"node-n{index}", 0, [node(f"n{index}", rack=rack, block="b1")])

    page = open_dashboard(browser, api_url, admin_token)
    expect(page.locator(".gpu")).to_have_count(32)  # 4 nodes of 8 GPUs
    expect(page.locator(".rack")).to_have_count(2)

    def submit(team: str, gpus: int) -> str:
        spec = {"name": f"{team}-train", "team": team, "tasks": 1, "gpus_per_task": gpus}
        headers = {"Authorization": f"Bearer {tokens[team]}"}
        response = admin.post("/v1/jobs", json=spec, headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    nlp_job = submit("nlp", 4)
    expect(page.locator(f'#waiting [data-job-row="{nlp_job}"]')).to_be_visible()
    append(
        settings,
        f"job-{nlp_job}",
        1,
        [
            JobAdmitted(job_id=nlp_job, queue="nlp", priority="research"),
            reserved(nlp_job, [("n0", [0, 1, 2, 3])]),
            TaskStarted(job_id=nlp_job, attempt=1, rank=0, node_id="n0"),
        ],
    )
    # No reload: the stream redraws the queue and the grid.
    expect(
        page.locator(f'#running [data-job-row="{nlp_job}"][data-state="running"]')
    ).to_be_visible()
    expect(page.locator(f'.gpu[data-job="{nlp_job}"]')).to_have_count(4)
    vision_job = submit("vision", 2)
    expect(page.locator(f'#waiting [data-job-row="{vision_job}"]')).to_be_visible()

    page.click(f'#running [data-job-link="{nlp_job}"]')
    expect(page.locator('#job-timeline li[data-type="GangReserved"]')).to_be_visible()
    expect(page.locator("#job-facts")).to_contain_text("research")
    page.click("#job-close")
    if os.environ.get("GANGWAY_SCREENSHOT"):
        page.screenshot(path=str(Path(os.environ["GANGWAY_SCREENSHOT"])), full_page=True)

    theirs = open_dashboard(browser, api_url, tokens["vision"])
    expect(theirs.locator(f'#waiting [data-job-row="{vision_job}"]')).to_be_visible()
    expect(theirs.locator(".gpu.allocated")).to_have_count(4)  # taken, by whom is not theirs
    assert nlp_job not in theirs.content()
    assert theirs.locator(f'[data-job="{nlp_job}"]').count() == 0

    page.click("#logout")
    page.fill("#token", "not-a-token")
    page.click("#login button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("not accepted")
    admin.close()

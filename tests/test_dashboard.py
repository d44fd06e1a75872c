"""The dashboard as a user sees it: a real `gandiva server`, real jobs, a real browser.

Debian's Chromium, driven by Playwright, signs in with the token `gandiva user add` printed
and watches three one-device jobs share two slots: time-sliced, then (a second server)
packed.
"""

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pw = pytest.importorskip("playwright.sync_api")
from serving import PACED, running  # noqa: E402
from waiting import until  # noqa: E402

expect = pw.expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
CNN = Path(__file__).resolve().parents[1] / "examples" / "cnn.py"
WAIT_MS = 60_000  # generous: the server, three jobs and a browser share the machine's cores
# The test policy (these tests are about what the map shows, not about a policy's tuning):
# the three jobs take turns of 3 s for as long as they run; with packing, the job that waits
# after its first turn is packed beside one that runs, and the pair stays packed
TIME_SLICING = "slicer:quantum=3"
PACKING = "slicer:quantum=3:pack"

# one server and one browser for the file, on one worker
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM}"),
              pytest.mark.xdist_group("dashboard")]


@dataclass
class Server:
    url: str
    token: str
    home: Path

    def client(self):
        import httpx2

        return httpx2.Client(base_url=self.url, timeout=10,
                             headers={"Authorization": f"Bearer {self.token}"})


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    """`gandiva user add alice`, then `gandiva server`, as a user starts them."""
    policy = getattr(request, "param", TIME_SLICING)
    home = tmp_path_factory.mktemp("dashboard") / "home"
    with running(home, users=("alice",), policy=policy) as srv:
        yield Server(srv.url, srv.tokens["alice"], home)


@pytest.fixture(scope="module")
def jobs(server):
    """Three one-device jobs on the server's two slots, running until the server stops
    them (they wait rather than compute: the browser and the server keep the cores)."""
    (server.home / "users" / "alice" / "paced.py").write_text(PACED)
    with server.client() as http:
        return [http.post("/v1/jobs", json={"name": f"paced{i}", "command":
                                            ["python", "paced.py"]}
                          ).raise_for_status().json()["id"] for i in range(3)]


@pytest.fixture(scope="module")
def browser():
    with pw.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh browser profile (empty storage); fails the test on any script error or
    anything the page's Content-Security-Policy refused."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # what the server's Content-Security-Policy refused (a style attribute, a foreign script)
    page.on("console", lambda m: "Content Security Policy" in m.text and errors.append(m.text))
    page.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    yield page
    context.close()
    assert not errors, errors


def sign_in(page, server: Server, token: str | None = None) -> None:
    page.goto(server.url)
    page.fill("#token-input", token or server.token)
    page.click("#token-form button[type=submit]")


def wait_for_event(server: Server, jobs: list[str], kind: str, timeout: float = 60) -> str:
    """The first of ``jobs`` to have an event of ``kind``."""
    with server.client() as http:
        return until(lambda: next((job for job in jobs if any(
            e["kind"] == kind for e in http.get(f"/v1/jobs/{job}/events").json())), None),
            timeout, f"a job {kind}", every=0.5)


def events_of(server: Server, jobs: list[str]) -> str:
    """What happened to ``jobs``, one event a line, for a failing test's message."""
    with server.client() as http:
        events = [(e["at"], job, e["kind"], e["data"].get("devices", ""))
                  for job in jobs for e in http.get(f"/v1/jobs/{job}/events").json()]
    return "\n".join(f"{at:.2f} {job} {kind} {devices}" for at, job, kind, devices
                     in sorted(events, key=lambda e: e[:3])  # (devices: a list or "")
                     if kind not in ("profile", "feedback"))


def test_the_token_is_asked_once_kept_and_asked_again_when_refused(server, page):
    sign_in(page, server, token="not-a-token")
    expect(page.locator("#token-error")).to_contain_text("401")
    expect(page.locator("#dashboard")).to_be_hidden()

    sign_in(page, server)
    expect(page).to_have_url(re.compile(r"/ui/"))
    expect(page.locator("#dashboard")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text("alice")
    expect(page.locator("#no-jobs")).to_be_visible()

    page.reload()  # the token is kept, for the tab's life (not on disk): no form
    expect(page.locator("#whoami")).to_have_text("alice")
    expect(page.locator("#token-form")).to_be_hidden()
    assert page.evaluate("localStorage.getItem('gandiva.token')") is None
    assert page.evaluate("sessionStorage.getItem('gandiva.token')") == server.token

    page.evaluate("sessionStorage.setItem('gandiva.token', 'revoked')")
    page.reload()  # a kept token the server refuses: the form again
    expect(page.locator("#token-form")).to_be_visible()
    expect(page.locator("#token-error")).to_contain_text("401")
    expect(page.locator("#dashboard")).to_be_hidden()


def test_while_jobs_take_turns_the_table_and_map_show_who_waits_and_why(server, jobs, page):
    sign_in(page, server)
    for job in jobs:
        row = page.locator(f'#jobs tr[data-job="{job}"]')
        expect(row).to_contain_text(job)
        expect(row).to_have_attribute("data-state", re.compile("queued|running|suspended"))
    # three jobs, two devices: each device runs one, the third waits its turn on the node
    expect(page.locator("#gpu-map [data-device]")).to_have_count(2)
    sliced = page.locator("#gpu-map .time-sliced [data-job]")
    expect(sliced).to_have_count(1)
    assert sliced.get_attribute("data-job") in jobs
    expect(page.locator("#gpu-map [data-device] [data-job]")).to_have_count(2)
    waiting = page.locator('#jobs tr[data-state="suspended"] td.why')
    expect(waiting.first).to_contain_text("time-sliced: its server is over-subscribed")
    running = page.locator('#jobs tr[data-state="running"] td.why')
    expect(running.first).to_contain_text(re.compile(r"running on device\(s\) \d"))


def test_the_utilisation_chart_draws_the_samples(server, jobs, page):
    sign_in(page, server)
    chart = page.locator("#utilisation svg")
    expect(chart).to_have_attribute("data-samples", re.compile(r"^[1-9]\d*$"))
    expect(chart.locator('path[data-series="allocated"]')).to_have_attribute("d", re.compile("^M"))
    expect(page.locator("#utilisation .legend")).to_contain_text("now 2 of 2 allocated")


def test_the_shares_chart_draws_what_the_user_received_against_the_fair_share(server, jobs,
                                                                              page):
    """alice is in no team: she sees her own share, under "-"."""
    sign_in(page, server)
    chart = page.locator("#shares svg")
    expect(chart).to_have_attribute("data-teams", "1")
    for kind in ("received", "fair"):
        expect(chart.locator(f'path[data-team="-"][data-kind="{kind}"]')).to_have_attribute(
            "d", re.compile("^M"))
    expect(page.locator("#shares .legend")).to_contain_text(re.compile(r"-: \d+\.\d\d of"))


def test_clicking_a_job_shows_its_timeline_of_running_and_suspended(server, jobs, page):
    sliced = wait_for_event(server, jobs, "suspended")
    sign_in(page, server)
    page.click(f'#jobs tr[data-job="{sliced}"]')
    expect(page.locator("#detail-title")).to_contain_text(sliced)
    expect(page.locator("#explain")).to_contain_text(re.compile("time-sliced|running on"))
    timeline = page.locator("#timeline svg")
    expect(timeline.locator('[data-segment="running"]').first).to_be_visible()
    expect(timeline.locator('[data-segment="suspended"]').first).to_be_visible()
    expect(page.locator('#events li[data-kind="suspended"]').first).to_be_visible()


@pytest.mark.parametrize("server", [PACKING], indirect=True)
def test_once_two_jobs_are_packed_the_map_shows_them_on_one_device(server, jobs, page):
    sign_in(page, server)
    packed = page.locator('#gpu-map [data-device][data-mode="packed"]')
    try:
        expect(packed.locator("[data-job]")).to_have_count(2)
    except AssertionError as e:
        raise AssertionError(f"{e}\nthe jobs' events:\n{events_of(server, jobs)}") from None
    assert {packed.locator("[data-job]").nth(i).get_attribute("data-job")
            for i in range(2)} <= set(jobs)
    expect(page.locator("#jobs td.why", has_text="packed with").first).to_be_visible()


def test_the_job_table_shows_the_newest_page_and_older_ones_on_demand(server, jobs, page):
    page.goto(server.url)
    page.evaluate("localStorage.setItem('gandiva.jobsPage', '2')")  # pages of two jobs
    sign_in(page, server)
    rows = page.locator("#jobs tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_attribute("data-job", jobs[-1])  # newest first
    page.click("#older-jobs")
    expect(rows).to_have_count(3)
    expect(rows.last).to_have_attribute("data-job", jobs[0])
    expect(page.locator("#older-jobs")).to_be_hidden()  # no more pages


@pytest.mark.parametrize("server", ["slicer:quantum=2"], indirect=True)
def test_a_sweeps_learning_curves_grey_its_paused_trials_and_a_trial_opens_its_own(server,
                                                                                   page):
    shutil.copy(CNN, server.home / "users" / "alice" / "cnn.py")
    with server.client() as http:
        sweep = http.post("/v1/sweeps", json={
            "name": "lr", "command": "python cnn.py --steps 1200 --lr {lr} --seed 1",
            "space": {"lr": {"grid": [0.00001, 0.05, 0.0001, 0.1]}}, "metric": "loss",
            "stop": {"rule": "asha", "rungs": [40, 120], "reduction": 2}}
        ).raise_for_status().json()
    sign_in(page, server)
    expect(page.locator("#sweep-select")).to_have_value(sweep["id"])
    lines = page.locator("#sweep-curves svg path[data-trial]")
    expect(lines).to_have_count(4)
    out = page.locator('#sweep-curves path[data-decision="paused"], '
                       '#sweep-curves path[data-decision="stopped"]')
    expect(out.first).to_have_class(re.compile(r"\bstopped\b"))  # grey
    expect(out.first).to_have_attribute("d", re.compile(r"^M[\d.]+,[\d.]+L"))
    expect(page.locator("#sweep-summary")).to_contain_text(
        re.compile(r"[1-9] paused or stopped"))
    running = page.locator('#sweep-curves path[data-trial]:not(.stopped)').first
    job = running.get_attribute("data-job")
    running.dispatch_event("click")
    expect(page.locator("#detail-title")).to_contain_text(job)
    curve = page.locator('#curve svg[data-metric="loss"] path[data-metric="loss"]')
    expect(curve).to_have_attribute("d", re.compile(r"^M[\d.]+,[\d.]+L"))

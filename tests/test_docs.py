"""The documentation site (``paper/conf.py``): every committed figure is shown by a report page,
the strict build passes, and the built site works in a real browser.

The strict build is README's command, ``sphinx-build -W --keep-going -b html paper OUT``: any
warning (a broken link, a missing figure, a failing tutorial cell, a malformed docstring) fails
it. It needs the ``docs`` extra and skips without it. The browser test (``slow``) also needs
Debian's ``chromium`` and ``chromium-driver`` and skips with the reason where they are absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "paper"
FIGURES = REPO / "figures" / "out"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def report_pages() -> list[Path]:
    return sorted(p for p in PAPER.rglob("*.md") if "_build" not in p.parts)


def embedded_figures() -> dict[Path, list[Path]]:
    """Figure file -> the report pages whose Markdown shows it (``![alt](path)``)."""
    shown: dict[Path, list[Path]] = {}
    for page in report_pages():
        for link in IMAGE.findall(page.read_text(encoding="utf-8")):
            shown.setdefault((page.parent / link).resolve(), []).append(page)
    return shown


def committed_pngs() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "figures/out/*.png"], cwd=REPO, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: the committed figures are not known")
    return [(REPO / line).resolve() for line in out.stdout.split()]


def test_every_committed_figure_is_shown_and_every_shown_figure_exists():
    shown = embedded_figures()
    missing = {str(f.relative_to(REPO)): [p.name for p in pages] for f, pages in shown.items()
               if not f.is_file()}
    assert not missing, f"report pages show figures that do not exist: {missing}"
    outside = [str(f) for f in shown if FIGURES not in f.parents and PAPER not in f.parents]
    assert not outside, f"figures must come from figures/out/: {outside}"
    not_shown = [f.name for f in committed_pngs() if f not in shown]
    assert not not_shown, f"committed figures that no report page shows: {not_shown}"


def build_site(out: Path) -> subprocess.CompletedProcess:
    """README's strict build into ``out`` (doctrees and notebook outputs beside it). The
    configuration documents and executes this checkout, whatever is installed."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
         "-d", str(out.parent / "doctrees"), str(PAPER), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("sphinx", reason="the docs extra is not installed "
                                         "(pip install -e '.[docs]')")
    pytest.importorskip("myst_nb", reason="the docs extra is not installed")
    out = tmp_path_factory.mktemp("docs") / "html"
    result = build_site(out)
    assert result.returncode == 0, (
        f"strict docs build failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    return out


def test_strict_build_shows_report_figures_tutorial_and_api(site):
    images = {p.name for p in (site / "_images").iterdir()}
    for figure in embedded_figures():
        assert figure.name in images, f"{figure.name} is not in the built site"
    for page in report_pages():
        html = site / page.relative_to(PAPER).with_suffix(".html")
        assert html.is_file(), f"no page built for {page.relative_to(REPO)}"
    # the tutorial ran: its figure is an executed output, not a file of the repository
    tutorial = (site / "tutorial_rank_width.html").read_text(encoding="utf-8")
    assert re.search(r'<img [^>]*src="_images/[0-9a-f]{20,}\.png"', tutorial), \
        "the tutorial's figure was not produced by executing it"
    assert "trained / optimum - 1" in tutorial
    api = (site / "api.html").read_text(encoding="utf-8")
    for name in ("excess_risk", "MLPResNet", "ModelConfig"):
        assert re.search(rf'id="dca_theory\.([a-z_.]+\.)?{name}"', api), \
            f"{name} has no entry on the API page"
    # math is rendered by the bundled MathJax, never by a CDN
    theory = (site / "01_theory.html").read_text(encoding="utf-8")
    assert 'src="_static/mathjax/tex-chtml.js' in theory
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', theory)
    assert not [s for s in scripts if "//" in s], f"remote scripts: {scripts}"


# --- the built site in headless Chromium ------------------------------------------------------

SEARCH_WORD = "perplexity"  # a word of chapter 5 and of the README
SCREENSHOT_PAGE = "01_theory.html"  # Figure 5 among the G1/G2 formulas
SCREENSHOT_FIGURE = "fig5_gain_lower_bounds.png"

# Raw TeX left in visible text outside code and formulas: any $ (a formula whose dollars
# Markdown did not pair, e.g. one broken by a line that starts with "- "), \( or \[ (MathJax
# removes both), or a TeX command such as \bar.
RAW_MATH_JS = r"""
const walker = document.createTreeWalker(document.querySelector('article') || document.body,
                                         NodeFilter.SHOW_TEXT);
const skip = el => el.closest('pre, code, script, style, mjx-container, .highlight');
const raw = [];
for (let n = walker.nextNode(); n; n = walker.nextNode()) {
  if (skip(n.parentElement)) continue;
  const t = n.textContent;
  if (/\$|\\[(\[]|\\[a-zA-Z]{2,}/.test(t)) raw.push(t.trim().slice(0, 80));
}
return raw;
"""
TYPESET_JS = r"""
const math = [...document.querySelectorAll('.math')];
return {math: math.length,
        typeset: math.filter(m => m.querySelector('mjx-container')).length,
        containers: document.querySelectorAll('mjx-container').length};
"""
IMAGES_JS = r"""
return [...document.images].map(i => ({src: i.getAttribute('src'), complete: i.complete,
                                        width: i.naturalWidth}));
"""
MATHJAX_DONE_JS = r"""
const done = arguments[arguments.length - 1];
if (!document.querySelector('.math')) { done('no math'); return; }
const wait = () => (window.MathJax && MathJax.startup && MathJax.startup.promise)
  ? MathJax.startup.promise.then(() => done('ok'), e => done('error: ' + e))
  : setTimeout(wait, 50);
wait();
"""


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium "
                    "chromium-driver)")
    return browser, driver


@pytest.fixture(scope="module")
def served(site):
    """The built site on a free port of 127.0.0.1, for the length of the module."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(monkeypatch_module):
    browser_path, driver_path = chromium_paths()
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (docs extra) is "
                                                                 "not installed")
    monkeypatch_module.setenv("SE_OFFLINE", "true")  # never let Selenium fetch a driver
    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1400"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=driver_path))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def severe_console_entries(driver) -> list[str]:
    # Chromium asks every server for /favicon.ico by itself; the site has none and names none.
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]]


def open_page(driver, url: str) -> None:
    driver.get(url)
    state = driver.execute_async_script(MATHJAX_DONE_JS)
    assert state in ("ok", "no math"), f"{url}: MathJax {state}"


@pytest.mark.slow
def test_site_in_headless_chromium(site, served, browser, tmp_path):
    pages = [p.relative_to(PAPER).with_suffix(".html").as_posix() for p in report_pages()]
    pages += ["index.html", "api.html"]
    typeset_total = 0
    for page in pages:
        open_page(browser, f"{served}/{page}")
        math = browser.execute_script(TYPESET_JS)
        assert math["typeset"] == math["math"], f"{page}: {math} (untypeset math)"
        typeset_total += math["containers"]
        raw = browser.execute_script(RAW_MATH_JS)
        assert not raw, f"{page}: raw TeX left in the text: {raw[:5]}"
        broken = [i for i in browser.execute_script(IMAGES_JS)
                  if not i["complete"] or i["width"] == 0]
        assert not broken, f"{page}: images that did not load: {broken}"
        errors = severe_console_entries(browser)
        assert not errors, f"{page}: console errors: {errors}"
    assert typeset_total > 500, f"only {typeset_total} typeset formulas in the whole report"

    # a report page with a figure among typeset formulas, as a reader sees it
    open_page(browser, f"{served}/{SCREENSHOT_PAGE}")
    figure = browser.find_element("css selector", f'img[src$="{SCREENSHOT_FIGURE}"]')
    # instant: the theme scrolls smoothly, and the screenshot must not catch it half-way
    browser.execute_script(
        "arguments[0].scrollIntoView({block: 'center', behavior: 'instant'});", figure)
    assert browser.execute_script("return window.scrollY;") > 0
    shot = tmp_path / "report_page.png"
    assert browser.save_screenshot(str(shot))
    (PAPER / "_build").mkdir(exist_ok=True)
    shutil.copyfile(shot, PAPER / "_build" / "screenshot.png")

    # the search box answers a query
    open_page(browser, f"{served}/index.html")
    box = browser.find_element("css selector", "input[name='q']")
    box.send_keys(SEARCH_WORD)
    box.submit()
    from selenium.webdriver.support.ui import WebDriverWait

    hits = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements("css selector", "#search-results ul.search li"))
    assert len(hits) >= 1 and "search.html" in browser.current_url
    errors = severe_console_entries(browser)
    assert not errors, f"search page: console errors: {errors}"

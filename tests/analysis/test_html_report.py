"""The HTML reports (issue 17), opened in a real browser: Debian's chromium driven by playwright.

The pages of the example recipes are checked against the JSON documents the same runs print and
against torch's own reading of the source checkpoint; hostile names are written with the
`safetensors` library. Every wait is on an element or attribute the page sets (never a sleep).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tests.support.browser as browsers
from migrator.analysis.html_report import MAX_DEPTH, diff_page, inspect_page, plan_page
from migrator.cli import main
from tests.support.recipes import ORDER  # every example recipe, in an order that makes their inputs

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "</script><img src=x onerror=alert(1)>"  # no dot: one segment of a name


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def migrate(*args: str, check: bool = True) -> Done:
    """The command line, in this process (an interpreter start per call would cost more than the call)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(list(args))
    done = Done(code, out.getvalue(), err.getvalue())
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Every example recipe run once on fresh demo data: its HTML report and its JSON report
    (`run --json` prints the same document `--report` writes)."""
    root = tmp_path_factory.mktemp("workspace")
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    subprocess.run([sys.executable, str(REPO / "recipes" / "generate_demo_data.py"), str(root / "demo-out")],
                   check=True, capture_output=True)
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    for name in ORDER:
        html = root / f"{name}.html"
        done = migrate("run", str(root / "recipes" / f"{name}.yaml"), "--no-progress", "--json", "--report", str(html))
        out[name] = (html, json.loads(done.stdout)["report"])
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    why = browsers.missing()
    if why:
        pytest.skip(why)
    # Tall enough that every row of the tests' small pages is on screen: rows off screen skip layout
    # (content-visibility: auto), and their inner_text would depend on where they fall.
    with browsers.chromium(tmp_path_factory.mktemp("chromium-profile"),
                                  viewport={"width": 1200, "height": 8000}) as context:
        yield context


@dataclass
class Opened:
    page: Any
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def count(self, key: str) -> int:
        return int(self.page.locator(f'.counts [data-key="{key}"] .n').inner_text().replace(",", ""))

    def rows(self) -> list[str]:
        """The full target names of the tensor rows in the DOM."""
        names = self.page.eval_on_selector_all("#tree li.tensor", "els => els.map(e => e.dataset.name)")
        return [str(n) for n in names]

    def filter(self, text: str) -> None:
        self.page.fill("#filter", text)
        settle(self.page)
        self.page.wait_for_selector(f"#tree[data-query={json.dumps(text.strip().lower())}]", state="attached")


@pytest.fixture
def opener(browser: Any) -> Iterator[Any]:
    pages: list[Opened] = []

    def open_page(path: Path) -> Opened:
        opened = Opened(browser.new_page())
        # a bound on a hang, not a speed: 10 s was once too short for a full-page screenshot with both
        # cores busy (a test failed under load), and the checks wait for states, never for time
        opened.page.set_default_timeout(180_000)
        opened.page.on("pageerror", lambda e: opened.errors.append(str(e)))
        opened.page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
        opened.page.on("request", lambda r: opened.requests.append(r.url))
        opened.page.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))
        opened.page.goto(path.resolve().as_uri())
        opened.page.wait_for_selector("body[data-ready]", state="attached")
        pages.append(opened)
        return opened

    yield open_page
    for opened in pages:
        assert opened.errors == []
        assert opened.requests == [opened.page.url]  # the page itself, nothing else fetched
        opened.page.close()


def _module(page: Any, path: str) -> Any:
    return page.locator(f"#tree li.mod[data-path={json.dumps(path)}]")


def _toggle(page: Any, path: str) -> Any:
    """The expand/collapse button of the module at `path`."""
    return _module(page, path).locator(":scope > .line > .tog")


def _meta_count(text: str) -> int:
    m = re.match(r"([\d,]+) tensors?", text)
    assert m, text
    return int(m.group(1).replace(",", ""))


@pytest.mark.parametrize("name", ORDER)
def test_example_recipe_reports_show_the_json_counts(reports: dict[str, tuple[Path, dict[str, Any]]], opener: Any,
                                                     name: str, tmp_path: Path) -> None:
    html, doc = reports[name]
    opened = opener(html)
    page = opened.page
    for key in ("applied", "skipped", "missing", "unused", "errors"):
        assert opened.count(key) == len(doc[key]), key
    # the tree's top level: the first segments of every target name the report has, each module's
    # count the names below it
    targets = set(doc["applied"]) | {m["path"] for m in doc["missing"]}
    roots = page.locator("#tree > li.mod")
    # text_content, not inner_text: a module line is `content-visibility: auto`, so until a frame has
    # laid it out (or while it is off screen) its inner text is empty; the words are there either way
    shown = {roots.nth(i).locator(":scope > .line .seg").text_content():
             _meta_count(roots.nth(i).locator(":scope > .line .meta").text_content() or "")
             for i in range(roots.count())}
    expected: dict[str, int] = {}
    for t in targets:
        if "." in t:
            expected[t.split(".", 1)[0]] = expected.get(t.split(".", 1)[0], 0) + 1
    assert shown == expected
    assert opened.rows() == sorted(t for t in targets if "." not in t)  # top-level tensors (none here)
    # self-contained: nothing to fetch, nothing that could
    assert page.evaluate("document.querySelectorAll('[src], [href], link, iframe, object').length") == 0
    policy = page.get_attribute('meta[http-equiv="Content-Security-Policy"]', "content") or ""
    assert "default-src 'none'" in policy and "unsafe" not in policy
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _torch_keys(path: Path) -> list[str]:
    torch = pytest.importorskip("torch")
    return list(torch.load(str(path), map_location="cpu", weights_only=True).keys())


def settle(target: Any) -> None:
    """Wait until the page has rendered a frame after an action: rows it just created are laid out
    (or skipped, off screen, by content-visibility) only then, and inner_text depends on it."""
    page = getattr(target, "page", target)
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")


def shown_text(locator: Any) -> str:
    """An element's inner text once it is on screen and a frame has laid it out: tensor rows and module
    lines are `content-visibility: auto`, so a row not yet laid out (a busy machine, a long page) has an
    empty inner text although its words are in the page."""
    locator.scroll_into_view_if_needed()
    settle(locator.page)
    return str(locator.inner_text())


def test_expand_a_module_by_click_and_by_keyboard(reports: dict[str, tuple[Path, dict[str, Any]]], opener: Any,
                                                  tmp_path: Path) -> None:
    html, doc = reports["bert-to-burn"]
    sources = [k for k in _torch_keys(html.parent / "demo-out" / "tiny-bert.pt") if k != "embeddings.position_ids"]
    opened = opener(html)
    page = opened.page
    assert opened.rows() == []  # collapsed modules have no rows in the DOM yet
    encoder = _toggle(page, "encoder")
    assert encoder.get_attribute("aria-expanded") == "false"
    encoder.click()
    settle(encoder)
    page.wait_for_selector("#tree > li.mod > .line > .tog[aria-expanded=true]")
    assert _toggle(page, "encoder.layers").is_visible()
    assert opened.rows() == []  # one level at a time
    # keyboard: Enter on the focused button, then arrows and Space
    emb = _toggle(page, "embeddings")
    emb.focus()
    page.keyboard.press("Enter")
    settle(page)
    assert emb.get_attribute("aria-expanded") == "true"
    page.keyboard.press("ArrowRight")  # into the module: its first child's button
    settle(page)
    assert page.evaluate("document.activeElement.closest('li').dataset.path") == "embeddings.word_embeddings"
    norm = _toggle(page, "embeddings.layer_norm")
    norm.focus()
    page.keyboard.press("Enter")
    settle(page)
    rows = _module(page, "embeddings.layer_norm").locator(":scope > ul > li.tensor")
    rows.first.wait_for()
    names = [rows.nth(i).locator(".names .name").all_inner_texts() for i in range(rows.count())]
    pairs = [(n[0], n[-1]) for n in names]  # (source, target); one name when they are equal
    assert pairs == [(t["source"], t["target"]) for t in doc["tensors"]
                     if t["target"].startswith("embeddings.layer_norm.")]
    assert [s for s, _ in pairs] == [k for k in sources if k.startswith("embeddings.LayerNorm.")]  # torch's names
    page.keyboard.press("ArrowLeft")
    settle(page)
    assert norm.get_attribute("aria-expanded") == "false"
    assert not rows.first.is_visible()
    page.keyboard.press("ArrowRight")
    settle(page)
    assert norm.get_attribute("aria-expanded") == "true" and rows.first.is_visible()
    page.keyboard.press(" ")
    settle(page)
    assert norm.get_attribute("aria-expanded") == "false"
    page.keyboard.press("ArrowLeft")  # on a collapsed module: to its parent
    settle(page)
    assert page.evaluate("document.activeElement.closest('li').dataset.path") == "embeddings"
    page.keyboard.press("ArrowDown")
    settle(page)
    assert page.evaluate("document.activeElement.closest('li').dataset.path") == "embeddings.word_embeddings"
    page.screenshot(path=str(tmp_path / "expanded.png"))
    assert (tmp_path / "expanded.png").stat().st_size > 0


def test_search_box_filters_the_tree(reports: dict[str, tuple[Path, dict[str, Any]]], opener: Any) -> None:
    html, doc = reports["bert-to-burn"]
    opened = opener(html)
    pairs = [(t["source"], t["target"]) for t in doc["tensors"]]
    for text in ("query", "LayerNorm", "norm_1.gamma", "pooler"):  # LayerNorm: only source names have it
        opened.filter(text)
        want = [t for s, t in pairs if text.lower() in s.lower() or text.lower() in t.lower()]
        assert want and opened.rows() == want, text
        assert opened.page.inner_text("#match-count") == f"{len(want)} tensor{'s' if len(want) > 1 else ''} of 39 match"
    opened.filter("no-such-tensor")
    assert opened.rows() == []
    assert opened.page.inner_text("#match-count") == "0 tensors of 39 match"
    opened.filter("")
    assert opened.rows() == []  # back to the collapsed tree
    assert opened.page.locator("#tree > li.mod").count() == 3


def _hostile_recipe(tmp_path: Path) -> Path:
    """A template run where the template's tensor is missing from the source and the source's is
    unused: hostile names as tensor names, as the missing hint and as metadata."""
    from safetensors.numpy import save_file

    save_file({f"enc.{HOSTILE}.weight": np.ones((2, 2), np.float32), "enc.bias": np.zeros(2, np.float32)},
              str(tmp_path / "src.safetensors"), metadata={"note": "</script><script>window.__pwned=2</script>"})
    save_file({f"enc.{HOSTILE}.weigh": np.ones((2, 2), np.float32), "enc.bias": np.zeros(2, np.float32)},
              str(tmp_path / "tpl.safetensors"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: src.safetensors}\n"
                      "target: {path: out.safetensors, template: tpl.safetensors}\nallow_partial: true\n")
    return recipe


def test_hostile_names_render_as_text(tmp_path: Path, opener: Any) -> None:
    recipe = _hostile_recipe(tmp_path)
    migrate("plan", str(recipe), "--html", str(tmp_path / "plan.html"))
    migrate("inspect", str(tmp_path / "src.safetensors"), "--html", str(tmp_path / "inspect.html"))
    for page_file, leaf in (("plan.html", "weigh"), ("inspect.html", "weight")):  # the plan's tree: the target
        raw = (tmp_path / page_file).read_bytes()
        assert raw.count(b"</script") == 2  # the two elements' own end tags, nothing from a name
        opened = opener(tmp_path / page_file)
        page = opened.page
        page.click("#expand-all")
        settle(page)
        page.wait_for_selector("#tree li.tensor")
        assert page.evaluate("window.__pwned") is None and opened.dialogs == []
        assert page.locator("img").count() == 0 and page.locator("script").count() == 2
        rows = set(opened.rows())
        assert rows == {f"enc.{HOSTILE}.{leaf}", "enc.bias"}
        assert HOSTILE in page.locator("#tree .seg").all_inner_texts()  # shown literally
    page.click("details.kv summary")
    settle(page)
    assert page.locator("details.kv td", has_text="</script><script>window.__pwned=2</script>").count() == 1
    plan = opener(tmp_path / "plan.html").page
    missing = plan.locator("#list-missing li")
    assert missing.inner_text().startswith(f"enc.{HOSTILE}.weigh Did you mean 'enc.{HOSTILE}.weight'?")
    plan.click("#expand-all")
    settle(plan)
    assert shown_text(plan.locator("#tree .hint")) == f"Did you mean 'enc.{HOSTILE}.weight'?"
    assert plan.locator("#list-unused li").inner_text() == f"enc.{HOSTILE}.weight"


def test_unprintable_characters_are_shown_as_escapes(tmp_path: Path, opener: Any) -> None:
    """A bidi override or a control character in a name is shown as `\\u202e`, as in the terminal."""
    names = ["a.\u202egnp.exe", "b.\x1b[2J", "c.zero\u200bwidth"]
    doc = {"path": "f", "format": "safetensors", "file_size": 1, "metadata": {}, "scalars": {}, "details": {},
           "totals": {"tensors": 3, "nbytes": 12},
           "tensors": [{"name": n, "dtype": "F32", "shape": [1], "nbytes": 4, "offset": 0} for n in names]}
    (tmp_path / "i.html").write_bytes(inspect_page(doc))
    opened = opener(tmp_path / "i.html")
    opened.page.click("#expand-all")
    settle(opened.page)
    opened.page.wait_for_selector("#tree li.tensor")
    segs = opened.page.locator("#tree li.tensor .seg").all_inner_texts()
    assert segs == ["exe", "\\x1b[2J", "zero\\u200bwidth"]
    assert opened.page.locator("#tree li.mod > .line .seg").all_inner_texts() == ["a", "\\u202egnp", "b", "c"]
    assert opened.rows() == names  # the exact names stay in the data


def _diff_doc() -> dict[str, Any]:
    rows = [("emb.weight", "identical", 0.0), ("enc.0.w", "close", 1e-6), ("enc.0.b", "different", 1e-3),
            ("enc.1.w", "different", 1.0), ("enc.1.b", "different", float("nan")), ("head.w", "only_in_a", None),
            ("head.b", "shape_mismatch", None)]
    tensors = [{"name": n, "a_name": n, "b_name": n, "status": s, "dtype_a": "F32", "dtype_b": "F16",
                "shape_a": [4], "shape_b": [4] if s != "shape_mismatch" else [5], "max_abs_diff": d,
                "max_rel_diff": None if d is None else d / 2, "differing": 0 if not d else 3,
                "first_index": None if not d else [1]} for n, s, d in rows]
    summary = {k: sum(1 for _, s, _ in rows if s == k) for k in
               ("identical", "close", "different", "only_in_a", "only_in_b", "shape_mismatch", "dtype_mismatch")}
    return {"a": "a.pt", "b": "b.bpk", "mode": "tolerance", "atol": 1e-5, "rtol": 1e-3, "recipe": None,
            "summary": summary, "tensors": tensors}


def test_diff_page_bars_are_log_scaled(tmp_path: Path, opener: Any) -> None:
    doc = _diff_doc()
    (tmp_path / "d.html").write_bytes(diff_page(doc))
    opened = opener(tmp_path / "d.html")
    page = opened.page
    for key, n in doc["summary"].items():
        assert opened.count(key) == n, key
    page.click("#expand-all")
    settle(page)
    page.wait_for_selector("#tree li.tensor")

    def width(name: str) -> float:
        row = page.locator(f'#tree li.tensor[data-name="{name}"]')
        return float(row.locator(".bar .fill").evaluate("e => e.getBoundingClientRect().width"))

    full = float(page.locator('#tree li.tensor[data-name="enc.1.w"] .bar').evaluate("e => e.clientWidth"))
    assert width("emb.weight") == 0
    small, mid, big = width("enc.0.w"), width("enc.0.b"), width("enc.1.w")
    assert 0 < small < mid < big == pytest.approx(full, abs=1)
    assert mid - small == pytest.approx(big - mid, abs=2)  # 1e-6, 1e-3, 1: equal steps on a log scale
    assert "inf" in (page.locator('#tree li.tensor[data-name="enc.1.b"] .bar').get_attribute("class") or "")
    assert page.locator('#tree li.tensor[data-name="head.w"] .bar').count() == 0
    badges = {seg: _module(page, seg).locator(":scope > .line .badge").text_content()
              for seg in ("emb", "enc", "head")}
    assert badges == {"emb": "=all match", "enc": "≠differences", "head": "≠differences"}  # icon, then word
    assert page.locator("#list-largest li").first.inner_text().startswith("enc.1.b")  # NaN first


def test_inspect_stats_page_shows_ranges_and_flags(tmp_path: Path, opener: Any) -> None:
    arrays = {"w": np.linspace(-1.5, 2.0, 8), "zeros": np.zeros(4), "bad": np.array([1.0, np.inf, np.nan])}
    tensors = []
    for name, a in arrays.items():
        finite = a[np.isfinite(a)]
        stats = {"min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
                 "std": float(finite.std()), "mean_abs": float(np.abs(finite).mean()),
                 "zeros_fraction": float((a == 0).mean()), "nan": int(np.isnan(a).sum()), "inf": int(np.isinf(a).sum())}
        flags = (["all_zeros"] if not a.any() else []) + (["nan_or_inf"] if not np.isfinite(a).all() else [])
        tensors.append({"name": f"m.{name}", "dtype": "F64", "shape": list(a.shape), "nbytes": a.nbytes, "offset": 0,
                        "stats": stats, "flags": flags})
    doc = {"path": "f.safetensors", "format": "safetensors", "file_size": 200, "tensors": tensors, "metadata": {},
           "scalars": {}, "totals": {"tensors": 3, "nbytes": 120}, "details": {}}
    (tmp_path / "s.html").write_bytes(inspect_page(doc))
    opened = opener(tmp_path / "s.html")
    page = opened.page
    assert opened.count("tensors") == 3 and opened.count("flagged") == 2
    page.click("#expand-all")
    settle(page)
    page.wait_for_selector("#tree li.tensor")
    w = page.locator('#tree li.tensor[data-name="m.w"]')
    assert shown_text(w.locator(".nums")).startswith("min -1.5 · max 2 · mean 0.25")
    assert w.locator(".range .span").count() == 1 and w.locator(".badge:has-text('all_zeros')").count() == 0
    assert page.locator('#tree li.tensor[data-name="m.zeros"] .chips').text_content() == "⚠all_zeros"
    assert "NaN 1 · Inf 1" in shown_text(page.locator('#tree li.tensor[data-name="m.bad"] .nums'))
    assert page.locator("#tree > li.mod .line .badge").text_content() == "⚠some flagged"


def _plan_doc(n: int) -> dict[str, Any]:
    entries = [{"source": f"m.t{i}", "target": f"m.t{i}", "ops": [], "before": {"dtype": "F32", "shape": [1]},
                "after": {"dtype": "F32", "shape": [1]}, "nbytes": 4, "module": None, "kept_from_template": False}
               for i in range(n)]
    report = {"applied": [e["target"] for e in entries], "skipped": [], "missing": [], "unused": [], "errors": []}
    return {"source": "s", "source_format": "safetensors", "target": "t", "target_format": "burnpack",
            "template": None, "entries": entries, "metadata": {}, "scalars": {}, "report": report, "errors": [],
            "notes": []}


def test_a_large_module_renders_its_rows_in_pages(tmp_path: Path, opener: Any) -> None:
    (tmp_path / "p.html").write_bytes(plan_page(_plan_doc(1200)))
    opened = opener(tmp_path / "p.html")
    page = opened.page
    _toggle(page, "m").click()
    settle(_toggle(page, "m"))
    page.wait_for_selector("#tree li.tensor")
    assert len(opened.rows()) == 500
    for shown in (1000, 1200):
        page.click("#tree .more-btn")
        settle(page)
        page.wait_for_function(f"document.querySelectorAll('#tree li.tensor').length === {shown}")
    assert opened.rows() == [f"m.t{i}" for i in range(1200)]
    assert page.locator("#tree .more-btn").count() == 0


# ---- without a browser ----------------------------------------------------------------------------

def _payload(page: bytes) -> dict[str, Any]:
    text = page.decode()
    start = text.index('<script type="application/json" id="report-data">') + len(
        '<script type="application/json" id="report-data">')
    data: dict[str, Any] = json.loads(text[start:text.index("</script>", start)])
    return data


def _names(data: dict[str, Any]) -> list[str]:
    parent, seg = data["names"]["p"], data["names"]["s"]

    def full(i: int) -> str:
        parts = []
        while i >= 0:
            parts.append(seg[i])
            i = parent[i]
        return ".".join(reversed(parts))

    return [full(i) for i in data["rows"]["t"]]


def test_payload_keeps_exact_names_and_never_ends_its_element() -> None:
    deep = ".".join(f"s{i}" for i in range(1000))
    names = [HOSTILE, f"a.{HOSTILE}.b", "x..y", ".lead", "trail.", "", deep, deep + ".w", "<!--", "\udcff.lone"]
    doc = _plan_doc(0)
    doc["entries"] = [{"source": n, "target": n, "ops": [], "before": None, "after": {"dtype": "F32", "shape": []},
                       "nbytes": 4, "module": None, "kept_from_template": False} for n in names]
    page = plan_page(doc)
    assert page.count(b"</script") == 2 and b"<!--" not in page and b"<img" not in page
    data = _payload(page)
    assert _names(data) == names
    depth = [0] * len(data["names"]["p"])
    for i, p in enumerate(data["names"]["p"]):
        depth[i] = 1 if p < 0 else depth[p] + 1
    assert max(depth) == MAX_DEPTH


def test_plan_html_is_written_atomically_and_never_over_an_input(tmp_path: Path) -> None:
    recipe = _hostile_recipe(tmp_path)
    page = tmp_path / "plan.html"
    page.write_text("keep me")
    done = migrate("plan", str(recipe), "--html", str(page), check=False)
    assert done.returncode == 1 and "already exists" in done.stderr
    assert page.read_text() == "keep me"
    source = (tmp_path / "src.safetensors").read_bytes()
    done = migrate("plan", str(recipe), "--html", str(tmp_path / "src.safetensors"), "--overwrite", check=False)
    assert done.returncode == 1 and (tmp_path / "src.safetensors").read_bytes() == source
    migrate("plan", str(recipe), "--html", str(page), "--overwrite")
    assert page.read_bytes().startswith(b"<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir() if ".migrator-" in p.name] == []


def test_run_report_format_follows_the_extension(tmp_path: Path) -> None:
    recipe = _hostile_recipe(tmp_path)
    migrate("run", str(recipe), "--no-progress", "--report", str(tmp_path / "r.json"))
    doc = json.loads((tmp_path / "r.json").read_text())
    migrate("run", str(recipe), "--no-progress", "--overwrite", "--report", str(tmp_path / "r.HTML"))
    data = _payload((tmp_path / "r.HTML").read_bytes())
    assert data["kind"] == "run"
    counts = {c[0]: c[2] for c in data["summary"]}
    assert counts == {k: len(doc[k]) for k in ("applied", "skipped", "missing", "unused", "errors")}
    assert counts["applied"] == 1 and counts["missing"] == 1 and counts["unused"] == 1


def test_diff_and_stats_pages_of_real_commands(reports: dict[str, tuple[Path, dict[str, Any]]], opener: Any,
                                               tmp_path: Path) -> None:
    """`migrate diff --html` and `inspect --stats --html` on the demo data, one value changed with numpy."""
    from safetensors.numpy import load_file, save_file

    root = reports["bert-to-burn"][0].parent
    demo = root / "demo-out"
    done = migrate("diff", str(demo / "tiny-bert.pt"), str(demo / "tiny-bert.bpk"), "--recipe",
                   str(root / "recipes" / "bert-to-burn.yaml"), "--html", str(tmp_path / "same.html"), "--json")
    doc = json.loads(done.stdout)
    opened = opener(tmp_path / "same.html")
    assert opened.count("identical") == doc["summary"]["identical"] == 39
    assert {b.text_content() for b in opened.page.locator("#tree > li.mod > .line .badge").all()} == {"=all match"}
    tensors = load_file(str(demo / "tiny-bert.safetensors"))
    changed = tensors["encoder.layer.1.intermediate.dense.weight"].copy()
    changed[5, 7] += 0.25
    tensors["encoder.layer.1.intermediate.dense.weight"] = changed
    tensors["embeddings.word_embeddings.weight"] = np.zeros_like(tensors["embeddings.word_embeddings.weight"])
    save_file(tensors, str(tmp_path / "b.safetensors"))
    done = migrate("diff", str(demo / "tiny-bert.safetensors"), str(tmp_path / "b.safetensors"), "--html",
                   str(tmp_path / "diff.html"), check=False)
    assert done.returncode == 1
    page = opener(tmp_path / "diff.html").page
    assert _module(page, "encoder").locator(":scope > .line .badge").text_content() == "≠differences"
    page.fill("#filter", "intermediate.dense.weight")
    settle(page)
    page.wait_for_selector("#tree li.tensor")
    row = page.locator('#tree li.tensor[data-name="encoder.layer.1.intermediate.dense.weight"]')
    assert row.locator(".badge").text_content() == "≠different"
    assert "1 differing · first at [5, 7]" in shown_text(row.locator(".nums"))
    migrate("inspect", str(tmp_path / "b.safetensors"), "--stats", "--html", str(tmp_path / "stats.html"))
    stats = opener(tmp_path / "stats.html")
    assert stats.count("flagged") == 1
    stats.filter("word_embeddings")
    zeros = stats.page.locator('#tree li.tensor[data-name="embeddings.word_embeddings.weight"]')
    assert "all_zeros" in shown_text(zeros.locator(".chips"))
    assert shown_text(zeros.locator(".nums")).startswith("min 0 · max 0 · mean 0")
